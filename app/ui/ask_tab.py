"""The Ask tab: one question, the reasoning streamed (thoughts, searches with their
documents, the answer), raw text, exports. It shows the studio's decoding controls, which
the Compare tab reads too.
"""

from __future__ import annotations

from collections.abc import Callable

import gradio as gr

from app.ui import inputs
from app.ui import transcript as fold
from app.ui.context import CORPUS_EXAMPLES, Studio, session_of
from app.ui.controls import (
    Reading,
    RunButton,
    reading_check,
    settings_from_controls,
    validate_question,
)
from app.ui.examples import examples_score
from app.ui.exports import remove_exports, write_exports
from app.ui.model_pool import run_model, status_markdown
from app.ui.run_registry import BUSY_SESSION, SessionBusy, pump

BENCHMARK_EXAMPLES = [  # NQ and HotpotQA style; the small embedded corpus may lack the facts
    "who got the first nobel prize in physics",
    "when was the last time anyone was on the moon",
    "Which magazine was started first, Arthur's Magazine or First for Women?",
    "Were Scott Derrickson and Ed Wood of the same nationality?",
]
ASK_SLOTS = ("ask",)
EMPTY_STATS = "No question asked yet."
ASK_LABEL = "Ask"
ASK_BUSY = "Running… (Stop to ask another)"


def token_counter(studio: Studio, model: str) -> Callable[[str], int] | None:
    """The loaded model's token counter for live stats; None before it is loaded."""
    if not studio.pool.is_loaded(model):
        return None
    return studio.pool.get(model).count_tokens


class AskTab:
    """The tab's widgets, and its handlers: each returns (or yields) {component: update}."""

    def __init__(self, studio: Studio):
        self.studio = studio
        self.examples: list[gr.Examples] = []
        with gr.Row():
            with gr.Column(scale=3):
                self.chatbot = gr.Chatbot(
                    label="Agent", height=580, allow_tags=False, sanitize_html=True,
                    group_consecutive_messages=False, feedback_options=None,
                    elem_id="ask-chat", placeholder="Ask a question: the agent thinks, "
                                                    "searches the corpus, and answers.")
                self.stats = gr.Markdown(EMPTY_STATS, elem_id="ask-stats")
                with gr.Row():
                    self.question = gr.Textbox(label="Question", placeholder="Who directed "
                                               "2001: A Space Odyssey?", scale=5, max_lines=4,
                                               elem_id="ask-question")
                    self.ask = gr.Button(ASK_LABEL, variant="primary", scale=1,
                                         elem_id="ask-button")
                    self.stop_button = gr.Button("Stop", variant="stop", scale=1,
                                                 elem_id="ask-stop")
                    self.clear_button = gr.Button("Clear", scale=1, elem_id="ask-clear")
                for questions, label, elem_id in example_groups(studio):
                    self.examples.append(gr.Examples(questions, inputs=[self.question],
                                                     label=label, elem_id=elem_id))
                self.show_raw = gr.Checkbox(False, label="Show raw text (what the model saw)",
                                            elem_id="ask-show-raw")
                self.raw = gr.Textbox(label="Raw text: prompt + everything generated and "
                                      "inserted", visible=False, lines=12, max_lines=30,
                                      interactive=False, buttons=["copy"], elem_id="ask-raw")
                gr.Markdown(fold.ATTRIBUTION, elem_id="attribution")
            with gr.Column(scale=1):
                self.model = studio.model_picker(studio.default_model, "Model", "ask-model")
                self.model_info = gr.Markdown(studio.model_info(studio.default_model),
                                              elem_id="ask-model-info")
                # A callable: read at each page load (the model may be loading or loaded
                # by then, e.g. by the start-up warm-up).
                # Read again every 2 s, for the picked model: a page opened while the
                # warm-up still loads it would otherwise say "loading…" until a reload.
                self.model_status = gr.Markdown(
                    lambda model: status_markdown(studio.pool, model
                                                  if isinstance(model, str) else ""),
                    inputs=[self.model], every=2.0, elem_id="ask-model-status")
                with gr.Accordion("Decoding and search", open=True):
                    studio.decoding.render()
                self.export = gr.File(label="Export the last trace (JSON lines, Markdown)",
                                      file_count="multiple", interactive=False,
                                      height=130, elem_id="ask-export")

    # Explicit parameters, not *values: Gradio injects gr.Request only into those.
    def run(self, question_text: str, model_id: str, greedy_on: bool, temp: float,
            nucleus: float, turns: int, k: int, tokens: int, repeats: bool,
            request: gr.Request):
        """Ask the question; stream its transcript (the chat shows this run alone), then
        the raw text and the exports."""
        studio = self.studio
        try:
            model_id = inputs.text("Model", model_id)
            settings = settings_from_controls(greedy_on, temp, nucleus, turns, k, tokens,
                                              repeats)
        except inputs.InputError as err:
            raise gr.Error(str(err)) from None
        problem = validate_question(question_text)
        if problem is None and not model_id:
            problem = "Please pick a model."
        reading = Reading()
        if problem is None:  # before any model loads or runs: its tokenizer alone decides
            reading = reading_check(question_text, model_id, studio.pool)
            problem = reading.refusal
        if problem:
            yield {self.chatbot: [fold.note(problem)]}
            return
        question_text = question_text.strip()
        session = session_of(request)
        try:
            handles = studio.runs.start(session, "ask")
        except SessionBusy:
            raise gr.Error(BUSY_SESSION.format(tab="Ask")) from None
        cancel = handles[0]
        transcript = fold.Transcript()
        asked = [fold.question_message(question_text)]
        if reading.warning:
            asked.append(fold.note(reading.warning))
        exported: list[str] = []
        try:
            yield {self.chatbot: asked, self.stats: "Starting…", self.raw: "",
                   self.export: None,
                   self.model_status: status_markdown(studio.pool, model_id)}
            stream = run_model(studio.pool, model_id, question_text, studio.retriever,
                               settings, cancel)
            count = None
            for batch in pump({"ask": stream}, cancel):
                for _, event in batch:
                    transcript.apply(event)
                if count is None:
                    count = token_counter(studio, model_id)
                yield {self.chatbot: asked + transcript.messages,
                       self.stats: transcript.stats(count).line()}
            final = asked + transcript.messages
            done = {self.chatbot: final,
                    self.stats: transcript.stats(count).line() if transcript.events
                    else "Not run.",
                    self.model_status: status_markdown(studio.pool, model_id)}
            if transcript.finished:
                done[self.raw] = transcript.finished.trajectory
                exported = write_exports(question_text, model_id, transcript.events, settings)
                done[self.export] = exported
            yield done
        finally:
            # Gradio has copied the files into its own cache (which it cleans) by the time
            # the generator resumes after its last yield: our temporary folder can go.
            remove_exports(exported)
            studio.runs.finish(session, "ask", handles)

    def stop(self, request: gr.Request) -> None:
        """Set the run's cancel event; the backend stops between tokens and the run ends
        with its own "Stopped" render. It waits for that, so the `cancels=` after it is a
        no-op unless the run is stuck where the event can't reach (e.g. in a search)."""
        self.studio.runs.stop(session_of(request), ASK_SLOTS, wait=3.0)

    def clear(self) -> dict:
        return {self.chatbot: [], self.stats: EMPTY_STATS, self.raw: "", self.export: None}

    def toggle_raw(self, on: bool) -> dict:
        return {self.raw: gr.update(visible=on)}

    def model_changed(self, model: str | None) -> dict:
        model = model if isinstance(model, str) else ""
        return {self.model_status: status_markdown(self.studio.pool, model),
                self.model_info: self.studio.model_info(model)}

    def wire(self) -> None:
        limits = {"concurrency_id": "agent", "concurrency_limit": self.studio.concurrency}
        fields = [self.question, self.model, *self.studio.decoding.components]
        outputs = [self.chatbot, self.stats, self.raw, self.export, self.model_status]
        button = RunButton(self.ask, ASK_LABEL, ASK_BUSY, "A question is running: press "
                           "Stop to ask another (or wait for its answer).")
        asked = button.guard(self.ask.click, self.run, fields, outputs, api_name="ask",
                             **limits)
        submitted = button.guard(self.question.submit, self.run, fields, outputs,
                                 api_visibility="private", **limits)
        runs = [asked, submitted]
        for examples in self.examples:  # a click on an example asks it
            runs.append(button.guard(examples.load_input_event.then, self.run, fields,
                                     outputs, api_visibility="private", **limits))
        # Stop brings the button back itself: a cancelled run may not reach its own `then`.
        self.stop_button.click(self.stop, None, None, queue=False, api_name="stop").then(
            None, None, None, cancels=runs).then(button.idle, None, self.ask, queue=False,
                                                 api_visibility="private")
        self.clear_button.click(self.clear, None, [self.chatbot, self.stats, self.raw,
                                                   self.export],
                                queue=False, api_visibility="private")
        self.show_raw.change(self.toggle_raw, self.show_raw, self.raw, queue=False,
                             api_visibility="private")
        self.model.change(self.model_changed, self.model, [self.model_status, self.model_info],
                          queue=False, api_visibility="private")
        self.studio.decoding.wire()


def example_groups(studio: Studio) -> list[tuple[list[str], str, str]]:
    """The Ask tab's example groups: (questions, label, elem_id). Beside a nano model, the
    held-out questions it was run on and answers right; else questions whose answers the
    embedded corpus holds and benchmark-style ones, labelled as such (not as answered)."""
    if studio.nano_examples():
        score = examples_score()
        rate = (f" On such questions it is right {score[0]} times in {score[1]}."
                if score else "")
        return [(studio.nano_examples(), "Questions the nano agent answers right (not in "
                 "its training data; checked by running it greedily). Click one to ask it."
                 + rate, "ask-nano-examples")]
    return [(CORPUS_EXAMPLES, "Questions whose answers are in the embedded corpus (the "
             "model may still miss them). Click one to ask it.", "ask-corpus-examples"),
            (BENCHMARK_EXAMPLES, "Benchmark style (NQ / HotpotQA); the embedded corpus may "
             "not hold the answer.", "ask-benchmark-examples")]


def mount(studio: Studio) -> None:
    with gr.Tab("Ask"):
        AskTab(studio).wire()
