"""The Compare tab: the same question to two models (say a GRPO baseline and an LLDS
checkpoint), side by side, with a table of answers and costs. It reads the studio's
decoding controls (shown in the Ask tab).
"""

from __future__ import annotations

from collections.abc import Sequence

import gradio as gr

from agent.models import label
from app.ui import inputs
from app.ui import transcript as fold
from app.ui.context import Studio, session_of
from app.ui.controls import RunButton, reading_check, settings_from_controls, validate_question
from app.ui.model_pool import run_model
from app.ui.run_registry import BUSY_SESSION, SessionBusy, pump

COMPARE_SLOTS = ("compare-a", "compare-b")
COMPARE_LABEL = "Compare"
COMPARE_BUSY = "Running… (Stop to compare again)"


def comparison_table(models: Sequence[str], transcripts: Sequence[fold.Transcript]) -> str:
    """Model, answer, searches, tokens, time and how each run ended, as a Markdown table."""
    rows = {"Model": [], "Answer": [], "Searches": [], "Tokens": [], "Time": [], "Ended": []}
    for model, transcript in zip(models, transcripts, strict=True):
        stats = transcript.stats()
        rows["Model"].append(fold.escape(label(model)))
        # Folded as in the chats: "2" and 485 zeros reads "2 [0 × 485]", not a page-wide row.
        rows["Answer"].append(fold.shown(stats.answer) if stats.answer is not None else "–")
        rows["Searches"].append(str(stats.searches))
        rows["Tokens"].append(str(stats.tokens))
        rows["Time"].append(f"{stats.seconds:.1f} s")
        rows["Ended"].append(fold.ended(stats.stop_reason))
    lines = ["| | A | B |", "|---|---|---|"]
    lines += [f"| {key} | {' | '.join(v.replace('|', '/') for v in values)} |"
              for key, values in rows.items()]
    return "\n".join(lines)


class CompareTab:
    """The tab's widgets, and its handlers: each returns (or yields) {component: update}."""

    def __init__(self, studio: Studio):
        self.studio = studio
        gr.Markdown("The same question to two models, side by side. Decoding and search "
                    "settings come from the Ask tab.")
        with gr.Row():
            self.question = gr.Textbox(label="Question", scale=5, elem_id="compare-question",
                                       value=studio.compare_example())
            self.go = gr.Button(COMPARE_LABEL, variant="primary", scale=1,
                                elem_id="compare-button")
            self.stop_button = gr.Button("Stop", variant="stop", scale=1,
                                         elem_id="compare-stop")
        self.models, self.infos, self.chats, self.stats = [], [], [], []
        with gr.Row():
            for side, default in zip(("a", "b"), studio.pair, strict=True):
                with gr.Column():
                    self.models.append(studio.model_picker(default, f"Model {side.upper()}",
                                                           f"compare-model-{side}"))
                    self.chats.append(gr.Chatbot(
                        label=f"Model {side.upper()}", height=480, allow_tags=False,
                        sanitize_html=True, group_consecutive_messages=False,
                        feedback_options=None, elem_id=f"compare-chat-{side}"))
                    self.stats.append(gr.Markdown("", elem_id=f"compare-stats-{side}"))
                    # Below the chat, so the two chats line up whatever the text's length.
                    self.infos.append(gr.Markdown(studio.model_info(default),
                                                  elem_id=f"compare-model-info-{side}"))
        self.table = gr.Markdown("", elem_id="compare-table")
        gr.Markdown(fold.ATTRIBUTION)

    def run(self, question_text: str, model_a: str, model_b: str, greedy_on: bool,
            temp: float, nucleus: float, turns: int, k: int, tokens: int, repeats: bool,
            request: gr.Request):
        """Run both models on the question at once; stream both transcripts and the table."""
        studio = self.studio
        try:
            models = [inputs.text("Model A", model_a), inputs.text("Model B", model_b)]
            settings = settings_from_controls(greedy_on, temp, nucleus, turns, k, tokens,
                                              repeats)
        except inputs.InputError as err:
            raise gr.Error(str(err)) from None
        problem = validate_question(question_text)
        messages = [[fold.note(problem)] if problem else [] for _ in models]
        if not problem:  # an empty name would load "." (the working directory) as a model
            messages = [[] if m else [fold.note(f"Please pick model {side}.")]
                        for m, side in zip(models, "AB", strict=True)]
        readings = [reading_check(question_text, m, studio.pool) if m and not problem
                    else None for m in models]
        if not any(messages) and any(r and r.refusal for r in readings):
            # Neither runs: a comparison with one side unable to read the question is none.
            messages = [[fold.note(r.refusal)] if r and r.refusal else
                        [fold.note(f"Not run: model {other} cannot read the question.")]
                        for r, other in zip(readings, "BA", strict=True)]
        if any(messages):
            yield {self.chats[0]: messages[0], self.chats[1]: messages[1],
                   self.stats[0]: "", self.stats[1]: "", self.table: ""}
            return
        question_text = question_text.strip()
        session = session_of(request)
        try:
            handles = [studio.runs.start(session, slot) for slot in COMPARE_SLOTS]
        except SessionBusy:
            raise gr.Error(BUSY_SESSION.format(tab="Compare")) from None
        cancel = handles[0][0]
        transcripts = [fold.Transcript(), fold.Transcript()]
        asked = [fold.question_message(question_text)]
        notes = [[fold.note(r.warning)] if r and r.warning else [] for r in readings]
        try:
            streams = {str(i): run_model(studio.pool, m, question_text, studio.retriever,
                                         settings, handles[i][0])
                       for i, m in enumerate(models)}
            for batch in pump(streams, cancel):
                for name, event in batch:
                    transcripts[int(name)].apply(event)
                update = {self.table: comparison_table(models, transcripts)}
                for chat, stats, transcript, note in zip(self.chats, self.stats, transcripts,
                                                         notes, strict=True):
                    update[chat] = asked + note + transcript.messages
                    update[stats] = transcript.stats().line()
                yield update
        finally:
            for slot, handle in zip(COMPARE_SLOTS, handles, strict=True):
                handle[0].set()  # a no-op after a normal end; stops B too if we were closed
                studio.runs.finish(session, slot, handle)

    def stop(self, request: gr.Request) -> None:
        self.studio.runs.stop(session_of(request), COMPARE_SLOTS, wait=3.0)

    def model_changed(self, info: gr.Markdown):
        """The handler for one side's picker: what the picked model is."""
        def changed(model) -> dict:
            return {info: self.studio.model_info(model if isinstance(model, str) else "")}

        return changed

    def wire(self) -> None:
        for picker, info in zip(self.models, self.infos, strict=True):
            picker.change(self.model_changed(info), picker, info, queue=False,
                          api_visibility="private")
        button = RunButton(self.go, COMPARE_LABEL, COMPARE_BUSY, "A comparison is running: "
                           "press Stop to compare again (or wait for both answers).")
        event = button.guard(self.go.click, self.run, [self.question, *self.models,
                                                       *self.studio.decoding.components],
                             [*self.chats, *self.stats, self.table], api_name="compare",
                             concurrency_id="agent", concurrency_limit=self.studio.concurrency,
                             # Gradio's loading dots would stay on a side that has finished
                             # while the other runs; each side's stats line says "running".
                             show_progress="hidden")
        # Stop brings the button back itself: a cancelled run may not reach its own `then`.
        self.stop_button.click(self.stop, None, None, queue=False,
                               api_name="compare_stop").then(
            None, None, None, cancels=[event]).then(button.idle, None, self.go, queue=False,
                                                    api_visibility="private")


def mount(studio: Studio) -> None:
    with gr.Tab("Compare"):
        CompareTab(studio).wire()
