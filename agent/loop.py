"""The Search-R1 multi-turn loop, written once, for the UI, the CLI and the evaluator.

`run_agent` streams one question as typed events; `run_agent_batch` advances many questions
together, one backend call per round for all of them and one retriever batch for all their
searches (as Search-R1's training rollouts do).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from agent import protocol, repetition
from agent.backends.base import Backend, Sampling, TurnOutput
from agent.events import (
    AnswerGiven,
    DocumentsReturned,
    Event,
    Finished,
    InvalidAction,
    SearchCalled,
    Segment,
    TextDelta,
    TurnStarted,
)
from retriever.doc import Doc

if TYPE_CHECKING:  # the client pulls in httpx; the loop only needs the interface
    from retriever.client import Retriever


CONTEXT_FULL_RULES = ("stop", "truncate")


@dataclass(frozen=True)
class AgentSettings:
    max_turns: int = 4  # rounds with retrieval; one closing round without follows
    topk: int = 3
    max_new_tokens: int = 500  # per turn
    max_obs_tokens: int = 500
    max_context_tokens: int = 4096
    max_prompt_tokens: int = 2048
    greedy: bool = True
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    # Search-R1's rollouts treat EOS without an action as an invalid action and go on (the
    # evaluation protocol); its interactive infer.py instead stops at EOS. Default: protocol.
    stop_on_eos: bool = False
    # When the context outgrows max_context_tokens: "truncate" feeds the model its last
    # max_context_tokens tokens and goes on, as Search-R1's rollouts do (a full turn budget
    # each time; Finished.context_cuts counts the cut turns); "stop" ends the run with
    # `context_full` (the turn budget then shrinks so the context never exceeds the cap).
    on_context_full: str = "truncate"
    # Not the protocol: end a streamed run whose turn has become one short unit written this
    # many times in a row (agent/repetition.py), with stop reason "repetition". 0: never
    # (the evaluator's and app.infer's setting); the studio's pages turn it on.
    stop_repeats: int = 0

    def __post_init__(self) -> None:
        if self.on_context_full not in CONTEXT_FULL_RULES:
            raise ValueError(f"on_context_full must be one of {', '.join(CONTEXT_FULL_RULES)}, "
                             f"not {self.on_context_full!r}")
        if self.stop_repeats == 1 or self.stop_repeats < 0:
            raise ValueError(f"stop_repeats is {self.stop_repeats}: 0 (off) or at least 2")

    @property
    def sampling(self) -> Sampling:
        return Sampling(self.greedy, self.temperature, self.top_p, self.seed)


class _QuestionState:
    """The state of one question: its segments, counters, and the protocol's decisions."""

    def __init__(self, question: str, backend: Backend, settings: AgentSettings):
        self.backend = backend
        self.settings = settings
        self.prompt = backend.build_prompt(question)
        self.segments = [self.prompt]
        self.generated = [False]  # per segment: written by the model?
        self.tokens = backend.count_tokens(self.prompt)
        self.round = 0
        self.searches = self.invalid = self.new_tokens = self.cuts = 0
        self.retrieved: list[str] = []
        self.answer: str | None = None
        self.started = time.perf_counter()

    @property
    def final(self) -> bool:
        return self.round == self.settings.max_turns

    def turn_started(self) -> TurnStarted:
        return TurnStarted(self.round + 1, self.settings.max_turns + 1, self.final)

    def budget(self) -> int:
        """New tokens allowed this turn; 0 or less means the context is full."""
        if self.round == 0 and self.tokens > self.settings.max_prompt_tokens:
            return 0  # a question too long for the prompt window: an input error, never cut
        if self.settings.on_context_full == "truncate":
            return self.settings.max_new_tokens
        return min(self.settings.max_new_tokens, self.settings.max_context_tokens - self.tokens)

    def window(self) -> int | None:
        """`keep_last` for the turn about to be generated (counted as a cut), or None."""
        if (self.settings.on_context_full != "truncate"
                or self.tokens <= self.settings.max_context_tokens):
            return None
        self.cuts += 1
        return self.settings.max_context_tokens

    def model_turns(self) -> list[str]:
        return [s for s, generated in zip(self.segments, self.generated, strict=True)
                if generated]

    def finish(self, reason: str, error: str | None = None,
               detail: str | None = None) -> Finished:
        return Finished(reason, self.round + (reason != "context_full"), self.searches,
                        self.new_tokens, time.perf_counter() - self.started,
                        "".join(self.segments), self.prompt, self.answer, self.invalid,
                        list(self.retrieved), error,
                        tuple(map(Segment, self.segments, self.generated)), self.cuts, detail)

    def _append(self, text: str, generated: bool = False) -> None:
        self.segments.append(text)
        self.generated.append(generated)
        self.tokens += self.backend.count_tokens(text)

    def take_turn(self, output: TurnOutput) -> tuple[list[Event], str | None, Finished | None]:
        """Apply a generated turn: (events, query to search or None, Finished or None)."""
        text = protocol.cut_turn(output.text)
        self._append(text, generated=True)
        self.new_tokens += output.new_tokens
        # The prediction: computed here, once, from the model's own turns only.
        self.answer = protocol.answer_of(self.model_turns())
        if output.finish == "cancelled":
            return [], None, self.finish("cancelled")
        action = protocol.parse_action(text)
        if action.kind == "answer":
            # The action is the turn's first block; the prediction its last `<answer>` (they
            # differ in `<answer> x </answer> <answer> y </answer> <search> q </search>`).
            # Never None here: the action's own block is an `<answer>` match.
            answer = self.answer if self.answer is not None else action.content
            return [AnswerGiven(answer)], None, self.finish("answer")
        if output.finish == "repetition" and action.kind != "search":
            # Stopped by the loop mid-turn (AgentSettings.stop_repeats), with no action.
            found = repetition.repeated_tail(output.text, self.settings.stop_repeats)
            detail = repetition.describe(*found) if found else "stopped: repetition"
            return [], None, self.finish("repetition", detail=detail)
        if self.final:  # the closing round: an action is parsed, but no search states
            return [], None, self.finish("max_turns")
        if action.kind == "search":
            self.searches += 1
            return [SearchCalled(action.content, self.round + 1)], action.content, None
        if output.finish == "eos" and self.settings.stop_on_eos:
            return [], None, self.finish("eos")
        self.invalid += 1
        self._append(protocol.INVALID_ACTION_MESSAGE)
        self.round += 1
        return [InvalidAction(text)], None, None

    def add_documents(self, query: str, docs: list[Doc], seconds: float) -> DocumentsReturned:
        contents = [doc.contents for doc in docs]
        self.retrieved.extend(contents)
        inserted = self.backend.truncate(
            protocol.observation(protocol.render_documents(contents)),
            self.settings.max_obs_tokens)
        self._append(inserted)
        self.round += 1
        return DocumentsReturned(query, list(docs), inserted, seconds)


class _TurnHalt(threading.Event):
    """The cancel a backend watches during one streamed turn: the visitor's Stop, or the
    loop's own repetition stop."""

    def __init__(self, cancel: threading.Event | None):
        super().__init__()
        self.cancel, self.repeating = cancel, False

    def is_set(self) -> bool:
        return self.repeating or (self.cancel is not None and self.cancel.is_set())


def _search(retriever: Retriever, queries: list[str],
            topk: int) -> tuple[list[list[Doc]], float]:
    start = time.perf_counter()
    results = retriever.search(queries, topk)
    return results, time.perf_counter() - start


def _streamed_turn(state: _QuestionState, budget: int, settings: AgentSettings,
                   cancel: threading.Event | None) -> Iterator[Event | TurnOutput]:
    """One turn of one question, token by token: the TextDeltas a reader sees, then the
    turn's TurnOutput (finish "repetition" when the loop's repetition stop ended it)."""
    window = state.window()
    output, shown, text = None, "", ""
    halt = _TurnHalt(cancel)
    for item in state.backend.stream(state.segments, budget, settings.sampling, halt,
                                     **({"keep_last": window} if window else {})):
        if isinstance(item, TurnOutput):
            output = item
            break
        text += item
        if (settings.stop_repeats and not halt.repeating
                and repetition.repeated_tail(text, settings.stop_repeats)):
            halt.repeating = True  # the backend stops at its next token
        # Shown: what the cut keeps so far. Past a `</answer>` the text is held
        # back; it joins the turn only if a `</search>` follows (then the cut moves).
        visible = protocol.cut_turn(text)
        if len(visible) > len(shown):
            yield TextDelta(visible[len(shown):])
            shown = visible
    if output is None:
        raise RuntimeError("the backend ended a turn without its TurnOutput")
    if halt.repeating and not (cancel is not None and cancel.is_set()):
        output = replace(output, finish="repetition")
    final = protocol.cut_turn(output.text)
    if len(final) > len(shown) and final.startswith(shown):  # e.g. a restored tag
        yield TextDelta(final[len(shown):])
    yield output


def run_agent(question: str, backend: Backend, retriever: Retriever,
              settings: AgentSettings | None = None,
              cancel: threading.Event | None = None) -> Iterator[Event]:
    """Answer one question, yielding events as they happen; the last one is `Finished`."""
    settings = settings or AgentSettings()
    state = _QuestionState(question, backend, settings)
    try:
        while True:
            if cancel is not None and cancel.is_set():
                yield state.finish("cancelled")
                return
            budget = state.budget()
            if budget <= 0:
                yield state.finish("context_full")
                return
            yield state.turn_started()
            output = None
            for item in _streamed_turn(state, budget, settings, cancel):
                if isinstance(item, TurnOutput):
                    output = item
                else:
                    yield item
            events, query, finished = state.take_turn(output)
            yield from events
            if finished is not None:
                yield finished
                return
            if query is not None:
                docs, seconds = _search(retriever, [query], settings.topk)
                yield state.add_documents(query, docs[0], seconds)
    except Exception as err:  # shown to the user; the run ends, the front end stays up
        yield state.finish("error", f"{type(err).__name__}: {err}")


class _Member:
    """A question in a LiveBatch: its state, where its events go, its Stop."""

    def __init__(self, state: _QuestionState, emit: Callable[[Event], None],
                 cancel: threading.Event | None):
        self.state, self.emit, self.cancel = state, emit, cancel

    @property
    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()


class LiveBatch:
    """Questions answered together a turn at a time, which others may join between turns
    (continuous batching at turn boundaries, as a server does for its visitors).

    A question alone in the batch streams its turn token by token, as `run_agent` does (its
    Stop and the repetition stop act mid-turn); two or more share one `backend.generate`
    call and their searches one retriever call, and each turn shows whole. Every question's
    events go to its own `emit`; the same settings for all (sampling that can't share a
    batch runs in a batch of its own).
    """

    def __init__(self, backend: Backend, retriever: Retriever, settings: AgentSettings):
        self.backend, self.retriever, self.settings = backend, retriever, settings
        self.members: list[_Member] = []

    def __len__(self) -> int:
        return len(self.members)

    def join(self, question: str, emit: Callable[[Event], None],
             cancel: threading.Event | None = None) -> None:
        """Add a question; it takes its first turn at the next `step`."""
        try:
            state = _QuestionState(question, self.backend, self.settings)
        except Exception as err:  # its tokenizer refused it: this question ends, not the batch
            emit(Finished("error", 0, 0, 0, 0.0, "", "", None, 0, [],
                          f"{type(err).__name__}: {err}"))
            return
        self.members.append(_Member(state, emit, cancel))

    def _end(self, member: _Member, finished: Finished) -> None:
        member.emit(finished)
        self.members.remove(member)

    def step(self) -> None:
        """One turn for every question in the batch, its search included."""
        for member in list(self.members):
            if member.cancelled:
                self._end(member, member.state.finish("cancelled"))
            elif member.state.budget() <= 0:
                self._end(member, member.state.finish("context_full"))
        if not self.members:
            return
        members = list(self.members)
        budgets = [m.state.budget() for m in members]
        for member in members:
            member.emit(member.state.turn_started())
        try:
            outputs = (self._stream_one(members[0], budgets[0]) if len(members) == 1
                       else self._generate(members, budgets))
        except Exception as err:
            for member in members:
                self._end(member, member.state.finish("error", f"{type(err).__name__}: {err}"))
            return
        searching: list[tuple[_Member, str]] = []
        for member, output in zip(members, outputs, strict=True):
            events, query, finished = member.state.take_turn(output)
            for event in events:
                member.emit(event)
            if finished is not None:
                self._end(member, finished)
            elif query is not None:
                searching.append((member, query))
        if not searching:
            return
        try:
            results, seconds = _search(self.retriever, [q for _, q in searching],
                                       self.settings.topk)
        except Exception as err:
            for member, _ in searching:
                self._end(member, member.state.finish("error", f"{type(err).__name__}: {err}"))
            return
        for (member, query), docs in zip(searching, results, strict=True):
            member.emit(member.state.add_documents(query, docs, seconds))

    def _stream_one(self, member: _Member, budget: int) -> list[TurnOutput]:
        for item in _streamed_turn(member.state, budget, self.settings, member.cancel):
            if isinstance(item, TurnOutput):
                return [item]
            member.emit(item)
        raise RuntimeError("the turn ended without its TurnOutput")

    def _generate(self, members: list[_Member], budgets: list[int]) -> list[TurnOutput]:
        windows = [m.state.window() for m in members]
        outputs = self.backend.generate([m.state.segments for m in members], budgets,
                                        self.settings.sampling,
                                        **({"keep_last": windows} if any(windows) else {}))
        shown = []
        for member, output in zip(members, outputs, strict=True):
            if (self.settings.stop_repeats and output.finish != "stop"
                    and repetition.repeated_tail(output.text, self.settings.stop_repeats)):
                output = replace(output, finish="repetition")  # as a streamed turn ends
            text = protocol.cut_turn(output.text)
            if text:
                member.emit(TextDelta(text))
            shown.append(output)
        return shown


def run_agent_batch(questions: Sequence[str], backend: Backend, retriever: Retriever,
                    settings: AgentSettings | None = None,
                    on_turn: Callable[[int, int], None] | None = None,
                    ) -> Iterator[tuple[int, Finished]]:
    """Answer many questions together; yields (index, Finished) as each one ends.

    `on_turn(turn, going)`, when given, hears after each turn's generation how many of the
    questions go on to another turn (a progress line between answers, which come in bursts).
    """
    settings = settings or AgentSettings()
    states = [_QuestionState(q, backend, settings) for q in questions]
    active = list(range(len(states)))
    turn = 0
    while active:
        budgets = {i: states[i].budget() for i in active}
        for i in [i for i in active if budgets[i] <= 0]:
            yield i, states[i].finish("context_full")
        active = [i for i in active if budgets[i] > 0]
        if not active:
            return
        windows = [states[i].window() for i in active]
        try:
            outputs = backend.generate([states[i].segments for i in active],
                                       [budgets[i] for i in active], settings.sampling,
                                       **({"keep_last": windows} if any(windows) else {}))
        except Exception as err:
            for i in active:
                yield i, states[i].finish("error", f"{type(err).__name__}: {err}")
            return
        searching: list[tuple[int, str]] = []
        still = []
        for i, output in zip(active, outputs, strict=True):
            _, query, finished = states[i].take_turn(output)
            if finished is not None:
                yield i, finished
            else:
                still.append(i)
                if query is not None:
                    searching.append((i, query))
        turn += 1
        if on_turn is not None:
            on_turn(turn, len(still))
        if searching:
            try:
                results, seconds = _search(retriever, [q for _, q in searching], settings.topk)
            except Exception as err:
                for i in still:
                    yield i, states[i].finish("error", f"{type(err).__name__}: {err}")
                return
            for (i, query), docs in zip(searching, results, strict=True):
                states[i].add_documents(query, docs, seconds)
        active = still
