"""The Training-curves tab: upload training logs, see whether likelihood displacement set in
(the figures, the summary table and the messages of `curves.analyze_uploads`). "Try the
bundled runs" plots the nano-scale GRPO and LLDS runs this repository ships
(`assets/nano-runs/`: the collapse experiment's runs first, then the lr sweep's 3e-4 run,
then the main runs), overlaid, each named by its folder there, and says in a few lines what
they are, what they show and what their likelihood did.
"""

from __future__ import annotations

import collections
import functools
import re
import threading
from collections.abc import Sequence
from pathlib import Path

import gradio as gr

from agent.models import ROOT
from app.ui.context import Studio
from app.ui.transcript import escape
from app.ui.uploads import UPLOADS

PLOT_SLOTS = 16  # more than the panels curves draws for a verl log, so none is cut
BUNDLED_RUNS = ROOT / "assets" / "nano-runs"
# Which run folders under BUNDLED_RUNS are plotted, in this order (globs; a folder with no
# log is skipped): the collapse experiment's runs, as many as have been copied in so far,
# then the lr sweep's 3e-4 run (the collapse that started it), then the main lr 3e-5 runs.
BUNDLED_ORDER = ("collapse/*", "sweep/grpo-lr3e-4-seed0", "*")
# The bundled runs by experiment, the picker's entries in its order (label, globs under
# BUNDLED_RUNS): the collapse regime first; an experiment with no log yet is left out.
BUNDLED_GROUPS = (
    ("Collapse regime: GRPO vs LLDS-A at lr 3e-4, seeds 0-4", ("collapse/*",)),
    ("Confirmation at lr 5e-4, seeds 101-110 (pre-registered; as runs finish)",
     ("confirm/runs/*",)),
    ("Confirmation's pilot pair at lr 5e-4, seed 100", ("confirm/pilot/*",)),
    ("Learning-rate sweep: GRPO at lr 3e-4, seed 0", ("sweep/grpo-lr3e-4-seed0",)),
    ("Main runs at lr 3e-5: GRPO, LLDS-A and a gate control, seeds 0-2", ("*",)),
)
EVERY_RUN = "every run"
BUNDLED_LABEL = "Bundled runs"  # the one group of a tab given its logs (tests)
MARK_ALL_UP_TO = 4  # runs: up to this many overlaid, each run's marks are drawn
BUNDLED_NOTE = (
    "These are short runs of the nano search agent (this studio's default model, 4M "
    "parameters) made by this project on a CPU, plain GRPO against GRPO with the LLDS term "
    "(LLDS-A): not the paper's 3B-7B runs, so not comparable with its numbers. Runs that "
    "differ only by seed are drawn as their mean with a band; each run is named by its "
    "folder in `assets/nano-runs/`, whose README has the pre-registrations and results.")
# What the bundled runs show, in two sentences. The collapse runs' sentence is computed from
# their shipped logs by the experiment's own rule (nano.experiments.collapse.findings), so it
# follows the runs as they come in; the lr 3e-5 runs are finished and read as below
# (assets/nano-runs/README.md, "The main experiment").
MAIN_RUNS_FINDINGS = (
    "At lr 3e-5 nothing collapsed: the likelihood fell late in two of three GRPO seeds and "
    "rose under LLDS-A, and neither method changed held-out accuracy.")


@functools.cache
def collapse_findings(collapse_dir: Path) -> str:
    """The collapse runs' sentence, read once a process: the shipped logs do not change
    while the studio runs, and reading them all takes seconds on a busy CPU."""
    from nano.experiments.collapse import findings, read_runs

    return findings(read_runs(collapse_dir))


def bundled_findings(root: Path | None = None) -> str:
    """The two sentences: the collapse experiment as its logs stand, then the lr 3e-5 runs."""
    collapse = collapse_findings((root or BUNDLED_RUNS) / "collapse")
    return " ".join(p for p in (collapse, MAIN_RUNS_FINDINGS) if p)


SWEEP_FINDINGS = (
    "One GRPO run at lr 3e-4 (seed 0, 50 steps): the likelihood of the starting model's "
    "right answers fell from step ~10 while the reward rose, then the run collapsed "
    "(validation 0 of 48 at step 50). It is what started the collapse experiment.")


CONFIRMATION_RUNS = 20  # registered: seeds 101-110, GRPO and LLDS-A


def confirmation_findings(runs_dir: Path) -> str:
    """Where the confirmation stands, from its shipped logs: once all its runs have ended,
    the verdict's two tests as `python -m nano.experiments.confirm` prints them."""
    from nano.experiments.confirm import read_runs, verdict

    every = read_runs(runs_dir)
    readings = [r for r in every if r.judged]
    if not readings:
        return ""
    if len(readings) >= CONFIRMATION_RUNS and len(readings) == len(every):
        tests = [line for line in verdict(readings) if line.startswith(("H1 (", "H2 ("))]
        return (f"All {len(readings)} runs have ended; the pre-registered verdict (Holm's "
                "correction over the two tests): " + " ".join(f"{t}." for t in tests))
    counts = {m: [r for r in readings if r.method == m] for m in ("GRPO", "LLDS-A")}
    said = ", ".join(f"{m} collapsed in {sum(r.collapsed for r in runs)} of {len(runs)}"
                     for m, runs in counts.items() if runs)
    return (f"{len(readings)} of its runs have ended so far: {said}. The pre-registered "
            "verdict waits for all of them. The two pictures below set them beside the "
            "exploratory runs (lr 3e-4, seeds 0-4): how many runs of each method stand at "
            "each step, and each run's anchor change.")


CONFIRMATION = BUNDLED_GROUPS[1][0]  # the experiment shown with its survival and anchor plots


@functools.cache
def experiment_outcomes(root: Path = BUNDLED_RUNS) -> tuple:
    """The collapse experiment's runs (the exploratory set) and the confirmation's ended
    runs, each read by the confirmation's pre-registered rules; read once a process."""
    from curves.experiment_plots import RunOutcome
    from nano.experiments.confirm import read_runs

    return tuple(RunOutcome(r.name, r.method, cohort, r.collapse_at, r.anchor_change)
                 for folder, cohort in (("collapse", "exploratory"),
                                        ("confirm/runs", "confirmatory"))
                 for r in read_runs(root / folder) if r.judged)


def experiment_figures(root: Path = BUNDLED_RUNS) -> tuple | None:
    """(survival figure, anchor figure) of the exploratory and confirmatory runs; None
    before any has ended."""
    from curves.experiment_plots import anchor_figure, survival_figure
    from nano.experiments.confirm import END, WINDOW

    outcomes = experiment_outcomes(root)
    if not outcomes:
        return None
    return survival_figure(outcomes, END), anchor_figure(outcomes, WINDOW)


def group_findings(label: str, root: Path | None = None) -> str:
    """What one bundled experiment shows, in a sentence or two, read from its logs where it
    is still running or has a verdict to compute."""
    root = root or BUNDLED_RUNS
    globs = dict(BUNDLED_GROUPS)[label]
    if globs == ("collapse/*",):
        return collapse_findings(root / "collapse")
    if globs[0].startswith("confirm/"):
        return confirmation_findings(root / globs[0].split("/*")[0])
    if globs[0].startswith("sweep/"):
        return SWEEP_FINDINGS
    return MAIN_RUNS_FINDINGS


def bundled_groups(root: Path | None = None) -> dict[str, list[Path]]:
    """Each experiment's logs (`bundled_logs` of its globs), those with any, in order."""
    groups = {label: bundled_logs(root, globs) for label, globs in BUNDLED_GROUPS}
    return {label: logs for label, logs in groups.items() if logs}


LIKELIHOOD_SOURCES = {
    "anchor/logp": "anchor set",
    "actor/pos_avg_old_log_prob": "own samples",
}
LIKELIHOOD_INTRO = (
    "What each run's likelihood did (how likely the model finds good answers, as a mean "
    "log-probability a token; *anchor set*: a fixed set of the starting model's right "
    "answers, re-scored every few steps; *own samples*, for a run with fewer than "
    "{min_steps} anchor-set points so far: its own responses that scored at least their "
    "group's average):")
PHASE_RULE_NOTE = (
    "On the plots, a label such as \"II @ 100\" marks where a run's steady likelihood "
    "decay (phase II) starts, \"III\" its accelerated decay, \"collapse\" the step the run "
    "collapsed (reward and validation both under half their start, held); hover a label "
    "for more. The "
    "rule is strict (a straight-line decline over at least {segment} logged points, far "
    "beyond the noise): a shorter or noisier fall reads \"no decline met the phase-II "
    "rule\" in the table.")
NAMES_READ = (
    "Each panel reads the first of these names a log has (also with the `train/` prefix "
    "that the Hugging Face Trainer and TRL write to W&B and TensorBoard), and validation "
    "scores as `val/test_score/<set>`: ")


# The summary columns shown, and their headings here (the rest are in curves' CSV export).
SUMMARY_VIEW = {"run": "run", "method": "method", "steps": "logged steps",
                "likelihood peak step": "likelihood peak step",
                "likelihood change peak→end": "likelihood change peak→end",
                "steady decay onset (II)": "decay onset (II)",
                "accelerated decay onset (III)": "fast decay (III)",
                "collapse step": "collapse step", "notes": "notes"}
# Each column at least as wide as its longest word (headers in 14 px Studio Sans bold:
# "likelihood" 62 px; cells in 14 px Studio Mono, 8.4 px a character: "-0.3672", the
# "tolerance-" of a run name) plus 16 px of padding, in pixels so a narrow window cannot
# squeeze a word apart ("likelihoo d" at 9 % of 1000 px); the notes take the rest of a
# 1400 px window. Under ~1200 px the table scrolls sideways instead of breaking words.
SUMMARY_WIDTHS = ["160px", "66px", "60px", "84px", "84px", "66px", "72px", "80px", "40%"]
_SETTINGS = {"--method": "{}", "--gate": "{} gate", "--lr": "lr {}", "--steps": "{} steps",
             "--seed": "seed {}"}
# How runs that differ only by seed are drawn (curves.seeds.BANDS; "none": each run alone).
SEED_CHOICES = [("mean, min-max band", "minmax"), ("mean ± 1 SE", "se"), ("each run", "none")]


def run_settings(log: Path) -> str:
    """A bundled run's method and main settings, read from its `command.txt` ("" if none)."""
    try:
        words = (log.parent / "command.txt").read_text(encoding="utf-8").split()
    except OSError:
        return ""
    found = [_SETTINGS[flag].format(words[i + 1]) for i, flag in enumerate(words[:-1])
             if flag in _SETTINGS]
    return ", ".join(found)


def bundled_logs(root: Path | None = None,
                 order: Sequence[str] = BUNDLED_ORDER) -> list[Path]:
    """One log per bundled run, in `order`: its JSON-lines metrics, else its console log."""
    root = BUNDLED_RUNS if root is None else root
    if not root.is_dir():
        return []
    logs: list[Path] = []
    for pattern in order:
        for run in sorted(p for p in root.glob(pattern) if p.is_dir()):
            found = next((run / name for name in ("metrics.jsonl", "train.log")
                          if (run / name).is_file()), None)
            if found is not None and found not in logs:
                logs.append(found)
    return logs


def bundled_name(log: Path, root: Path | None = None) -> str:
    """A bundled run's one name: its folder under the bundled root (`main-grpo-seed0`,
    `collapse/grpo-lr3e-4-seed0`), which a visitor can find in the repository; the name a
    log gives itself (`nano-grpo-lambda0-lr3e-05-seed0`) is found nowhere else."""
    root = BUNDLED_RUNS if root is None else root
    try:
        return log.parent.relative_to(root).as_posix()
    except ValueError:
        return log.parent.name


def rename_in(text: str, names: dict[str, str]) -> str:
    """`text` with every old name of `names` replaced by its new one (longest first, so a
    name that another begins with is not replaced inside it)."""
    if not names:
        return text
    pattern = "|".join(re.escape(old) for old in sorted(names, key=len, reverse=True))
    return re.sub(pattern, lambda match: names[match.group(0)], text)


def likelihood_line(analysis) -> str:
    """What happened to one run's likelihood, in the summary table's own figures."""
    source = LIKELIHOOD_SOURCES.get(analysis.likelihood_key or "", analysis.likelihood_key)
    name = (f"`{escape(analysis.run)}` ({escape(analysis.method)}"
            + (f", {escape(source)})" if source else ")"))
    change = analysis.likelihood_change
    if change is None or analysis.peak_step is None:
        return f"- {name}: no likelihood logged."
    if analysis.peak_step == analysis.last_step:
        return f"- {name}: likelihood highest at the last step ({analysis.last_step}): no fall."
    return (f"- {name}: likelihood highest at step {analysis.peak_step}, then "
            f"{abs(change):.3f} {'lower' if change < 0 else 'higher'} by step "
            f"{analysis.last_step}.")


def collapse_words(analysis) -> str:
    """The run's one collapse call, appended to its likelihood line."""
    if analysis.collapse_step is not None:
        return f" Collapsed at step {analysis.collapse_step} ({analysis.collapse_rule})."
    if analysis.collapse_rule is not None:
        return " Did not collapse."
    return ""


def label_rows(table) -> dict[str, str]:
    """The method-label table (a DataFrame or a list of rows) as run name -> method."""
    rows = table.values.tolist() if hasattr(table, "values") else (table or [])
    return {str(r[0]).strip(): str(r[1]).strip() for r in rows
            if len(r) >= 2 and r[0] and r[1] and str(r[0]).strip()}



KEPT_BYTES = 256 * 1024 * 1024  # uploads kept in memory once read (least recently used go)
_kept: collections.OrderedDict[str, bytes] = collections.OrderedDict()
_gone: set[str] = set()  # uploads read and later dropped from memory
_kept_lock = threading.Lock()


def read_once(path: str, aliases: dict[str, str] | None):
    """`curves.sources.read_source`, except that an upload is read from the server's disk
    once and removed from it (app/ui/uploads.py); its bytes stay in memory, so a changed
    setting or a column named afterwards reads it again from there (through a temporary
    copy, removed at once)."""
    import tempfile

    from curves.parse import LogFormatError
    from curves.sources import read_source

    path = str(path)
    if UPLOADS.is_upload(path):
        try:
            data = Path(path).read_bytes()
        finally:
            UPLOADS.release(path)  # read (or unreadable): the file goes now either way
        with _kept_lock:
            _kept[path] = data
            while sum(map(len, _kept.values())) > KEPT_BYTES and len(_kept) > 1:
                _gone.add(_kept.popitem(last=False)[0])
    with _kept_lock:
        data = _kept.get(path)
        if data is not None:
            _kept.move_to_end(path)
    if data is None:
        if path in _gone:
            raise LogFormatError("this upload was read and is no longer kept; upload it "
                                 "again")
        return read_source(path, aliases)  # the bundled logs, a path on the server's disk
    with tempfile.TemporaryDirectory(prefix="llds-upload-") as work:
        # Under its upload folder's name: a run named by its folder is named as before.
        copy = Path(work) / Path(path).parent.name / Path(path).name
        copy.parent.mkdir()
        copy.write_bytes(data)
        return read_source(str(copy), aliases)


class CurvesTab:
    """The tab's widgets, and its handlers: each returns {component: update}."""

    def __init__(self, bundled: list[Path] | None = None):
        from curves.runs import known_names

        self.groups = bundled_groups() if bundled is None else {BUNDLED_LABEL: bundled}
        self.bundled = [log for logs in self.groups.values() for log in logs]
        gr.Markdown("Upload training logs (verl console logs, TRL's trainer_state.json, "
                    "W&B CSV exports, JSON lines or a CSV with a step column, TensorBoard "
                    "event files; several at once) to see whether likelihood displacement "
                    "set in: the likelihood of the model's good responses falling while "
                    "training goes on. Each run's method (GRPO or LLDS) is guessed from its "
                    "name; correct it in the table and press Analyze."
                    + (" Or look at the small GRPO and LLDS runs this studio ships."
                       if self.bundled else ""))
        with gr.Accordion("Which column names are read", open=False):
            gr.Markdown(NAMES_READ + known_names() + ".")
        with gr.Row(visible=bool(self.bundled)):
            self.group = gr.Dropdown(list(self.groups), value=next(iter(self.groups), None),
                                     label="Bundled experiment", scale=3,
                                     elem_id="curves-group")
            self.try_bundled = gr.Button("Show the bundled runs", visible=bool(self.bundled),
                                         scale=1, elem_id="curves-bundled")
        self.showing_bundled = gr.State(False)  # Analyze re-plots them after a relabel
        self.guessed = gr.State({})  # run -> the method guessed from its name
        # Bundled run name -> the name its log gives it, the name `analyze_uploads` knows it
        # by (a relabel is passed on under it). The same for every visitor: the files are.
        self.logged_names: dict[str, str] = {}
        with gr.Row():
            self.files = gr.File(label="Training logs", file_count="multiple", scale=3,
                                 elem_id="curves-files")
            with gr.Column(scale=2):
                # Widths of the table's own: sized by the run names, the method column was
                # pushed out of view ("GR", "LL"); names wrap at their hyphens instead.
                self.labels = gr.Dataframe(headers=["run", "method"], datatype=["str", "str"],
                                           value=[], column_count=(2, "fixed"),
                                           interactive=True, wrap=True,
                                           column_widths=["72%", "28%"],
                                           label="Method labels (GRPO or LLDS)",
                                           elem_id="curves-labels")
                self.marked = gr.Dropdown([EVERY_RUN], value=EVERY_RUN,
                                          label="Mark phases and collapse of",
                                          info="one run's marks read well; hover the lines "
                                               "for the others", elem_id="curves-marked")
                self.smoothing = gr.Slider(0.0, 0.99, value=0.6, step=0.01,
                                           label="Smoothing (EMA)")
                self.annotate = gr.Checkbox(True, label="Annotate phases")
                self.seeds = gr.Radio(SEED_CHOICES, value="minmax", elem_id="curves-seeds",
                                      label="Runs that differ only by seed")
                self.aliases = gr.Textbox(label="Your own column names", max_lines=1,
                                          placeholder="reward=my_score, kl=kl_div",
                                          info="metric=column, for a log whose names are "
                                               "not read (see above)",
                                          elem_id="curves-aliases")
                self.analyze = gr.Button("Analyze", variant="primary",
                                         elem_id="curves-analyze")
        # Results first, in plain words; what each run did and how, folded below them.
        self.messages = gr.Markdown("", elem_id="curves-messages")
        with gr.Row():  # the confirmation's two pictures, shown with that experiment
            self.experiment = [gr.Plot(visible=False, show_label=False, elem_id=elem_id)
                               for elem_id in ("curves-survival", "curves-anchor")]
        # No block label: the figure has its title, which the label box sat on top of.
        self.plots = [gr.Plot(visible=False, show_label=False) for _ in range(PLOT_SLOTS)]
        # Hidden until there is a result (an empty table shows placeholder headers).
        self.summary = gr.Dataframe(label="Summary", interactive=False, wrap=True,
                                    visible=False, elem_id="curves-summary",
                                    column_widths=SUMMARY_WIDTHS)
        with gr.Accordion("Details: each run, the rules, what was read", open=False,
                          elem_id="curves-details-box"):
            self.details = gr.Markdown("", elem_id="curves-details")

    def run(self, paths, table, weight: float, notes: bool, band: str = "minmax",
            guessed: dict | None = None, bundled: bool = False, names: str = "",
            marked: str = EVERY_RUN, group: str | None = None) -> dict:
        """Analyse the files; `guessed` (run -> method guessed before) is None for new files,
        whose methods are guessed afresh: only a label the user changed is passed on.
        `names`: the visitor's own column names ("reward=my_score"); `marked`: the run whose
        phases and collapse are marked (EVERY_RUN, or a run's name); `group`: the bundled
        experiment shown."""
        from curves import analyze_uploads
        from curves.runs import column_aliases

        paths = [p if isinstance(p, str) else getattr(p, "name", str(p))
                 for p in (paths or [])]
        update = {plot: gr.update(visible=False, value=None)
                  for plot in [*self.plots, *self.experiment]}
        hidden = gr.update(visible=False, value=None)
        if not paths:
            return {**update, self.messages: "Upload one or more training logs.",
                    self.details: "", self.summary: hidden, self.labels: [],
                    self.guessed: {}}
        changed = None
        if guessed is not None:
            changed = {run: method for run, method in label_rows(table).items()
                       if guessed.get(run) != method} or None
        if bundled and changed:  # the table shows folder names; the logs know their own
            changed = {self.logged_names.get(run, run): method
                       for run, method in changed.items()}
        band = None if band in (None, "none") else band
        try:
            aliases = column_aliases(names or "")
        except ValueError as err:
            return {**update, self.messages: f"**Your own column names:** {escape(str(err))}",
                    self.details: "", self.summary: hidden, self.labels: table}
        chosen = None if marked in (None, "", EVERY_RUN) else [marked]
        try:
            result = analyze_uploads(paths, labels=changed, smoothing=float(weight),
                                     annotate=bool(notes), band=band, aliases=aliases,
                                     marked=chosen, read=read_once)
            if bundled:
                self.name_by_folder(result, float(weight), bool(notes), band, chosen)
        except Exception as err:  # analyze_uploads should not raise; stay up if it does
            return {**update, self.messages: f"**Could not analyse the files:** "
                                             f"{escape(str(err))}",
                    self.details: "", self.summary: hidden, self.labels: table}
        names_now = [r.name for r in result.runs]
        if marked not in names_now:  # new runs: many overlaid mark one, a few mark all
            marked = names_now[0] if len(names_now) > MARK_ALL_UP_TO else EVERY_RUN
            if marked != EVERY_RUN:
                from curves.plots import build_panels

                result.panels = build_panels(result.runs, result.analyses,
                                             smoothing=float(weight), annotate=bool(notes),
                                             band=band, marked=[marked])
        shown = result.panels[:PLOT_SLOTS]
        problems = [f"- **{m.level}**: {escape(str(m.source) + ': ' if m.source else '')}"
                    f"{escape(m.text)}" for m in result.messages if m.level != "info"]
        info = [f"- {escape(str(m.source) + ': ' if m.source else '')}{escape(m.text)}"
                for m in result.messages if m.level == "info"]
        info += [f"- _{escape(p.title)}_: {escape(p.note)}" for p in shown if p.note]
        if len(result.panels) > len(shown):
            problems.append(f"- {len(result.panels) - len(shown)} more panels are not shown.")
        for plot, panel in zip(self.plots, shown, strict=False):
            update[plot] = gr.update(visible=True, value=panel.figure, label=panel.title)
        if bundled and group == CONFIRMATION and (figures := experiment_figures()):
            for plot, figure in zip(self.experiment, figures, strict=True):
                update[plot] = gr.update(visible=True, value=figure)
        if bundled:
            text, details = self.bundled_text(result, group)
        else:
            text, details = self.uploads_text(result), ""
        text = "\n\n".join(p for p in (text, "\n".join(problems)) if p) or "Done."
        details = "\n\n".join(p for p in (details, "\n".join(info)) if p)
        summary = result.summary[[c for c in SUMMARY_VIEW if c in result.summary.columns]]
        # No run read (every file refused): no empty table left under the message.
        update.update({self.messages: text, self.details: details,
                       self.summary: gr.update(visible=True,
                                               value=summary.rename(columns=SUMMARY_VIEW))
                       if result.analyses else hidden,
                       self.labels: [[r.name, r.method] for r in result.runs],
                       self.marked: gr.update(choices=[EVERY_RUN, *names_now], value=marked)})
        if guessed is None:
            update[self.guessed] = {r.name: r.method for r in result.runs}
        return update

    def name_by_folder(self, result, weight: float, notes: bool, band: str | None,
                       marked: list[str] | None = None) -> None:
        """Name each bundled run by its folder (`bundled_name`) in the result's runs, table,
        messages and figures, which are drawn again under the new names."""
        from curves.analysis import summary_table
        from curves.plots import build_panels

        folders = {log.resolve(): bundled_name(log) for log in self.bundled}
        renamed: dict[str, str] = {}
        in_text: dict[str, str] = {}  # the names safe to replace inside a message's words
        for run in result.runs:
            source = Path(run.source)
            folder = folders.get(source.resolve())
            if folder is None:
                continue
            # A log holding several runs (its step count restarts): number them.
            new = folder if folder not in renamed.values() else f"{folder} ({run.name})"
            renamed[run.name] = new
            # A log that names no run is named by its file ("metrics"), a word that the
            # messages use otherwise ("41 metrics"): such a name is left as it is there.
            if not run.name.startswith(source.stem):
                in_text[run.name] = new
        if not renamed:
            return
        self.logged_names.update({new: old for old, new in renamed.items()})
        for run in result.runs:
            run.name = renamed.get(run.name, run.name)
        for analysis in result.analyses:
            analysis.run = renamed.get(analysis.run, analysis.run)
        for message in result.messages:
            message.text = rename_in(message.text, in_text)
        result.summary = summary_table(result.analyses)
        result.panels = build_panels(result.runs, result.analyses, smoothing=weight,
                                     annotate=notes, band=band, marked=marked)

    def uploaded(self, paths, table, weight: float, notes: bool, band: str,
                 names: str = "", marked: str = EVERY_RUN) -> dict:
        """New files: analyse them with the methods guessed afresh (old labels dropped)."""
        return {**self.run(paths, table, weight, notes, band, names=names, marked=marked),
                self.showing_bundled: False}

    @staticmethod
    def uploads_text(result) -> str:
        """Uploaded runs, results first: what each one's likelihood and reward did."""
        if not result.analyses:
            return ""
        return "**What the runs show.**\n\n" + "\n".join(
            likelihood_line(a) + collapse_words(a) for a in result.analyses)

    def bundled_text(self, result, group: str | None) -> tuple[str, str]:
        """What the shown experiment found (first), what the runs are; then, folded, what
        each run's likelihood did, the rules and the settings each run was made with."""
        logs = self.groups.get(group or "", self.bundled)
        settings = [f"- `{escape(bundled_name(log))}`: {escape(found)}"
                    for log in logs if (found := run_settings(log))]
        found = group_findings(group) if group in dict(BUNDLED_GROUPS) else bundled_findings()
        text = "\n\n".join(p for p in ("**What they show.** " + found, BUNDLED_NOTE) if p)
        details = [LIKELIHOOD_INTRO.format(min_steps=result.rule.min_steps) + "\n\n"
                   + "\n".join(likelihood_line(a) + collapse_words(a)
                               for a in result.analyses),
                   PHASE_RULE_NOTE.format(segment=result.rule.min_segment),
                   "Made with `python -m nano rl`:\n\n" + "\n".join(settings)
                   if settings else ""]
        return text, "\n\n".join(p for p in details if p)

    def load_bundled(self, group: str, weight: float, notes: bool, band: str,
                     marked: str = EVERY_RUN) -> dict:
        """Plot one bundled experiment (GRPO and LLDS overlaid), saying what it found."""
        logs = self.groups.get(group, self.bundled)
        update = self.run([str(p) for p in logs], [], weight, notes, band, bundled=True,
                          marked=marked, group=group)
        return {**update, self.files: None, self.showing_bundled: True}

    def analyze_clicked(self, paths, table, weight: float, notes: bool, band: str,
                        names: str, marked: str, bundled: bool, guessed: dict,
                        group: str | None = None) -> dict:
        """Analyze: the uploads, or the bundled runs when they are what is shown, with the
        labels the user changed, the visitor's own column names and the marked run."""
        if not paths and bundled:
            logs = self.groups.get(group or "", self.bundled)
            return self.run([str(p) for p in logs], table, weight, notes, band,
                            guessed or {}, bundled=True, names=names, marked=marked,
                            group=group)
        return self.run(paths, table, weight, notes, band, guessed or {}, names=names,
                        marked=marked)

    def wire(self) -> None:
        inputs = [self.files, self.labels, self.smoothing, self.annotate, self.seeds,
                  self.aliases, self.marked]
        outputs = [self.messages, self.details, self.summary, self.labels, self.guessed,
                   self.marked, *self.plots, *self.experiment]
        bundled_inputs = [self.group, self.smoothing, self.annotate, self.seeds]
        self.try_bundled.click(self.load_bundled, bundled_inputs,
                               [*outputs, self.files, self.showing_bundled],
                               api_name="curves_bundled")
        # A new experiment picked: shown at once, with its own default marks.
        self.group.input(self.load_bundled, bundled_inputs,
                         [*outputs, self.files, self.showing_bundled],
                         api_visibility="private")
        # upload, not change: "Show the bundled runs" empties the box, which is no upload.
        self.files.upload(self.uploaded, inputs, [*outputs, self.showing_bundled],
                          api_visibility="private")
        analyze_inputs = [*inputs, self.showing_bundled, self.guessed, self.group]
        self.analyze.click(self.analyze_clicked, analyze_inputs, outputs, api_name="curves")
        self.marked.input(self.analyze_clicked, analyze_inputs, outputs,
                          api_visibility="private")


def mount(studio: Studio) -> None:
    """The tab, when the curves package (and its plotting libraries) can be imported; the
    tab reads nothing from the studio."""
    try:
        import curves  # noqa: F401
    except ImportError:
        return
    with gr.Tab("Training curves"):
        CurvesTab().wire()
