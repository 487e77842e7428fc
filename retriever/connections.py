"""Connection guards for the HTTP server: a deadline for a request's headers, a limit on
open connections with a clean refusal, and a log that a flood cannot grow.

uvicorn closes an idle kept-alive connection (`timeout_keep_alive`), but a connection that
has sent nothing, or part of its headers, waits forever; thousands of them use up the
process's file descriptors and no real request gets in. `guarded_h11` is uvicorn's h11
protocol with both rules added; it is passed to uvicorn as its `http` protocol class.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import resource
import time

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("retriever")


def _plain_response(status: str, text: str) -> bytes:
    body = text.encode()
    return (f"HTTP/1.1 {status}\r\ncontent-type: text/plain; charset=utf-8\r\n"
            f"connection: close\r\ncontent-length: {len(body)}\r\n\r\n").encode() + body


def guarded_h11(max_connections: int, header_timeout: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol with two rules. A connection whose request headers are not
    complete `header_timeout` seconds after it connected, or after the first byte of a
    later request on it arrived, gets a 408 and is closed. Beyond `max_connections`, the
    connection that has waited longest for its headers makes room (503, closed); when
    every connection is busy with a request, the newcomer is refused (503)."""
    refusal = _plain_response(
        "503 Service Unavailable",
        f"The retriever has {max_connections} open connections, its limit; try again "
        "shortly (the server's --max-connections sets the limit).\n")
    too_slow = _plain_response(
        "408 Request Timeout",
        f"The request headers did not arrive within {header_timeout:g} s "
        "(the server's --header-timeout).\n")

    # Connections waiting for request headers, oldest first.
    awaiting: collections.OrderedDict[GuardedH11, None] = collections.OrderedDict()

    class GuardedH11(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None
        _waiting_after: object = None  # the request cycle before the awaited headers

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                if awaiting:
                    oldest, _ = awaiting.popitem(last=False)
                    oldest._refuse()
                else:
                    log.warning("refused a connection: all %d are busy with requests",
                                max_connections)
                    self._refuse()
                    return
            self._arm()

        def _refuse(self) -> None:
            self._disarm()
            self.transport.write(refusal)
            self.transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            # Bytes while no request is in flight begin a request's headers: start its clock.
            # The clock is not restarted by later bytes, so trickling them does not help.
            if self._deadline is None and (self.cycle is None or self.cycle.response_complete):
                self._arm()
            super().data_received(data)

        def handle_events(self) -> None:
            super().handle_events()
            if self._deadline is not None and self.cycle is not self._waiting_after:
                self._disarm()  # the headers of a new request arrived

        def _arm(self) -> None:
            self._waiting_after = self.cycle
            self._deadline = self.loop.call_later(header_timeout, self._too_slow)
            awaiting[self] = None

        def _disarm(self) -> None:
            awaiting.pop(self, None)
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _too_slow(self) -> None:
            self._disarm()
            if self.transport.is_closing():
                return
            if self.cycle is not None and not self.cycle.response_complete:
                self._arm()  # still answering the previous request (pipelining): wait
                return
            log.warning("closed a connection whose request headers did not arrive within "
                        "%g s", header_timeout)
            self.transport.write(too_slow)
            self.transport.close()

    return GuardedH11


class RateLimit(logging.Filter):
    """Lets through at most `burst` records of one kind (logger and message template) per
    `period` seconds; the first record after a quiet spell says how many were dropped."""

    def __init__(self, burst: int = 5, period: float = 60.0):
        super().__init__()
        self.burst, self.period = burst, period
        self.windows: dict[tuple[str, object], list] = {}  # kind -> [start, passed, dropped]

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        kind = (record.name, record.msg)
        window = self.windows.get(kind)
        if window is None or now - window[0] >= self.period:
            dropped = window[2] if window else 0
            if len(self.windows) > 1000:  # bounded, whatever varies in the messages
                self.windows.clear()
            self.windows[kind] = [now, 1, 0]
            if dropped:
                record.msg = f"{record.msg} ({dropped} more like this in the last " \
                             f"{self.period:g} s were not logged)"
            return True
        if window[1] < self.burst:
            window[1] += 1
            return True
        window[2] += 1
        return False


def limit_log_rates(names: tuple[str, ...] = ("uvicorn.error", "uvicorn.access", "asyncio",
                                               "retriever"),
                    burst: int = 5, period: float = 60.0) -> RateLimit:
    """Attach one RateLimit to the loggers where per-connection messages are made."""
    limiter = RateLimit(burst, period)
    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RateLimit) for f in logger.filters):
            logger.addFilter(limiter)
    return limiter


def raise_open_files_limit(max_connections: int, spare: int = 256) -> None:
    """Raise the soft limit on open files to the hard one, and check that
    `max_connections` plus `spare` descriptors (index files, the JVM) fit under it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if max_connections + spare > soft:
        raise ValueError(f"--max-connections {max_connections} needs {max_connections + spare} "
                         f"file descriptors; this process may open {soft} (ulimit -n). Lower "
                         "--max-connections or raise the limit.")
