"""The Training-curves tab: upload training logs, see whether likelihood displacement set in
(the figures, the summary table and the messages of `curves.analyze_uploads`).
"""

from __future__ import annotations

import gradio as gr

from app.ui.transcript import escape

PLOT_SLOTS = 10


def label_rows(table) -> dict[str, str]:
    """The method-label table (a DataFrame or a list of rows) as run name -> method."""
    rows = table.values.tolist() if hasattr(table, "values") else (table or [])
    return {str(r[0]).strip(): str(r[1]).strip() for r in rows
            if len(r) >= 2 and r[0] and r[1] and str(r[0]).strip()}


class CurvesTab:
    """The tab's widgets, and its handlers: each returns {component: update}."""

    def __init__(self):
        gr.Markdown("Upload verl console logs, W&B CSV exports or TensorBoard event files "
                    "(several at once) to see whether likelihood displacement set in. "
                    "Edit the method column to relabel a run, then Analyze again.")
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

    def run(self, paths, table, weight: float, notes: bool, reset_labels: bool = False) -> dict:
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
            return {**update, self.messages: f"❌ Could not analyse the files: "
                                             f"{escape(str(err))}",
                    self.summary: None, self.labels: table}
        lines = [f"- **{m.level}**: {escape(str(m.source) + ': ' if m.source else '')}"
                 f"{escape(m.text)}" for m in result.messages]
        lines += [f"- _{escape(p.title)}_: {escape(p.note)}" for p in result.panels if p.note]
        for plot, panel in zip(self.plots, result.panels, strict=False):
            update[plot] = gr.update(visible=True, value=panel.figure, label=panel.title)
        return {**update, self.messages: "\n".join(lines) or "Done.",
                self.summary: result.summary,
                self.labels: [[r.name, r.method] for r in result.runs]}

    def uploaded(self, paths, table, weight: float, notes: bool) -> dict:
        """New files: analyse them with the methods guessed afresh (old labels dropped)."""
        return self.run(paths, table, weight, notes, reset_labels=True)

    def wire(self) -> None:
        inputs = [self.files, self.labels, self.smoothing, self.annotate]
        outputs = [self.messages, self.summary, self.labels, *self.plots]
        self.files.change(self.uploaded, inputs, outputs, api_visibility="private")
        self.analyze.click(self.run, inputs, outputs, api_name="curves")


def curves_tab() -> bool:
    """Mount the tab when the curves package (and its plotting libraries) can be imported."""
    try:
        import curves  # noqa: F401
    except ImportError:
        return False
    with gr.Tab("Training curves"):
        CurvesTab().wire()
    return True
