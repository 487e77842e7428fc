"""The typed events one agent run yields; each front end renders them its own way."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from retriever.doc import Doc


@dataclass(frozen=True)
class Segment:
    """One piece of a trajectory, in order: the prompt, a generated turn or inserted text."""

    text: str
    generated: bool  # written by the model (trained on, scored); False: prompt or inserted


@dataclass(frozen=True)
class TurnStarted:
    turn: int  # 1-based
    # All rounds this run may take: AgentSettings.max_turns rounds with retrieval, plus the
    # closing one without.
    rounds: int
    final: bool  # the closing round, in which no search runs


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class SearchCalled:
    query: str
    turn: int


@dataclass(frozen=True)
class DocumentsReturned:
    query: str
    docs: list[Doc]
    rendered: str  # the observation exactly as inserted (after truncation)
    seconds: float


@dataclass(frozen=True)
class InvalidAction:
    text: str  # the turn that held no valid action


@dataclass(frozen=True)
class AnswerGiven:
    # The run's prediction (`protocol.answer_of` over the model's turns), which
    # `Finished.answer` repeats: the last `<answer>` block the model wrote, which need not be
    # the one that made this turn an answer action.
    answer: str


@dataclass(frozen=True)
class Finished:
    stop_reason: str  # answer, eos, max_turns, context_full, cancelled, repetition, error
    turns: int
    searches: int
    new_tokens: int
    seconds: float
    trajectory: str  # prompt + everything generated and inserted: what the model saw
    prompt: str
    answer: str | None = None  # the prediction, computed once (protocol.answer_of)
    invalid_actions: int = 0
    retrieved: list[str] = field(default_factory=list)  # contents of every retrieved document
    error: str | None = None
    # The trajectory piece by piece (prompt first); "".join of the texts is `trajectory`.
    segments: tuple[Segment, ...] = ()
    # Turns generated from a left-cut context (the rolling window kept its last
    # AgentSettings.max_context_tokens tokens, as Search-R1 does); 0 when it always fit.
    context_cuts: int = 0
    # Why a run the studio stopped early ended, in words (stop reason "repetition").
    stop_detail: str | None = None

    @property
    def response(self) -> str:
        return self.trajectory[len(self.prompt):]


Event = (TurnStarted | TextDelta | SearchCalled | DocumentsReturned | InvalidAction | AnswerGiven
         | Finished)


def event_to_dict(event: Event) -> dict[str, Any]:
    """A JSON-ready dict with the event's type name under `event`."""
    data = asdict(event)
    if isinstance(event, DocumentsReturned):
        data["docs"] = [d.to_dict() for d in event.docs]
    if isinstance(event, Finished):
        data["response"] = event.response
    return {"event": type(event).__name__, **data}
