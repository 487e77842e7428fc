"""Runs in flight: each browser session's cancel events (the Stop buttons), and the pump
that moves a run's events from its worker thread to a Gradio generator.

No gradio import here: the browser-free tests drive these directly.
"""

from __future__ import annotations

import contextvars
import queue
import threading
import time
from collections.abc import Iterator, Mapping

BUSY_SESSION = ("This session already has a question running in {tab}: wait for its answer "
                "or press Stop. An API client runs one question per session at a time: "
                "open one Client for each question to run at once.")


class SessionBusy(RuntimeError):
    """The session already has a run going in that slot."""


class RunRegistry:
    """The cancel event of each browser session's current run, by (session, slot).

    One run per session and slot: a browser disables its button while a run goes, and an
    API client that sends a second call on the same session (one `gradio_client.Client`
    is one session) gets `SessionBusy`, said to it as a refusal, instead of its first run
    being stopped under it.
    """

    def __init__(self):
        self._runs: dict[tuple[str, str], tuple[threading.Event, threading.Event]] = {}
        self._lock = threading.Lock()

    def start(self, session: str, slot: str) -> tuple[threading.Event, threading.Event]:
        """(cancel, done) for a new run; SessionBusy while one goes in the same slot (one
        already stopped, still ending, is let go)."""
        with self._lock:
            old = self._runs.get((session, slot))
            if old is not None and not old[0].is_set() and not old[1].is_set():
                raise SessionBusy(slot)
            events = (threading.Event(), threading.Event())
            self._runs[(session, slot)] = events
            return events

    def finish(self, session: str, slot: str, events: tuple) -> None:
        events[1].set()
        with self._lock:
            if self._runs.get((session, slot)) == events:
                del self._runs[(session, slot)]

    def stop(self, session: str, slots: tuple[str, ...], wait: float = 0.0) -> int:
        """Cancel the session's runs in `slots`; wait up to `wait` s for them to end."""
        with self._lock:
            found = [self._runs[(session, s)] for s in slots if (session, s) in self._runs]
        for cancel, _ in found:
            cancel.set()
        deadline = time.monotonic() + wait
        for _, done in found:
            done.wait(max(0.0, deadline - time.monotonic()))
        return len(found)


_END = object()


def pump(streams: Mapping[str, Iterator], cancel: threading.Event | None = None,
         min_interval: float = 0.02) -> Iterator[list[tuple[str, object]]]:
    """Run each stream in a worker thread; yield batches of (name, item) as they come.

    A batch holds everything that arrived since the last one, so a UI slower than the model
    falls behind by at most one render, never by a growing backlog. When the consumer stops
    early (a closed generator, Gradio's cancel), `cancel` is set so the workers end too.
    """
    inbox: queue.Queue = queue.Queue()

    def work(name: str, stream: Iterator) -> None:
        try:
            for item in stream:
                inbox.put((name, item))
        except BaseException as err:  # handed to the consumer
            inbox.put((name, err))
        finally:
            inbox.put((name, _END))

    threads = []
    for name, stream in streams.items():
        context = contextvars.copy_context()  # request context, for spaces.GPU
        thread = threading.Thread(target=context.run, args=(work, name, stream), daemon=True,
                                  name=f"agent-{name}")
        thread.start()
        threads.append(thread)
    open_streams = len(threads)
    last = 0.0
    try:
        while open_streams:
            batch = [inbox.get()]
            wait = min_interval - (time.perf_counter() - last)
            if wait > 0:
                time.sleep(wait)
            while True:
                try:
                    batch.append(inbox.get_nowait())
                except queue.Empty:
                    break
            items, error = [], None
            for name, item in batch:
                if item is _END:
                    open_streams -= 1
                elif isinstance(item, BaseException):
                    error = error or item
                else:
                    items.append((name, item))
            if items:
                last = time.perf_counter()
                yield items
            if error is not None:
                raise error
    finally:
        if open_streams and cancel is not None:
            cancel.set()
