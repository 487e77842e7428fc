"""The transcript fold: agent events -> chat messages, as plain dicts (what `gr.Chatbot`
accepts). Pure: no gradio.

A `Transcript` folds one run's events into messages: each `<think>` part a collapsible
thought, each search a panel titled with its query (pending while it runs, done with its
time) holding the documents, invalid actions marked, the answer a bubble of its own.
Everything the user, the model or the corpus wrote goes through `escape`: a `<search>` or
a document's `<script>` shows as text whatever the chatbot's `allow_tags` says, and a
Markdown image shows as written instead of being fetched by the visitor's browser.

Two things a newcomer could not read are made readable here, in the one renderer the Ask
and Compare tabs share: a degenerate run of one repeated character or token (a small model
can write "2" and then 485 zeros) is folded to "[0 × 485]" (`shown`; the raw text view keeps
every character), and a search panel says which documents the model really read, since the
observation is cut at `AgentSettings.max_obs_tokens` tokens as Search-R1 cuts it
(`observation_cut`).
"""

from __future__ import annotations

import html
import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from agent import protocol
from agent.events import (
    AnswerGiven,
    DocumentsReturned,
    Event,
    Finished,
    InvalidAction,
    SearchCalled,
    TextDelta,
    TurnStarted,
)
from agent.loop import AgentSettings
from agent.models import label
from app.ui.model_pool import ModelStatus

Message = dict[str, Any]

THOUGHT_TITLE = "Thought"
ANSWER_PREFIX = "**Answer:** "
DOC_PREVIEW_CHARS = 700  # the panel shows a preview; the raw view has every character
ATTRIBUTION = ("Documents: text from [Wikipedia](https://en.wikipedia.org/), licensed "
               "[CC BY-SA 4.0](https://creativecommons.org/licenses/by-sa/4.0/).")

# The observation cut the agent applies (the studio never changes it): named in the panel.
OBSERVATION_TOKENS = AgentSettings().max_obs_tokens
CUT_REASON = (f"the observation is cut at {OBSERVATION_TOKENS} tokens, as Search-R1 does")

# A run of one unit (a character or a short token, up to REPEAT_UNIT characters) repeated
# REPEAT_MIN times or more is folded. 20 is far above what prose repeats ("!!!", "...",
# a row of dashes is usually shorter) and far below the hundreds a degenerate turn writes.
REPEAT_MIN = 20
REPEAT_UNIT = 16
# Lazy unit: the shortest one that repeats ("0", not "00"); DOTALL: "\n" can be in a unit.
_REPEAT = re.compile(rf"(.{{1,{REPEAT_UNIT}}}?)\1{{{REPEAT_MIN - 1},}}", re.DOTALL)
_MARKDOWN_PUNCTUATION = set("\\`*_{}[]()#+-.!|~\"'$")

_TAG = re.compile(r"<(/?)(think|search|answer)>")
_TAG_NAMES = ("think", "search", "answer")


def escape(text: str) -> str:
    """User, model or corpus text as literal text in a Markdown message: no tags, no HTML,
    and no image. `![alt](url)` (or `![alt][ref]`) would make every visitor's browser fetch
    the url; with its bracket escaped it shows as written."""
    return html.escape(text, quote=False).replace("![", "!\\[")


def _literal(unit: str) -> str:
    """A repeated unit as literal Markdown inside the fold marker: HTML-escaped and every
    Markdown punctuation mark backslash-escaped, so `*`, `[` or `|` show as themselves."""
    return "".join(html.escape(c, quote=False) if c in "&<>"
                   else "\\" + c if c in _MARKDOWN_PUNCTUATION else c for c in unit)


def fold_repeats(text: str) -> list[str | tuple[str, int]]:
    """`text` as pieces: plain strings, and (unit, count) for each run of one unit repeated
    at least REPEAT_MIN times. A unit of whitespace alone is left as text: Markdown already
    shows a run of spaces or blank lines as one."""
    pieces: list[str | tuple[str, int]] = []
    pos = 0
    for match in _REPEAT.finditer(text):
        unit = match.group(1)
        if not unit.strip():
            continue
        if match.start() > pos:
            pieces.append(text[pos:match.start()])
        # The backreference repeats whole units: the match is an exact multiple of one.
        pieces.append((unit, len(match.group(0)) // len(unit)))
        pos = match.end()
    if pos < len(text):
        pieces.append(text[pos:])
    return pieces


def shown(text: str) -> str:
    """Model text as `escape` makes it, with each long run of a repeated unit folded to a
    bold "[0 × 485]" (the unit, stripped, and how many times it was written): the text
    stays readable and the count says what the model did."""
    out = []
    for piece in fold_repeats(text):
        if isinstance(piece, str):
            out.append(escape(piece))
            continue
        unit, count = piece
        before = " " if out and not out[-1][-1:].isspace() else ""
        # A space after, so the closing ** is read as closing whatever follows it.
        out.append(f"{before}**\\[{_literal(unit.strip())} × {count}\\]** ")
    return "".join(out)


def question_message(question: str) -> Message:
    """The user's question as the chat's user bubble."""
    return {"role": "user", "content": escape(question)}


def note(text: str, title: str | None = None) -> Message:
    """An assistant message written by the app (trusted Markdown, not model text)."""
    message: Message = {"role": "assistant", "content": text}
    if title:
        message["metadata"] = {"title": title, "status": "done"}
    return message


# Turn text -> parts ---------------------------------------------------------------------
@dataclass(frozen=True)
class TurnPart:
    """A piece of one turn's text by tag (not `agent.events.Segment`, a trajectory piece)."""

    kind: str  # text, think, search, answer
    text: str
    closed: bool = True


def _partial_tag_start(text: str) -> int:
    """Where a trailing, not yet complete tag (`<thi`, `</sear`) starts; -1 if none."""
    start = text.rfind("<")
    if start == -1 or ">" in text[start:]:
        return -1
    tail = text[start:]
    candidates = [f"<{n}>" for n in _TAG_NAMES] + [f"</{n}>" for n in _TAG_NAMES]
    return start if any(c.startswith(tail) for c in candidates) else -1


def split_turn(text: str, streaming: bool = False) -> list[TurnPart]:
    """A turn's text as text / think / search / answer parts, in order.

    While streaming, a half-written tag at the end is held back, and an open tag yields an
    open (unclosed) part. Stray closing tags are kept as text.
    """
    if streaming and (cut := _partial_tag_start(text)) >= 0:
        text = text[:cut]
    parts: list[TurnPart] = []
    pos, open_kind, open_at = 0, None, 0
    for match in _TAG.finditer(text):
        closing, name = match.group(1) == "/", match.group(2)
        if open_kind is None and not closing:
            if match.start() > pos:
                parts.append(TurnPart("text", text[pos:match.start()]))
            open_kind, open_at = name, match.end()
        elif open_kind == name and closing:
            parts.append(TurnPart(name, text[open_at:match.start()]))
            open_kind, pos = None, match.end()
    if open_kind is not None:
        parts.append(TurnPart(open_kind, text[open_at:], closed=False))
    elif pos < len(text):
        parts.append(TurnPart("text", text[pos:]))
    return [p for p in parts if p.kind != "text" or p.text.strip()]


# Pieces ---------------------------------------------------------------------------------
def observation_cut(docs: list, rendered: str) -> list[int] | None:
    """How much of each document's text the model read, in characters, when the observation
    it was shown (`rendered`, `DocumentsReturned.rendered`) is a cut of the full one; None
    when it read everything, or when `rendered` is not a cut of the protocol's observation
    of these documents (another format: then nothing is claimed).

    The loop cuts the observation at `max_obs_tokens` tokens and decodes what it keeps, so a
    cut observation is a prefix of the full one (ending, at most, in U+FFFD where the cut
    split a character's bytes). The full one is rebuilt with the protocol's own functions.
    """
    contents = [doc.contents for doc in docs]
    full = protocol.observation(protocol.render_documents(contents))
    if not docs or rendered == full or len(rendered) >= len(full):
        return None
    keep = len(os.path.commonprefix([full, rendered]))
    if rendered[keep:].strip("\ufffd"):
        return None
    head = protocol.observation("").index("</information>")  # "\n\n<information>"
    read = []
    for i, doc in enumerate(docs):
        # Doc i's text ends just before the "\n" that ends its rendered piece.
        end = head + len(protocol.render_documents(contents[:i + 1])) - 1
        start = end - len(doc.text)
        read.append(min(max(keep - start, 0), len(doc.text)))
    return read


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def read_summary(docs: list, read: list[int] | None) -> str:
    """The panel's one-line log: how many documents came back, and how many the model read
    when the observation was cut ("3 documents · the model read 2 and part of the 3rd")."""
    count = f"{len(docs)} document" + ("" if len(docs) == 1 else "s")
    if read is None:
        return count
    whole = sum(r == len(d.text) for d, r in zip(docs, read, strict=True))
    part = next((i for i, (d, r) in enumerate(zip(docs, read, strict=True))
                 if 0 < r < len(d.text)), None)
    if part is None:
        return f"{count} · the model read {whole}"
    if whole == 0:
        return f"{count} · the model read part of the {_ordinal(part + 1)}"
    return f"{count} · the model read {whole} and part of the {_ordinal(part + 1)}"


def _preview(text: str, preview: int) -> str:
    return text[:preview].rstrip() + " …" if len(text) > preview else text


def documents_markdown(docs: list, preview: int = DOC_PREVIEW_CHARS,
                       read: list[int] | None = None) -> str:
    """The documents as the search panel shows them: title, score, a preview of the text.
    With `read` (from `observation_cut`), what the model did not read is marked: where the
    cut fell in a document, and the documents after it as not seen."""
    if not docs:
        return "_No documents returned._"
    parts = []
    if read is not None:
        parts.append(f"_The model read only part of these documents: {CUT_REASON}. What it "
                     "did not read is marked below._")
    for i, (doc, seen) in enumerate(zip(docs, read or [None] * len(docs), strict=True), 1):
        header = f"**{i}. {escape(doc.title)}** · score {doc.score:.2f}"
        text = doc.text
        if seen is None or seen == len(text):
            parts.append(f"{header}\n\n{escape(_preview(text.strip(), preview))}")
        elif seen == 0:
            parts.append(f"{header} · **not seen by the model** ({CUT_REASON})\n\n"
                         f"{escape(_preview(text.strip(), preview))}")
        else:
            # All it read (the marker must show), then a preview of the rest.
            parts.append(f"{header} · **read in part** (cut where marked)\n\n"
                         f"{escape(text[:seen].lstrip())} **\\[cut here: the model read no "
                         f"further\\]** {escape(_preview(text[seen:].rstrip(), preview))}")
    return "\n\n".join(parts)


@dataclass
class _Search:
    query: str
    state: str = "written"  # written (tag closed), running, done, skipped
    docs: list = field(default_factory=list)
    seconds: float = 0.0
    read: list[int] | None = None  # characters of each document the model read, when cut


def _search_message(query: str, search: _Search | None, closed: bool) -> Message:
    title = f"Search: {shown(query.strip())}" if query.strip() else "Search"
    metadata: dict[str, Any] = {"title": title, "status": "pending"}
    if search is not None and search.state == "done":
        metadata.update(status="done", duration=round(search.seconds, 3),
                        log=read_summary(search.docs, search.read))
        content = documents_markdown(search.docs, read=search.read)
    elif search is not None and search.state == "skipped":
        metadata["status"] = "done"
        content = "_Not run: the closing round has no retrieval._"
    elif search is not None and search.state == "failed":
        metadata["status"] = "done"
        content = "_The search failed; see the message below._"
    elif search is not None and search.state == "cancelled":
        metadata["status"] = "done"
        content = "_Not run: stopped._"
    else:
        content = "Searching…" if closed else "Writing the query…"
    return {"role": "assistant", "content": content, "metadata": metadata}


def part_message(part: TurnPart, search: _Search | None = None) -> Message:
    if part.kind == "think":
        return {"role": "assistant", "content": shown(part.text.strip()) or "…",
                "metadata": {"title": THOUGHT_TITLE,
                             "status": "done" if part.closed else "pending"}}
    if part.kind == "search":
        return _search_message(part.text, search, part.closed)
    if part.kind == "answer":
        return {"role": "assistant", "content": ANSWER_PREFIX + shown(part.text.strip())}
    return {"role": "assistant", "content": shown(part.text.strip())}


_ENDINGS = {
    "cancelled": "Stopped.",
    "max_turns": "No answer within the turn limit.",
    "context_full": "Stopped: the context is full (4,096 tokens).",
    "eos": "The model ended without an answer.",
}
# How a run ended, in a few words: the stats line and the Compare table.
ENDED = {"answer": "answered", "max_turns": "no answer (turn limit)", "cancelled": "stopped",
         "context_full": "context full", "eos": "ended without an answer",
         "repetition": "stopped: repeating itself", "error": "failed"}


def ended(stop_reason: str | None) -> str:
    """A stop reason in words ("running" while there is none yet)."""
    if stop_reason is None:
        return "running"
    return ENDED.get(stop_reason, stop_reason)


def ending_message(finished: Finished) -> Message | None:
    """What to say when a run ends without an answer (None when it answered)."""
    if finished.stop_reason == "answer":
        return None
    if finished.stop_reason == "error":
        return note(f"**The run failed:** {escape(finished.error or 'unknown error')}")
    if finished.stop_reason == "repetition":
        detail = finished.stop_detail or "stopped: the model repeated itself"
        return note(f"**{escape(detail[0].upper() + detail[1:])}.** Untick *Stop a turn "
                    "that repeats one word* under Decoding to watch it run on.")
    return note(_ENDINGS.get(finished.stop_reason, f"Ended: {finished.stop_reason}."))


LOAD_FAILED = "model failed to load"  # how a run whose model never loaded ended


# The fold -------------------------------------------------------------------------------
class Transcript:
    """One run's messages, updated event by event (the last turn re-rendered on each delta).

    `now` is the clock for live token rates; tests pass their own.
    """

    def __init__(self, now: Callable[[], float] | None = None):
        self.now = now or time.perf_counter
        self.messages: list[Message] = []
        self.events: list[Event | ModelStatus] = []
        self.turn_text = ""
        self._turn_start = 0
        self._search: _Search | None = None
        self._status_at: int | None = None  # index of the model-status panel
        self.turn = 0
        self.rounds = 0
        self.final_round = False  # the closing round, without search
        self.searches = 0
        self.finished: Finished | None = None
        self.load_failed = False  # the model could not be loaded: the run never started
        self.answer: str | None = None
        self.generated = ""  # every generated character, for live token counts
        self._gen_seconds = 0.0
        self._turn_began: float | None = None
        self.started = self.now()
        self.first_text_at: float | None = None

    # Timing of generation (retrieval excluded) -------------------------------------------
    def _end_turn_clock(self) -> None:
        if self._turn_began is not None:
            self._gen_seconds += self.now() - self._turn_began
            self._turn_began = None

    @property
    def generation_seconds(self) -> float:
        running = self.now() - self._turn_began if self._turn_began is not None else 0.0
        return self._gen_seconds + running

    # Rendering ----------------------------------------------------------------------------
    def _render_turn(self, streaming: bool) -> None:
        self.messages[self._turn_start:] = [
            part_message(part, self._search if part.kind == "search" else None)
            for part in split_turn(self.turn_text, streaming=streaming)]

    def _close_turn(self) -> None:
        self._render_turn(streaming=False)
        self._turn_start = len(self.messages)
        self.turn_text = ""
        self._search = None

    def apply(self, event: Event | ModelStatus) -> None:
        self.events.append(event)
        if isinstance(event, ModelStatus):
            self._apply_status(event)
        elif isinstance(event, TurnStarted):
            self._close_turn()
            self.turn, self.rounds, self.final_round = event.turn, event.rounds, event.final
            self._turn_began = self.now()
        elif isinstance(event, TextDelta):
            if self.first_text_at is None:
                self.first_text_at = self.now()
            self.turn_text += event.text
            self.generated += event.text
            self._render_turn(streaming=True)
        elif isinstance(event, SearchCalled):
            self._end_turn_clock()
            self.searches += 1
            self._search = _Search(event.query, state="running")
            self._render_turn(streaming=False)
        elif isinstance(event, DocumentsReturned):
            if self._search is None:
                self._search = _Search(event.query)
            self._search.state, self._search.docs = "done", list(event.docs)
            self._search.seconds = event.seconds
            self._search.read = observation_cut(self._search.docs, event.rendered)
            self._close_turn()
        elif isinstance(event, InvalidAction):
            self._end_turn_clock()
            self._close_turn()
            self.messages.append(note(
                "No `<search>` or `<answer>` in this turn, so the model was told: "
                "_My previous action is invalid…_ and tried again.", title="Invalid action"))
            self._turn_start = len(self.messages)
        elif isinstance(event, AnswerGiven):
            self._end_turn_clock()
            self.answer = event.answer
            self._render_turn(streaming=False)
        elif isinstance(event, Finished):
            self._apply_finished(event)

    def _apply_status(self, status: ModelStatus) -> None:
        name = escape(label(status.model))  # "nano" reads as what it is
        titles = {"loading": f"Loading model {name}", "waiting": f"Waiting for {name}",
                  "ready": f"Model {name} ready", "failed": f"Model {name} could not be loaded"}
        message: Message = {"role": "assistant", "content": escape(status.detail) or "…",
                            "metadata": {"title": titles.get(status.state, name),
                                         "status": "pending"}}
        if status.state in ("ready", "failed"):
            message["metadata"].update(status="done", duration=round(status.seconds, 3))
        if status.state == "failed":
            self.load_failed = True
            message = note(f"**{titles['failed']}.** {escape(status.detail)}")
        if self._status_at is None:
            self._status_at = len(self.messages)
            self.messages.append(message)
        else:
            self.messages[self._status_at] = message
        self._turn_start = len(self.messages)

    def _apply_finished(self, finished: Finished) -> None:
        self._end_turn_clock()
        self.finished = finished
        state = {"max_turns": "skipped", "error": "failed"}.get(finished.stop_reason,
                                                                "cancelled")
        if self._search is not None and self._search.state in ("written", "running"):
            self._search.state = state
        elif self._search is None and any(s.kind == "search" for s in split_turn(self.turn_text)):
            self._search = _Search("", state=state)
        self._close_turn()
        # Any thought left open (a stopped run) is no longer in progress.
        for message in self.messages:
            metadata = message.get("metadata") or {}
            if metadata.get("status") == "pending":
                metadata["status"] = "done"
        ending = ending_message(finished)
        if ending is not None:
            self.messages.append(ending)

    # Live stats ---------------------------------------------------------------------------
    def tokens(self, count_tokens: Callable[[str], int] | None = None) -> int:
        if self.finished is not None:
            return self.finished.new_tokens
        if count_tokens is None:
            return len(self.generated.split())
        return count_tokens(self.generated) if self.generated else 0

    def stats(self, count_tokens: Callable[[str], int] | None = None) -> RunStats:
        tokens = self.tokens(count_tokens)
        seconds = (self.finished.seconds if self.finished is not None
                   else self.now() - self.started)
        generating = self.generation_seconds
        return RunStats(turn=self.turn, rounds=self.rounds, final_round=self.final_round,
                        searches=self.searches,
                        tokens=tokens, seconds=seconds,
                        tokens_per_second=tokens / generating if generating > 0 else 0.0,
                        answer=self.answer,
                        stop_reason=self.finished.stop_reason if self.finished
                        else LOAD_FAILED if self.load_failed else None)


@dataclass(frozen=True)
class RunStats:
    turn: int
    rounds: int
    searches: int
    tokens: int
    seconds: float
    tokens_per_second: float
    answer: str | None = None
    stop_reason: str | None = None
    final_round: bool = False

    def line(self) -> str:
        """One line of live stats. Turns count as Max turns does (the rounds with search);
        the closing round, which has none, is named as such."""
        if self.stop_reason is not None:  # ended: how many turns it took, not where it was
            turn = f"{self.turn} turn" + ("" if self.turn == 1 else "s")
        elif self.final_round:
            turn = "Closing turn (no search)"
        elif self.rounds:
            turn = f"Turn {self.turn} of {self.rounds - 1}"
        else:
            turn = "Turn –"
        searches = f"{self.searches} search" + ("" if self.searches == 1 else "es")
        state = f" · {ended(self.stop_reason)}"
        return (f"{turn} · {searches} · {self.tokens} tokens · "
                f"{self.tokens_per_second:.1f} tokens/s · {self.seconds:.1f} s{state}")


def render(events: Iterable[Event | ModelStatus]) -> list[Message]:
    """All of a run's messages at once (the fold of `Transcript.apply`)."""
    transcript = Transcript(now=lambda: 0.0)
    for event in events:
        transcript.apply(event)
    return transcript.messages
