"""Serving many visitors: one batched run per model, and a first-come-first-served line
that tells each waiting visitor their place and how long, by measured run times.

A visitor's question becomes a `Ticket` in its model's `ModelServer`. The server's worker
thread holds the model while any question runs and advances them together as
`agent.loop.LiveBatch`es, one turn at a time: a question that arrives while others run
joins at their next turn (up to `max_batch` at once; later ones wait in line, in order).
Questions whose settings can't share a batch (other sampling, turns, documents) run in a
batch of their own, their turns taking turns with the others'. Each visitor's events stay
their own (an event queue per ticket); Stop ends only that visitor's question.

No gradio import here: the browser-free tests drive these directly.
"""

from __future__ import annotations

import collections
import queue
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from agent.backends.base import Backend, ModelLoadError
from agent.events import Event, Finished
from agent.loop import AgentSettings, LiveBatch

DEFAULT_MAX_BATCH = 16  # questions a model answers at once; more wait in line
RECENT_RUNS = 20  # run times an estimate is made from


@dataclass
class Ticket:
    """One visitor's question: its events (in order, ending with Finished) and its place."""

    question: str
    settings: AgentSettings
    cancel: threading.Event
    arrived: float
    events: queue.Queue
    started: float | None = None  # when it joined a batch


@dataclass(frozen=True)
class Place:
    """Where a waiting ticket stands: `ahead` questions before it in line, `running` now,
    and `estimate` seconds until it starts (None until a run time has been measured)."""

    ahead: int
    running: int
    estimate: float | None

    def words(self) -> str:
        place = ("next in line" if self.ahead == 0 else
                 f"{self.ahead + 1}{_ordinal(self.ahead + 1)} in line")
        about = (f"; starts in about {max(1, round(self.estimate))} s (from the last runs)"
                 if self.estimate is not None else "")
        if not self.running:  # the pool's slot is held by a run outside the line
            return (f"The model is finishing another run (its warm-up, or an Evaluate run); "
                    f"you are {place}{about}.")
        return (f"{self.running} question{'s' if self.running != 1 else ''} running on this "
                f"model; you are {place}{about}.")


def _ordinal(n: int) -> str:
    return "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")


class ModelServer:
    """The line and the batched runs of one model."""

    def __init__(self, backend_of: Callable[[], Backend], retriever,
                 hold: Callable[[], object], release: Callable[[], None],
                 max_batch: int = DEFAULT_MAX_BATCH):
        # backend_of(): the loaded backend (ModelLoadError when it can't be had);
        # hold() / release(): the model's run slot in the pool, held while questions run.
        self.backend_of, self.retriever = backend_of, retriever
        self.hold, self.release = hold, release
        self.max_batch = max_batch
        self.waiting: collections.deque[Ticket] = collections.deque()
        self.batches: dict[AgentSettings, LiveBatch] = {}
        self.run_seconds: collections.deque[float] = collections.deque(maxlen=RECENT_RUNS)
        self._lock = threading.Condition()
        self._worker: threading.Thread | None = None

    # -- the visitor's side ------------------------------------------------------------
    def submit(self, question: str, settings: AgentSettings,
               cancel: threading.Event) -> Ticket:
        ticket = Ticket(question, settings, cancel, time.monotonic(), queue.Queue())
        with self._lock:
            self.waiting.append(ticket)
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, daemon=True,
                                                name="model-server")
                self._worker.start()
            self._lock.notify_all()
        return ticket

    def withdraw(self, ticket: Ticket) -> bool:
        """Take a waiting ticket out of the line (its visitor's Stop); False once it runs."""
        with self._lock:
            if ticket not in self.waiting:
                return False
            self.waiting.remove(ticket)
            return True

    def _running(self) -> int:
        """Questions in batches now (the caller holds the lock)."""
        return sum(len(b) for b in self.batches.values())

    def place(self, ticket: Ticket) -> Place | None:
        """Where `ticket` stands in line; None once it runs (or has ended)."""
        with self._lock:
            if ticket not in self.waiting:
                return None
            ahead = self.waiting.index(ticket)
            running = self._running()
            return Place(ahead, running, self._estimate(ahead, running))

    def _estimate(self, ahead: int, running: int) -> float | None:
        """Seconds until the ticket `ahead` places from the front starts: the runs that must
        end first (those ahead beyond the free places), a median run time per batch of them."""
        if not self.run_seconds:
            return None
        free = self.max_batch - running
        if ahead < free:
            return 0.0
        rounds = 1 + (ahead - free) // self.max_batch
        return rounds * statistics.median(self.run_seconds)

    # -- the worker --------------------------------------------------------------------
    def _admit(self) -> None:
        """Move tickets from the front of the line into batches while there is room (first
        come, first served: a ticket never passes the one before it)."""
        while self.waiting and self._running() < self.max_batch:
            ticket = self.waiting.popleft()
            if ticket.cancel.is_set():
                self._close(ticket, None)
                continue
            batch = self.batches.get(ticket.settings)
            if batch is None:
                batch = self.batches[ticket.settings] = LiveBatch(
                    self.backend, self.retriever, ticket.settings)
            ticket.started = time.monotonic()
            batch.join(ticket.question, self._emitter(ticket), ticket.cancel)

    def _emitter(self, ticket: Ticket):
        def emit(event: Event) -> None:
            ticket.events.put(event)
            if isinstance(event, Finished):
                if event.stop_reason not in ("cancelled", "error"):
                    self.run_seconds.append(time.monotonic() - (ticket.started or 0.0))
        return emit

    @staticmethod
    def _close(ticket: Ticket, event: Event | None) -> None:
        ticket.events.put(event)  # None: left the line before it ran (its Stop)

    def _work(self) -> None:
        held = False
        try:
            while True:
                with self._lock:
                    if not held:
                        for ticket in [t for t in self.waiting if t.cancel.is_set()]:
                            self.waiting.remove(ticket)
                            self._close(ticket, None)
                        if not self.waiting:
                            self._worker = None
                            return
                if not held:
                    self.hold()
                    held = True
                    try:
                        self.backend = self.backend_of()
                    except ModelLoadError as err:
                        with self._lock:
                            failed = list(self.waiting)
                            self.waiting.clear()
                        for ticket in failed:
                            self._close(ticket, err)
                        continue
                with self._lock:
                    self._admit()
                    batches = [b for b in self.batches.values() if len(b)]
                for batch in batches:  # each settings' batch takes a turn
                    batch.step()
                with self._lock:
                    self.batches = {s: b for s, b in self.batches.items() if len(b)}
                    idle = not self.batches
                if idle:  # nothing runs: the model's slot goes back (to an Evaluate run, say)
                    self.release()
                    held = False
        finally:
            if held:
                self.release()
            with self._lock:
                if self._worker is threading.current_thread():
                    self._worker = None


def ticket_events(server: ModelServer, ticket: Ticket, every: float = 1.0,
                  poll: float = 0.2) -> Iterator[Event | Place | ModelLoadError]:
    """What a visitor sees of `ticket`: its Place while it waits (when it moves, and again
    every `every` s so the estimate stays fresh), then its events up to Finished; a
    ModelLoadError when the model failed. Ends with nothing more when the visitor's Stop
    takes it out of the line before it ran."""
    last, shown_at = None, 0.0
    while True:
        try:  # first a short wait: a question that starts at once never shows a place
            event = ticket.events.get(timeout=poll if ticket.started is None else None)
        except queue.Empty:
            if ticket.cancel.is_set() and server.withdraw(ticket):
                return
            place = server.place(ticket)
            now = time.monotonic()
            if place is not None and (place != last or now - shown_at >= every):
                last, shown_at = place, now
                yield place
            continue
        if event is None:
            return
        yield event
        if isinstance(event, (Finished, ModelLoadError)):
            return
