"""The "Evaluate" tab: score a model on a sample of one benchmark, with a progress bar.

It calls the evaluator's own runner, so a sample scored here is scored exactly as
`python -m evaluator` scores it, and lands in `runs/` the same way (resumable).
"""

from __future__ import annotations

import re
from pathlib import Path

import gradio as gr
import pandas as pd

from agent.backends.base import ModelLoadError
from evaluator.benchmarks import BENCHMARK_NAMES, DataError, load_with_warnings
from evaluator.metrics import aggregate

MAX_SAMPLE = 500


def run_dir_for(model: str, dataset: str, sample: int, seed: int) -> Path:
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(model.rstrip("/")).name) or "model"
    return Path("runs") / f"ui-{name}-{dataset}-sample{sample}-seed{seed}"


def evaluate_sample(studio, model: str, dataset: str, sample: int, seed: int,
                    data_dir: str, max_turns: int, progress=None) -> tuple[str, pd.DataFrame]:
    """Run the evaluator on `sample` questions; (summary markdown, per-question table)."""
    from agent.loop import AgentSettings
    from evaluator.rundir import prepare_run_dir, run_settings
    from evaluator.runner import evaluate

    model = (model or "").strip()
    if not model:
        return "Pick a model first.", pd.DataFrame()
    sample = max(1, min(int(sample), MAX_SAMPLE))
    try:
        questions, notes = load_with_warnings(dataset, data_dir.strip() or None, None,
                                              sample=sample, seed=int(seed))
    except DataError as err:
        return f"**Could not load {dataset}.** {err}", pd.DataFrame()
    try:
        backend = studio.pool.get(model)
    except ModelLoadError as err:
        return f"**Could not load the model.** {err}", pd.DataFrame()
    settings = AgentSettings(max_turns=int(max_turns))
    run_dir = run_dir_for(model, dataset, sample, int(seed))
    prepare_run_dir(run_dir, run_settings(model, "ui", "app", settings, seed=int(seed),
                                          limit=None, sample=sample, datasets=[dataset]))
    path = run_dir / f"{dataset}.jsonl"
    if not studio.pool.hold(model):
        return "The model is busy.", pd.DataFrame()
    try:
        done = 0
        for _ in evaluate(questions, backend, studio.retriever, settings, path, batch_size=8):
            done += 1
            if progress is not None:
                progress((done, len(questions)), desc=f"{dataset}: {done}/{len(questions)}")
    finally:
        studio.pool.release(model)
    from evaluator.rundir import load_run

    wanted = {q.id for q in questions}
    records = [r for r in load_run(run_dir).records.get(dataset, []) if r.id in wanted]
    stats = aggregate(records)
    lines = [f"**{dataset}**, {len(records)} questions (random sample, seed {seed}; not the "
             "full split, so not comparable with published numbers).",
             f"EM {stats['em']:.3f} · sub-EM {stats['sub_em']:.3f} · F1 {stats['f1']:.3f} · "
             f"answered {stats['answered']:.0%} · searches/question {stats['searches']:.2f}",
             f"Results: `{path}`", *[f"_{n}_" for n in notes]]
    table = pd.DataFrame([{"question": r.question, "prediction": r.prediction,
                           "golden": "; ".join(r.golden_answers), "EM": r.metrics["em"],
                           "searches": r.searches, "stop": r.stop_reason} for r in records])
    return "\n\n".join(lines), table


class EvaluateTab:
    """The tab's widgets, and its handler: it returns {component: update}."""

    def __init__(self, studio):
        self.studio = studio
        gr.Markdown("Score a model on a random sample of one benchmark with the exact "
                    "Search-R1 protocol (greedy, top-3). For full runs use "
                    "`python -m evaluator --all`.")
        with gr.Row():
            self.model = gr.Dropdown(studio.model_choices(), value=studio.default_model,
                                     allow_custom_value=True, label="Model")
            self.dataset = gr.Dropdown(list(BENCHMARK_NAMES), value="nq", label="Benchmark")
        with gr.Row():
            self.sample = gr.Slider(1, MAX_SAMPLE, value=20, step=1,
                                    label="Questions (sample)", elem_id="eval-sample")
            self.seed = gr.Number(0, precision=0, label="Seed")
            self.max_turns = gr.Slider(1, 8, value=4, step=1, label="Max turns")
        self.data_dir = gr.Textbox(label="Local benchmark directory (DIR/nq/test.jsonl …); "
                                         "empty: the Hugging Face Hub",
                                   elem_id="eval-data-dir")
        self.start = gr.Button("Evaluate", variant="primary", elem_id="eval-button")
        self.summary = gr.Markdown(elem_id="eval-summary")
        self.table = gr.Dataframe(wrap=True, elem_id="eval-table")

    def run(self, model, dataset, sample, seed, data_dir, max_turns,
            progress=gr.Progress()) -> dict:  # noqa: B008 (gradio injects the tracker)
        summary, table = evaluate_sample(self.studio, model, dataset, sample, seed, data_dir,
                                         max_turns, progress)
        return {self.summary: summary, self.table: table}

    def wire(self) -> None:
        self.start.click(self.run, [self.model, self.dataset, self.sample, self.seed,
                                    self.data_dir, self.max_turns], [self.summary, self.table],
                         api_name="evaluate", concurrency_limit=1)


def evaluate_tab(studio) -> None:
    """Adds the tab; pass to `build_app(extra_tabs=[evaluate_tab])`."""
    with gr.Tab("Evaluate"):
        EvaluateTab(studio).wire()
