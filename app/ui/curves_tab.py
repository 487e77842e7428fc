"""The Training-curves tab: upload training logs, see whether likelihood displacement set in
(the figures, the summary table and the messages of `curves.analyze_uploads`). "Try the
bundled runs" plots the nano-scale GRPO and LLDS runs this repository ships
(`assets/nano-runs/<run>/`), overlaid.
"""

from __future__ import annotations

from pathlib import Path

import gradio as gr

from agent.models import ROOT
from app.ui.context import Studio
from app.ui.transcript import escape

PLOT_SLOTS = 10
BUNDLED_RUNS = ROOT / "assets" / "nano-runs"
BUNDLED_NOTE = (
    "**The bundled runs** are nano-scale training runs made by this project with "
    "`python -m nano rl` on a CPU, starting from the nano agent: not the paper's runs (verl "
    "with the LLDS fork on 3B-7B models) and not comparable with its numbers.")


def bundled_readme(root: Path | None = None) -> str:
    """The title and first paragraph of the runs' own README (what they are, honestly)."""
    path = (BUNDLED_RUNS if root is None else root) / "README.md"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return ""
    blocks = [b.strip() for b in text.split("\n\n") if b.strip()]
    title = blocks[0].lstrip("# ").strip() if blocks and blocks[0].startswith("#") else ""
    first = next((b for b in blocks[1:] if not b.startswith(("#", "|"))), "")
    return "\n\n".join(p for p in (f"_{title}_" if title else "", first) if p)


def bundled_logs(root: Path | None = None) -> list[Path]:
    """One log per bundled run: its JSON-lines metrics, else its console log."""
    root = BUNDLED_RUNS if root is None else root
    if not root.is_dir():
        return []
    logs = []
    for run in sorted(p for p in root.iterdir() if p.is_dir()):
        found = next((run / name for name in ("metrics.jsonl", "train.log")
                      if (run / name).is_file()), None)
        if found is not None:
            logs.append(found)
    return logs


def bundled_commands(logs: list[Path]) -> list[str]:
    """The command that made each bundled run, from its `command.txt` when it has one."""
    lines = []
    for log in logs:
        command = log.parent / "command.txt"
        if command.is_file():
            text = command.read_text(encoding="utf-8", errors="replace").strip()
            lines.append(f"- `{escape(log.parent.name)}`: `{escape(text[:500])}`")
    return lines


def label_rows(table) -> dict[str, str]:
    """The method-label table (a DataFrame or a list of rows) as run name -> method."""
    rows = table.values.tolist() if hasattr(table, "values") else (table or [])
    return {str(r[0]).strip(): str(r[1]).strip() for r in rows
            if len(r) >= 2 and r[0] and r[1] and str(r[0]).strip()}


class CurvesTab:
    """The tab's widgets, and its handlers: each returns {component: update}."""

    def __init__(self, bundled: list[Path] | None = None):
        self.bundled = bundle = bundled_logs() if bundled is None else bundled
        gr.Markdown("Upload verl console logs, W&B CSV exports or TensorBoard event files "
                    "(several at once) to see whether likelihood displacement set in. "
                    "Edit the method column to relabel a run, then Analyze again."
                    + (" Or try the nano-scale GRPO and LLDS runs this studio ships."
                       if bundle else ""))
        self.try_bundled = gr.Button("Try the bundled runs", visible=bool(bundle),
                                     elem_id="curves-bundled")
        self.showing_bundled = gr.State(False)  # Analyze re-plots them after a relabel
        with gr.Row():
            self.files = gr.File(label="Training logs", file_count="multiple", scale=3,
                                 elem_id="curves-files")
            with gr.Column(scale=2):
                self.labels = gr.Dataframe(headers=["run", "method"], datatype=["str", "str"],
                                           value=[], column_count=(2, "fixed"),
                                           interactive=True,
                                           label="Method labels (GRPO or LLDS)",
                                           elem_id="curves-labels")
                self.smoothing = gr.Slider(0.0, 0.99, value=0.6, step=0.01,
                                           label="Smoothing (EMA)")
                self.annotate = gr.Checkbox(True, label="Annotate phases")
                self.analyze = gr.Button("Analyze", variant="primary",
                                         elem_id="curves-analyze")
        self.messages = gr.Markdown("", elem_id="curves-messages")
        self.summary = gr.Dataframe(label="Summary", interactive=False,
                                    elem_id="curves-summary")
        self.plots = [gr.Plot(visible=False) for _ in range(PLOT_SLOTS)]

    def run(self, paths, table, weight: float, notes: bool, reset_labels: bool = False,
            preface: str = "") -> dict:
        """Analyse the uploads with the labels in the table; show messages, table, plots."""
        from curves import analyze_uploads

        paths = [p if isinstance(p, str) else getattr(p, "name", str(p))
                 for p in (paths or [])]
        update = {plot: gr.update(visible=False, value=None) for plot in self.plots}
        if not paths:
            return {**update, self.messages: "Upload one or more training logs.",
                    self.summary: None, self.labels: []}
        try:
            result = analyze_uploads(paths, labels=None if reset_labels
                                     else label_rows(table) or None,
                                     smoothing=float(weight), annotate=bool(notes))
        except Exception as err:  # analyze_uploads should not raise; stay up if it does
            return {**update, self.messages: f"**Could not analyse the files:** "
                                             f"{escape(str(err))}",
                    self.summary: None, self.labels: table}
        lines = [f"- **{m.level}**: {escape(str(m.source) + ': ' if m.source else '')}"
                 f"{escape(m.text)}" for m in result.messages]
        lines += [f"- _{escape(p.title)}_: {escape(p.note)}" for p in result.panels if p.note]
        for plot, panel in zip(self.plots, result.panels, strict=False):
            update[plot] = gr.update(visible=True, value=panel.figure, label=panel.title)
        text = "\n".join(lines) or "Done."
        return {**update, self.messages: f"{preface}\n\n{text}" if preface else text,
                self.summary: result.summary,
                self.labels: [[r.name, r.method] for r in result.runs]}

    def uploaded(self, paths, table, weight: float, notes: bool, bundled: bool) -> dict:
        """New files: analyse them with the methods guessed afresh (old labels dropped)."""
        if not paths and bundled:  # "Try the bundled runs" emptied the box: keep its plots
            return {}
        return {**self.run(paths, table, weight, notes, reset_labels=True),
                self.showing_bundled: False}

    def bundled_preface(self) -> str:
        root = self.bundled[0].parent.parent if self.bundled else None
        commands = bundled_commands(self.bundled)
        parts = [BUNDLED_NOTE, bundled_readme(root),
                 "Commands:\n" + "\n".join(commands) if commands else ""]
        return "\n\n".join(p for p in parts if p)

    def load_bundled(self, weight: float, notes: bool) -> dict:
        """Plot the bundled runs (GRPO and LLDS overlaid), saying what they are."""
        paths = [str(p) for p in self.bundled]
        preface = self.bundled_preface()
        update = self.run(paths, [], weight, notes, reset_labels=True, preface=preface)
        return {**update, self.files: None, self.showing_bundled: True}

    def analyze_clicked(self, paths, table, weight: float, notes: bool,
                        bundled: bool) -> dict:
        """Analyze: the uploads, or the bundled runs when they are what is shown."""
        if not paths and bundled:
            preface = self.bundled_preface()
            return self.run([str(p) for p in self.bundled], table, weight, notes,
                            preface=preface)
        return self.run(paths, table, weight, notes)

    def wire(self) -> None:
        inputs = [self.files, self.labels, self.smoothing, self.annotate]
        outputs = [self.messages, self.summary, self.labels, *self.plots]
        self.try_bundled.click(self.load_bundled, [self.smoothing, self.annotate],
                               [*outputs, self.files, self.showing_bundled],
                               api_name="curves_bundled")
        self.files.change(self.uploaded, [*inputs, self.showing_bundled],
                          [*outputs, self.showing_bundled],
                          api_visibility="private")
        self.analyze.click(self.analyze_clicked, [*inputs, self.showing_bundled], outputs,
                           api_name="curves")


def mount(studio: Studio) -> None:
    """The tab, when the curves package (and its plotting libraries) can be imported; the
    tab reads nothing from the studio."""
    try:
        import curves  # noqa: F401
    except ImportError:
        return
    with gr.Tab("Training curves"):
        CurvesTab().wire()
