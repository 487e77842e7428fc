"""The "Evaluate" tab: score a model on a sample of one benchmark, with a progress bar.

It calls the evaluator's own runner, so a sample scored here is scored exactly as
`python -m evaluator` scores it, and is written the same way (resumable), under the user's
data directory (`results_root`: $LLDS_DATA_DIR/runs, else the platform's user data folder,
e.g. ~/.local/share/llds-studio/runs), never inside the checkout. One run directory per
model, benchmark and turn limit holds every question any sample drew: a new seed or sample
size reuses it (answered questions are not asked again), never adds one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import gradio as gr
import pandas as pd

from agent.backends.base import ModelLoadError
from agent.loop import AgentSettings
from agent.models import is_nano
from app.ui import inputs
from app.ui.context import Studio
from app.ui.exports import remove_exports, write_files
from app.ui.transcript import escape
from evaluator.benchmarks import BENCHMARK_NAMES, LOCAL_BENCHMARKS, DataError, load_with_warnings
from evaluator.provenance import session_entry
from evaluator.rundir import (
    RunMismatch,
    apply_run_dir,
    check_run_dir,
    load_run,
    run_settings,
    with_provenance,
)
from evaluator.runner import RunStopped, evaluate
from evaluator.summary import aggregate, errored

# The paper's seven, then the sets shipped in the repository (vitalqa: offline).
DATASET_CHOICES = (*BENCHMARK_NAMES, *LOCAL_BENCHMARKS)
MAX_SAMPLE = 500
MAX_SEED = 2**31 - 1
MAX_TURNS = 8
BATCH = 8  # questions asked at once (the evaluator's batched path)
log = logging.getLogger(__name__)


NO_RUN_YET = "_No run yet: pick a model and a benchmark, then press Evaluate._"
RUNNING = "_Running…_"
# The table's columns: the question wraps in its share, the short ones stay whole.
TABLE_WIDTHS = ["34%", "20%", "22%", "6%", "8%", "10%"]
UI_DATA_HELP = (
    "Put the file at DIR/{name}/test.jsonl (FlashRAG format: one JSON record a line with "
    "id, question, golden_answers) and type DIR into *Local benchmark directory* above; "
    "or pick {local}, which ship with the studio and need no download.")


def user_data_dir() -> Path:
    """$LLDS_DATA_DIR, else the platform's folder for user data (XDG_DATA_HOME or
    ~/.local/share on Linux, ~/Library/Application Support on macOS, %LOCALAPPDATA% on
    Windows) + llds-studio."""
    if os.environ.get("LLDS_DATA_DIR"):
        return Path(os.environ["LLDS_DATA_DIR"]).expanduser()
    home = Path.home()
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or home / "AppData" / "Local")
    elif sys.platform == "darwin":
        base = home / "Library" / "Application Support"
    else:
        base = Path(os.environ.get("XDG_DATA_HOME") or home / ".local" / "share")
    return base / "llds-studio"


def results_root() -> Path:
    """Where the tab writes its runs (read at each run, so the environment decides)."""
    return user_data_dir() / "runs"


def run_dir_for(model: str, dataset: str, max_turns: int) -> Path:
    """`<results_root>/ui-<model name>-<hash of the full id>-<dataset>-turns<n>`: the hash
    keeps two models with one base name (two `…/model` directories) apart."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(model.rstrip("/")).name) or "model"
    digest = hashlib.sha256(model.encode()).hexdigest()[:8]
    return results_root() / f"ui-{name}-{digest}-{dataset}-turns{max_turns}"


def _data_problem(studio: Studio, dataset: str, err: DataError) -> str:
    """What a visitor sees when the data won't load. An exposed studio says only that (the
    full message, which may quote a record, goes to the server's log)."""
    if studio.access.exposed:
        log.warning("Evaluate tab: could not load %s: %s", dataset, err)
        return (f"**Could not load {dataset}.** Its data on this server is not usable; "
                "the details are in the server's log.")
    text = str(err)
    if "Put the FlashRAG file" in text:  # the CLI's instructions, said for this tab
        text = text[:text.index("Put the FlashRAG file")] + UI_DATA_HELP.format(
            name=dataset, local=" or ".join(LOCAL_BENCHMARKS))
    return f"**Could not load {dataset}.** {escape(text)}"


def incomplete_note(records, stopped: str | None) -> str | None:
    """How an incomplete run reads: errored questions, why, and that re-running resumes."""
    failed = [r for r in records if errored(r)]
    if not failed and not stopped:
        return None
    why = escape(stopped or failed[-1].error or "error")  # an error may quote a question
    return (f"**Incomplete:** {len(failed)} of {len(records)} questions ended in an error "
            f"(last: {why}). They are not scored as answered; press Evaluate again to "
            "resume them (answered questions are kept).")


class SampleResult(NamedTuple):
    summary: str  # Markdown
    table: pd.DataFrame  # a row a question
    records: Sequence = ()  # the evaluator's records of the sample, for the download


def evaluate_sample(studio: Studio, model: str, dataset: str, sample: int, seed: int,
                    data_dir: str, max_turns: int, progress=None) -> SampleResult:
    """Run the evaluator on `sample` questions; the summary, a table and the records.

    Wrong-typed or out-of-range values raise `inputs.InputError` naming the field.
    """
    model = inputs.text("Model", model)
    data_dir = inputs.text("Local benchmark directory", data_dir)
    sample = inputs.number("Questions (sample)", sample, 1, MAX_SAMPLE, integer=True)
    seed = inputs.number("Seed", seed, 0, MAX_SEED, integer=True)
    max_turns = inputs.number("Max turns", max_turns, 1, MAX_TURNS, integer=True)
    dataset = inputs.text("Benchmark", dataset)
    if dataset not in DATASET_CHOICES:
        raise inputs.InputError(f"Benchmark: {dataset[:40]!r} is not one of "
                                f"{', '.join(DATASET_CHOICES)}.")
    if not model:
        return SampleResult("Pick a model first.", pd.DataFrame())
    problem = studio.access.data_dir_problem(data_dir)
    if problem:
        return SampleResult(f"**Not allowed.** {problem}", pd.DataFrame())
    try:
        questions, notes = load_with_warnings(dataset, data_dir or None, None,
                                              sample=sample, seed=seed)
    except DataError as err:
        return SampleResult(_data_problem(studio, dataset, err), pd.DataFrame())
    try:
        backend = studio.pool.get(model)
    except ModelLoadError as err:
        return SampleResult(f"**Could not load the model.** {err}", pd.DataFrame())
    settings = AgentSettings(max_turns=max_turns)
    run_dir = run_dir_for(model, dataset, max_turns)
    try:  # seed and sample pick questions; the answers don't depend on them
        plan = check_run_dir(run_dir, run_settings(model, "ui", "app", settings, seed=None,
                                                   limit=None, sample=None,
                                                   datasets=[dataset]))
    except RunMismatch as err:
        return SampleResult(f"**Could not use the run directory.** {err}", pd.DataFrame())
    try:  # what a report needs to say how these answers were made, as the CLI records it
        entry = session_entry(model, getattr(backend, "name", "transformers"), backend,
                              studio.retriever, [dataset], data_dir=data_dir or None)
    except (OSError, ValueError, RuntimeError, ImportError) as err:
        return SampleResult(f"**Could not open the retriever.** {err}", pd.DataFrame())
    apply_run_dir(with_provenance(plan, entry))
    path = run_dir / f"{dataset}.jsonl"
    if not studio.pool.hold(model):
        return SampleResult("The model is busy.", pd.DataFrame())
    stopped = None
    wanted = {q.id for q in questions}
    try:
        done = len(wanted & {r.id for r in _records(run_dir, dataset)
                             if not errored(r)})
        if progress is not None:  # at once: no "processing | 19.2/2.5s" before the first
            progress((done, len(questions)), desc=asked(done, len(questions)))

        def on_turn(turn: int, going: int) -> None:  # between answers, which come in bursts
            if progress is not None:
                progress((done, len(questions)), desc=asked(done, len(questions), turn, going))

        for _ in evaluate(questions, backend, studio.retriever, settings, path,
                          batch_size=BATCH, on_turn=on_turn):
            done += 1
            if progress is not None:
                progress((done, len(questions)), desc=asked(done, len(questions)))
    except RunStopped as err:  # too many errors in a row (the retriever is down, say)
        stopped = str(err)
    except Exception as err:  # the run stops; what finished is kept
        log.exception("Evaluate tab: the run stopped")
        stopped = f"the run stopped: {type(err).__name__}: {err}"
    finally:
        studio.pool.release(model)
    records = [r for r in _records(run_dir, dataset) if r.id in wanted]
    scored = [r for r in records if not errored(r)]
    lines = [f"**{dataset}**, {len(scored)} of {len(questions)} questions scored (random "
             f"sample, seed {seed}; not the full split, so not comparable with published "
             "numbers).", scores_line(scored),
             f"Results: `{escape(path.name if studio.access.exposed else str(path))}`",
             *[f"_{escape(n)}_" for n in notes]]
    note = incomplete_note(records, stopped)
    if note:
        lines.insert(0, note)
    table = pd.DataFrame([{"question": r.question, "prediction": r.prediction,
                           "golden": "; ".join(r.golden_answers), "EM": r.metrics["em"],
                           "searches": r.searches, "stop": r.stop_reason} for r in records])
    return SampleResult("\n\n".join(lines), table, records)


def asked(done: int, total: int, turn: int = 0, going: int = 0) -> str:
    """The progress line: answered so far, and why they come in bursts; after a turn of the
    questions asked together, which turn it was and how many search on."""
    line = (f"{done} of {total} questions answered ({min(BATCH, total)} asked at once, so "
            "several finish together)")
    if turn:
        line += f"; turn {turn} done, {going} still searching"
    return line


def download_texts(dataset: str, result: SampleResult) -> dict[str, str]:
    """The sample's results as files: every record (JSON lines, as the evaluator writes
    them: prediction, trajectory, documents), the table (CSV) and the summary (Markdown)."""
    stem = f"{dataset}-sample-{len(result.records)}"
    return {f"{stem}.jsonl": "".join(json.dumps(r.to_dict()) + "\n" for r in result.records),
            f"{stem}.csv": result.table.to_csv(index=False),
            f"{stem}-summary.md": result.summary + "\n"}


def scores_line(records) -> str:
    if not records:
        return "No scores: no question was answered without an error."
    stats = aggregate(records)
    return (f"EM {stats['em']:.3f} · sub-EM {stats['sub_em']:.3f} · F1 {stats['f1']:.3f} · "
            f"answered {stats['answered']:.0%} · searches/question {stats['searches']:.2f}")


def _records(run_dir: Path, dataset: str) -> list:
    return load_run(run_dir).records.get(dataset, []) if run_dir.is_dir() else []


class EvaluateTab:
    """The tab's widgets, and its handler: it returns {component: update}."""

    def __init__(self, studio: Studio):
        self.studio = studio
        gr.Markdown("Score a model on a random sample of one benchmark with the exact "
                    "Search-R1 protocol (greedy, top-3). For full runs use "
                    "`python -m evaluator --all`. "
                    + ("" if studio.access.exposed else
                       f"Results are saved under `{escape(str(results_root()))}` (set "
                       "LLDS_DATA_DIR to change it); a run stopped half-way resumes there."),
                    elem_id="eval-intro")
        with gr.Row():
            self.model = studio.model_picker(studio.default_model, "Model", "eval-model")
            self.dataset = gr.Dropdown(list(DATASET_CHOICES), value=default_dataset(studio),
                                       label="Benchmark", elem_id="eval-dataset")
        with gr.Row():
            self.sample = inputs.Slider(1, MAX_SAMPLE, value=20, step=1,
                                        label="Questions (sample)", elem_id="eval-sample")
            self.seed = inputs.Number(0, precision=0, minimum=0, maximum=MAX_SEED,
                                      label="Seed")
            self.max_turns = inputs.Slider(1, MAX_TURNS, value=4, step=1, label="Max turns")
        self.data_dir = gr.Textbox(label="Local benchmark directory (DIR/nq/test.jsonl …); "
                                         "empty: the benchmark's own copy",
                                   visible=not studio.access.restricted,
                                   elem_id="eval-data-dir")
        self.start = gr.Button("Evaluate", variant="primary", elem_id="eval-button")
        # Not empty: the progress bar shows over it while a run goes.
        self.summary = gr.Markdown(NO_RUN_YET, elem_id="eval-summary", min_height=60)
        # Hidden until there are results (an empty table shows placeholder headers).
        self.table = gr.Dataframe(wrap=True, visible=False, interactive=False,
                                  column_widths=TABLE_WIDTHS, elem_id="eval-table")
        self.download = gr.File(label="Download the results (JSON lines, summary)",
                                file_count="multiple", interactive=False, visible=False,
                                elem_id="eval-download")

    def run(self, model, dataset, sample, seed, data_dir, max_turns,
            progress=gr.Progress()):  # noqa: B008 (gradio injects the tracker)
        """Clear the last run's result, run the sample, then show its result and files."""
        hidden = gr.update(visible=False, value=None)
        yield {self.summary: RUNNING, self.table: hidden, self.download: hidden}
        try:
            result = evaluate_sample(self.studio, model, dataset, sample, seed, data_dir,
                                     max_turns, progress)
        except inputs.InputError as err:
            raise gr.Error(str(err)) from None
        files = write_files(download_texts(dataset, result)) if result.records else []
        try:
            yield {self.summary: result.summary,
                   self.table: gr.update(value=result.table, visible=not result.table.empty),
                   self.download: gr.update(value=files, visible=bool(files))}
        finally:  # Gradio has copied them into its cache by now
            remove_exports(files)

    def wire(self) -> None:
        self.start.click(self.run, [self.model, self.dataset, self.sample, self.seed,
                                    self.data_dir, self.max_turns],
                         [self.summary, self.table, self.download],
                         api_name="evaluate", concurrency_limit=1)


def default_dataset(studio: Studio) -> str:
    """vitalqa (the nano agent's held-out set, offline) beside a nano model, else nq."""
    if "vitalqa" in DATASET_CHOICES and is_nano(studio.default_model):
        return "vitalqa"
    return "nq"


def mount(studio: Studio) -> None:
    with gr.Tab("Evaluate"):
        EvaluateTab(studio).wire()
