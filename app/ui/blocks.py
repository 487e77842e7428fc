"""The Gradio app: Ask, Compare and Training-curves tabs (plus any tabs the caller adds).

Thin by design: the handlers here only move values between widgets and the pure parts
(`app.ui.render`, `app.ui.session`). `build_app` takes the backend factory and the
retriever, so tests inject a scripted backend and a real in-process retriever.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import gradio as gr

from agent.loop import AgentSettings
from agent.models import DEFAULT_BASELINE, DEFAULT_MODEL, label, registry
from app.ui import render
from app.ui.session import (
    BackendFactory,
    ModelPool,
    RunRegistry,
    pump,
    run_model,
    settings_from_controls,
    settings_summary,
    status_markdown,
    validate_question,
)

MAX_FILE_SIZE = "200mb"  # uploads (training logs); passed to launch()
CORPUS_EXAMPLES = [
    "Who directed 2001: A Space Odyssey?",
    "What is the speed of light?",
    "Who painted the Mona Lisa?",
    "When did the Berlin Wall fall?",
    "Who wrote Pride and Prejudice?",
]
BENCHMARK_EXAMPLES = [  # NQ and HotpotQA style; the small embedded corpus may lack the facts
    "who got the first nobel prize in physics",
    "when was the last time anyone was on the moon",
    "Which magazine was started first, Arthur's Magazine or First for Women?",
    "Were Scott Derrickson and Ed Wood of the same nationality?",
]
PLOT_SLOTS = 10
ASK_SLOTS = ("ask",)
COMPARE_SLOTS = ("compare-a", "compare-b")


@dataclass
class Studio:
    """What a tab needs from the app; extra tabs (`build_app(extra_tabs=...)`) get this."""

    pool: ModelPool
    retriever: object
    runs: RunRegistry = field(default_factory=RunRegistry)
    default_model: str = DEFAULT_MODEL
    baseline_model: str = DEFAULT_BASELINE
    concurrency: int = 4

    def model_choices(self) -> list[tuple[str, str]]:
        choices = [(m.label, m.id) for m in registry()]
        for extra in (self.default_model, self.baseline_model):
            if extra not in {c[1] for c in choices}:
                choices.insert(0, (label(extra), extra))
        return choices


def _session(request: gr.Request | None) -> str:
    return getattr(request, "session_hash", None) or "anonymous"


def _write_exports(question: str, model: str, transcript: render.Transcript,
                   settings: AgentSettings) -> list[str]:
    folder = Path(tempfile.mkdtemp(prefix="llds-trace-"))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    header = {"question": question, "model": model, "settings": settings_summary(settings)}
    jsonl = folder / f"trace-{stamp}.jsonl"
    jsonl.write_text(render.trace_jsonl(transcript.events, header), encoding="utf-8")
    markdown = folder / f"trace-{stamp}.md"
    markdown.write_text(render.trace_markdown(question, model, transcript.events,
                                              settings_summary(settings)), encoding="utf-8")
    return [str(jsonl), str(markdown)]


def _count_tokens(studio: Studio, model: str) -> Callable[[str], int] | None:
    if not studio.pool.is_loaded(model):
        return None
    backend = studio.pool.get(model)
    return backend.count_tokens


# Ask ------------------------------------------------------------------------------------
def _ask_tab(studio: Studio) -> None:
    history = gr.State([])
    with gr.Row():
        with gr.Column(scale=3):
            chatbot = gr.Chatbot(label="Agent", height=580, allow_tags=False,
                                 sanitize_html=True, group_consecutive_messages=False,
                                 feedback_options=None, elem_id="ask-chat",
                                 placeholder="Ask a question: the agent thinks, searches the "
                                             "corpus, and answers.")
            stats = gr.Markdown("Turn – · 0 searches · 0 tokens", elem_id="ask-stats")
            gr.Markdown(render.ATTRIBUTION, elem_id="attribution")
            with gr.Row():
                question = gr.Textbox(label="Question", placeholder="Who directed 2001: A "
                                      "Space Odyssey?", scale=5, max_lines=4,
                                      elem_id="ask-question")
                ask = gr.Button("Ask", variant="primary", scale=1, elem_id="ask-button")
                stop = gr.Button("Stop", variant="stop", scale=1, elem_id="ask-stop")
                clear = gr.Button("Clear", scale=1, elem_id="ask-clear")
            gr.Examples(CORPUS_EXAMPLES, inputs=[question], label="The embedded corpus knows")
            gr.Examples(BENCHMARK_EXAMPLES, inputs=[question],
                        label="Benchmark style (NQ / HotpotQA)")
        with gr.Column(scale=1):
            model = gr.Dropdown(studio.model_choices(), value=studio.default_model,
                                allow_custom_value=True, label="Model",
                                info="Pick one, or type any hub id or local path.",
                                elem_id="ask-model")
            model_status = gr.Markdown(status_markdown(studio.pool, studio.default_model),
                                       elem_id="ask-model-status")
            with gr.Accordion("Decoding and search", open=True):
                greedy = gr.Checkbox(True, label="Greedy (the paper's evaluation)")
                temperature = gr.Slider(0.05, 1.5, value=0.7, step=0.05, label="Temperature")
                top_p = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="Top-p")
                max_turns = gr.Slider(1, 8, value=4, step=1, label="Max turns (with search)")
                topk = gr.Slider(1, 10, value=3, step=1, label="Documents per search (top-k)")
                max_tokens = gr.Slider(32, 1024, value=500, step=1,
                                       label="Max new tokens per turn")
            show_raw = gr.Checkbox(False, label="Show raw text (what the model saw)")
            export = gr.File(label="Export the last trace (JSON lines, Markdown)",
                             file_count="multiple", interactive=False, elem_id="ask-export")
    raw = gr.Code(label="Raw text: prompt + everything generated and inserted", visible=False,
                  language=None, lines=16, interactive=False, elem_id="ask-raw")
    controls = [greedy, temperature, top_p, max_turns, topk, max_tokens]

    # Explicit parameters, not *values: Gradio injects gr.Request only into those.
    def run(question_text: str, past: list, model_id: str, greedy_on: bool, temp: float,
            nucleus: float, turns: int, k: int, tokens: int, request: gr.Request):
        values = (greedy_on, temp, nucleus, turns, k, tokens)
        past = list(past or [])
        skip = gr.skip()
        problem = validate_question(question_text)
        model_id = (model_id or "").strip()
        if problem is None and not model_id:
            problem = "Please pick a model."
        if problem:
            yield past + [render.note(f"⚠️ {problem}")], skip, skip, skip, skip, skip
            return
        settings = settings_from_controls(*values)
        session = _session(request)
        handles = studio.runs.start(session, "ask")
        cancel = handles[0]
        transcript = render.Transcript()
        asked = [*past, render.user_message(question_text.strip())]
        try:
            yield (asked, skip, "Starting…", skip, skip,
                   status_markdown(studio.pool, model_id))
            stream = run_model(studio.pool, model_id, question_text.strip(), studio.retriever,
                               settings, cancel)
            count = None
            for batch in pump({"ask": stream}, cancel):
                for _, event in batch:
                    transcript.apply(event)
                if count is None:
                    count = _count_tokens(studio, model_id)
                yield (asked + transcript.messages, skip,
                       transcript.stats(count).line(), skip, skip, skip)
            final = asked + transcript.messages
            files = (_write_exports(question_text, model_id, transcript, settings)
                     if transcript.finished else skip)
            trajectory = transcript.finished.trajectory if transcript.finished else skip
            line = transcript.stats(count).line() if transcript.events else "Not run."
            yield (final, final, line, trajectory, files,
                   status_markdown(studio.pool, model_id))
        finally:
            studio.runs.finish(session, "ask", handles)

    def request_stop(request: gr.Request) -> None:
        # Set the run's cancel event; the backend stops between tokens and the run ends
        # with its own "Stopped" render. Wait for that so the cancels= below is a no-op
        # unless the run is stuck somewhere the event can't reach (e.g. in a search).
        studio.runs.stop(_session(request), ASK_SLOTS, wait=3.0)

    limits = {"concurrency_id": "agent", "concurrency_limit": studio.concurrency}
    outputs = [chatbot, history, stats, raw, export, model_status]
    asked = ask.click(run, [question, history, model, *controls], outputs, api_name="ask",
                      **limits)
    submitted = question.submit(run, [question, history, model, *controls], outputs,
                                api_visibility="private", **limits)
    stop.click(request_stop, None, None, queue=False, api_name="stop").then(
        None, None, None, cancels=[asked, submitted])
    clear.click(lambda: ([], [], "Turn – · 0 searches · 0 tokens", "", None), None,
                [chatbot, history, stats, raw, export], queue=False,
                api_visibility="private")
    show_raw.change(lambda on: gr.update(visible=on), show_raw, raw, queue=False,
                    api_visibility="private")
    model.change(lambda m: status_markdown(studio.pool, m or ""), model, model_status,
                 queue=False, api_visibility="private")
    return controls


# Compare --------------------------------------------------------------------------------
def _comparison_table(models: Sequence[str], transcripts: Sequence[render.Transcript]) -> str:
    rows = {"Model": [], "Answer": [], "Searches": [], "Tokens": [], "Time": [], "Ended": []}
    for model, transcript in zip(models, transcripts, strict=True):
        stats = transcript.stats()
        rows["Model"].append(render.escape(label(model)))
        rows["Answer"].append(render.escape(stats.answer) if stats.answer is not None
                              else "–")
        rows["Searches"].append(str(stats.searches))
        rows["Tokens"].append(str(stats.tokens))
        rows["Time"].append(f"{stats.seconds:.1f} s")
        rows["Ended"].append(stats.stop_reason or "running")
    lines = ["| | A | B |", "|---|---|---|"]
    lines += [f"| {key} | {' | '.join(v.replace('|', '/') for v in values)} |"
              for key, values in rows.items()]
    return "\n".join(lines)


def _compare_tab(studio: Studio, controls: list) -> None:
    gr.Markdown("The same question to two models, side by side. Decoding and search settings "
                "come from the Ask tab.")
    with gr.Row():
        question = gr.Textbox(label="Question", scale=5, elem_id="compare-question",
                              value=CORPUS_EXAMPLES[0])
        go = gr.Button("Compare", variant="primary", scale=1, elem_id="compare-button")
        stop = gr.Button("Stop", variant="stop", scale=1, elem_id="compare-stop")
    columns = []
    with gr.Row():
        for side, default in (("a", studio.baseline_model), ("b", studio.default_model)):
            with gr.Column():
                model = gr.Dropdown(studio.model_choices(), value=default,
                                    allow_custom_value=True, label=f"Model {side.upper()}",
                                    elem_id=f"compare-model-{side}")
                chat = gr.Chatbot(label=f"Model {side.upper()}", height=480, allow_tags=False,
                                  sanitize_html=True, group_consecutive_messages=False,
                                  feedback_options=None, elem_id=f"compare-chat-{side}")
                stats = gr.Markdown("", elem_id=f"compare-stats-{side}")
                columns.append((model, chat, stats))
    table = gr.Markdown("", elem_id="compare-table")
    gr.Markdown(render.ATTRIBUTION)

    def run(question_text: str, model_a: str, model_b: str, greedy_on: bool, temp: float,
            nucleus: float, turns: int, k: int, tokens: int, request: gr.Request):
        values = (greedy_on, temp, nucleus, turns, k, tokens)
        problem = validate_question(question_text)
        if problem:
            message = [render.note(f"⚠️ {problem}")]
            yield message, message, "", "", ""
            return
        models = [(model_a or "").strip(), (model_b or "").strip()]
        settings = settings_from_controls(*values)
        session = _session(request)
        handles = [studio.runs.start(session, slot) for slot in COMPARE_SLOTS]
        cancel = handles[0][0]
        transcripts = [render.Transcript(), render.Transcript()]
        asked = [render.user_message(question_text.strip())]
        try:
            streams = {str(i): run_model(studio.pool, m, question_text.strip(),
                                         studio.retriever, settings, handles[i][0])
                       for i, m in enumerate(models)}
            for batch in pump(streams, cancel):
                for name, event in batch:
                    transcripts[int(name)].apply(event)
                yield (asked + transcripts[0].messages, asked + transcripts[1].messages,
                       transcripts[0].stats().line(), transcripts[1].stats().line(),
                       _comparison_table(models, transcripts))
        finally:
            for slot, handle in zip(COMPARE_SLOTS, handles, strict=True):
                handle[0].set()  # a no-op after a normal end; stops B too if we were closed
                studio.runs.finish(session, slot, handle)

    def request_stop(request: gr.Request) -> None:
        studio.runs.stop(_session(request), COMPARE_SLOTS, wait=3.0)

    (model_a, chat_a, stats_a), (model_b, chat_b, stats_b) = columns
    event = go.click(run, [question, model_a, model_b, *controls],
                     [chat_a, chat_b, stats_a, stats_b, table],
                     api_name="compare", concurrency_id="agent",
                     concurrency_limit=studio.concurrency)
    stop.click(request_stop, None, None, queue=False, api_name="compare_stop").then(
        None, None, None, cancels=[event])


# Training curves ------------------------------------------------------------------------
def _curves_tab() -> bool:
    """Mount the Training-curves tab when the curves package offers analyze_uploads."""
    try:
        from curves import analyze_uploads
    except ImportError:
        return False

    with gr.Tab("Training curves"):
        gr.Markdown("Upload verl console logs, W&B CSV exports or TensorBoard event files "
                    "(several at once) to see whether likelihood displacement set in. "
                    "Edit the method column to relabel a run, then Analyze again.")
        with gr.Row():
            files = gr.File(label="Training logs", file_count="multiple", scale=3,
                            elem_id="curves-files")
            with gr.Column(scale=2):
                labels = gr.Dataframe(headers=["run", "method"], datatype=["str", "str"],
                                      value=[], column_count=(2, "fixed"), interactive=True,
                                      label="Method labels (GRPO or LLDS)",
                                      elem_id="curves-labels")
                smoothing = gr.Slider(0.0, 0.99, value=0.6, step=0.01, label="Smoothing (EMA)")
                annotate = gr.Checkbox(True, label="Annotate phases")
                analyze = gr.Button("Analyze", variant="primary", elem_id="curves-analyze")
        messages = gr.Markdown("", elem_id="curves-messages")
        summary = gr.Dataframe(label="Summary", interactive=False, elem_id="curves-summary")
        plots = [gr.Plot(visible=False) for _ in range(PLOT_SLOTS)]

        def label_rows(table) -> dict[str, str]:
            rows = table.values.tolist() if hasattr(table, "values") else (table or [])
            return {str(r[0]).strip(): str(r[1]).strip() for r in rows
                    if len(r) >= 2 and r[0] and r[1] and str(r[0]).strip()}

        def run(paths, table, weight: float, notes: bool, reset_labels: bool = False):
            paths = [p if isinstance(p, str) else getattr(p, "name", str(p))
                     for p in (paths or [])]
            hidden = [gr.update(visible=False, value=None)] * PLOT_SLOTS
            if not paths:
                return ("Upload one or more training logs.", None, [], *hidden)
            try:
                result = analyze_uploads(paths, labels=None if reset_labels
                                         else label_rows(table) or None,
                                         smoothing=float(weight), annotate=bool(notes))
            except Exception as err:  # analyze_uploads should not raise; stay up if it does
                return (f"❌ Could not analyse the files: {render.escape(str(err))}", None,
                        table, *hidden)
            lines = [f"- **{m.level}**: {render.escape(str(m.source) + ': ' if m.source else '')}"
                     f"{render.escape(m.text)}" for m in result.messages]
            lines += [f"- _{render.escape(p.title)}_: {render.escape(p.note)}"
                      for p in result.panels if p.note]
            shown = [gr.update(visible=True, value=p.figure, label=p.title)
                     for p in result.panels[:PLOT_SLOTS]]
            rows = [[r.name, r.method] for r in result.runs]
            return ("\n".join(lines) or "Done.", result.summary, rows,
                    *shown, *hidden[len(shown):])

        outputs = [messages, summary, labels, *plots]
        files.change(lambda p, t, w, n: run(p, t, w, n, reset_labels=True),
                     [files, labels, smoothing, annotate], outputs, api_visibility="private")
        analyze.click(run, [files, labels, smoothing, annotate], outputs, api_name="curves")
    return True


# The app --------------------------------------------------------------------------------
def build_app(backend_factory: BackendFactory, retriever, *,
              default_model: str = DEFAULT_MODEL, baseline_model: str = DEFAULT_BASELINE,
              concurrency: int = 4, per_model: int = 1, max_loaded: int = 2,
              extra_tabs: Sequence[Callable[[Studio], None]] = (),
              pool: ModelPool | None = None) -> gr.Blocks:
    """The studio as a gr.Blocks, queue configured; call `.launch(**launch_options())`.

    extra_tabs: functions called inside the tab strip, after Compare, each given the
    `Studio` (model pool, retriever, defaults) so it can add its own `gr.Tab`.
    """
    studio = Studio(pool=pool or ModelPool(backend_factory, per_model, max_loaded),
                    retriever=retriever, default_model=default_model,
                    baseline_model=baseline_model, concurrency=concurrency)
    with gr.Blocks(title="LLDS Search-Agent Studio") as demo:
        gr.Markdown("# LLDS Search-Agent Studio\nSearch-R1 style agents: watch them think, "
                    "search and answer.")
        with gr.Tabs():
            with gr.Tab("Ask"):
                controls = _ask_tab(studio)
            with gr.Tab("Compare"):
                _compare_tab(studio, controls)
            for add_tab in extra_tabs:
                add_tab(studio)
            _curves_tab()
    demo.queue(default_concurrency_limit=concurrency)
    demo.studio = studio  # type: ignore[attr-defined]  # for tests and extra tooling
    return demo


def launch_options(host: str = "127.0.0.1", port: int | None = 7860, share: bool = False,
                   **extra) -> dict:
    """Keyword arguments for `demo.launch`: loopback by default, the upload size limit."""
    return {"server_name": host, "server_port": port, "share": share,
            "max_file_size": MAX_FILE_SIZE, **extra}
