"""Connection guards for the HTTP server: deadlines for a request's headers and body, a
minimum body rate, a limit on open connections with a clean refusal, and a log that a
flood cannot grow.

uvicorn closes an idle kept-alive connection (`timeout_keep_alive`), but a connection that
has sent nothing, part of its headers, or its headers and then a body a byte at a time,
waits as long as the client likes; thousands of them take every connection slot and no
real request gets in. `guarded_h11` is uvicorn's h11 protocol with these rules added; it is
passed to uvicorn as its `http` protocol class.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import resource
import time

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("retriever")

# Where a connection is, as far as the guard cares. BUSY: the server has the whole request
# (it is searching or answering), so the client owes nothing and the connection is never
# evicted; CLOSED: dropped by the guard or gone.
HEADERS, BODY, IDLE, BUSY, CLOSED = "headers", "body", "idle", "busy", "closed"
# A body younger than this is never judged at the connection limit: its rate over a
# shorter time says nothing (the headers and the body are often a packet apart).
STALL_AGE = 1.0


def _plain_response(status: str, text: str) -> bytes:
    body = text.encode()
    return (f"HTTP/1.1 {status}\r\ncontent-type: text/plain; charset=utf-8\r\n"
            f"connection: close\r\ncontent-length: {len(body)}\r\n\r\n").encode() + body


def guarded_h11(max_connections: int, header_timeout: float, body_timeout: float = 60.0,
                min_body_rate: float = 1024.0, body_grace: float = 5.0) -> type[H11Protocol]:
    """uvicorn's h11 protocol with these rules.

    Headers: a connection whose request headers are not complete `header_timeout` seconds
    after it connected, or after the first byte of a later request on it arrived, gets a
    408 and is closed.

    Body: once the headers are in, the body must be complete within `body_timeout`
    seconds, and after the first `body_grace` seconds it must keep up an average of
    `min_body_rate` bytes a second (each `min_body_rate` bytes buy one more second, as
    Apache's mod_reqtimeout); else a 408 and the connection closes.

    Limit: beyond `max_connections`, one connection makes room (503 and closed; an idle
    one just closed), the first there is of: the one that has waited longest for its
    headers, if for STALL_AGE seconds or more; the oldest body behind the minimum rate
    over all but its first STALL_AGE seconds; the longest idle kept-alive one; the one
    that has waited longest for its headers. When every connection is busy with a request
    or sending its body fast enough, the newcomer is refused (503)."""
    refusal = _plain_response(
        "503 Service Unavailable",
        f"The retriever has {max_connections} open connections, its limit; try again "
        "shortly (the server's --max-connections sets the limit).\n")
    slow_refusal = _plain_response(
        "503 Service Unavailable",
        f"The retriever has {max_connections} open connections, its limit (the server's "
        f"--max-connections), and this request's body was arriving at under "
        f"{min_body_rate:g} bytes/s (--min-body-rate): its connection made room for "
        "another. Send the body faster, or try again shortly.\n")
    headers_late = _plain_response(
        "408 Request Timeout",
        f"The request headers did not arrive within {header_timeout:g} s "
        "(the server's --header-timeout).\n")
    body_late = _plain_response(
        "408 Request Timeout",
        f"The request body did not arrive within {body_timeout:g} s "
        "(the server's --body-timeout).\n")
    body_slow = _plain_response(
        "408 Request Timeout",
        f"The request body arrived at under {min_body_rate:g} bytes/s after its first "
        f"{body_grace:g} s (the server's --min-body-rate and --body-grace); send it "
        "faster.\n")
    stall_age = min(STALL_AGE, body_grace)

    # The connections each eviction rule may pick from, oldest first.
    awaiting: collections.OrderedDict[GuardedH11, None] = collections.OrderedDict()
    idle: collections.OrderedDict[GuardedH11, None] = collections.OrderedDict()
    receiving: dict[GuardedH11, None] = {}
    registry = {HEADERS: awaiting, IDLE: idle, BODY: receiving}

    def victim(now: float) -> GuardedH11 | None:
        """The connection that makes room for a newcomer, or None. A connection that has
        just connected is the last choice: under a flood that reconnects as fast as it is
        dropped, a real client between connecting and sending its headers is one."""
        oldest = next(iter(awaiting), None)
        if oldest is not None and now - oldest.phase_since >= stall_age:
            return oldest
        # The oldest body whose bytes no longer cover the minimum rate past its first
        # STALL_AGE seconds. Oldest first, so under a flood the first looked at is
        # nearly always one: the scan stays short where it runs most.
        for conn in receiving:
            if conn.body_due(stall_age) < now and not conn.flow.read_paused:
                return conn
        # A kept-alive connection between requests: its client connects again if need be.
        return next(iter(idle), None) or oldest

    class GuardedH11(H11Protocol):
        phase = ""
        phase_since = 0.0  # loop time the phase began
        _timer: asyncio.TimerHandle | None = None
        _waiting_after: object = None  # the request cycle before the awaited headers
        _body_start = 0.0
        _body_bytes = 0

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            # Connections the guard has closed are still counted until the loop reports
            # them lost: they have made room already.
            if len(self.connections) > max_connections and sum(
                    not c.transport.is_closing() for c in self.connections) > max_connections:
                out = victim(self.loop.time())
                if out is None:
                    log.warning("refused a connection: all %d are busy with requests",
                                max_connections)
                    self._drop(refusal)
                    return
                out._drop(slow_refusal if out.phase == BODY else
                          b"" if out.phase == IDLE else refusal)
            self._enter(HEADERS)

        def connection_lost(self, exc: Exception | None) -> None:
            self._enter(CLOSED)
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self.phase == BODY:
                self._body_bytes += len(data)  # chunked framing too: bytes are progress
            elif self.phase in (IDLE, BUSY) and (self.cycle is None or
                                                 self.cycle.response_complete):
                # Bytes while no request is in flight begin a request's headers: start
                # their clock. Later bytes do not restart it, so trickling does not help.
                self._enter(HEADERS)
            super().data_received(data)

        def handle_events(self) -> None:
            super().handle_events()
            self._follow()

        def on_response_complete(self) -> None:
            super().on_response_complete()  # may start a pipelined request
            if (self.phase == BUSY and self.cycle.response_complete
                    and not self.transport.is_closing()):
                self._enter(IDLE)

        def _follow(self) -> None:
            """Move to the phase the request cycle is in, after h11 has read what came."""
            if self.phase in ("", CLOSED) or self.transport.is_closing():
                return
            if self.transport.get_protocol() is not self:
                self._enter(CLOSED)  # upgraded (WebSocket): no longer an HTTP request's
                return
            if self.phase == HEADERS and self.cycle is self._waiting_after:
                return  # the headers are not complete yet
            if self.cycle is not None and self.conn.their_state is h11.SEND_BODY:
                if self.phase != BODY:
                    self._enter(BODY)
            elif self.phase in (HEADERS, BODY):
                if self.cycle is not None and self.cycle.response_complete:
                    # The rest of a body the application answered without reading (a
                    # 413) has been skipped: uvicorn re-arms no keep-alive timer here, so
                    # the next request's headers are awaited as on a new connection.
                    self._enter(HEADERS)
                else:
                    self._enter(BUSY)

        def _enter(self, phase: str) -> None:
            """Leave the current phase (its registry, its timer) and start `phase`."""
            if self.phase == CLOSED:
                return
            registry.get(self.phase, {}).pop(self, None)
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self.phase, self.phase_since = phase, self.loop.time()
            if phase == HEADERS:
                self._waiting_after = self.cycle
                self._timer = self.loop.call_later(header_timeout, self._headers_due)
            elif phase == BODY:
                self._body_start, self._body_bytes = self.phase_since, 0
                self._timer = self.loop.call_later(min(body_grace, body_timeout),
                                                   self._body_due)
            if phase in registry:
                registry[phase][self] = None

        def body_due(self, grace: float) -> float:
            """When the body's bytes so far stop covering the minimum rate after `grace`."""
            return self._body_start + grace + self._body_bytes / min_body_rate

        def _drop(self, answer: bytes) -> None:
            """Close the connection, first sending `answer` if no response has begun."""
            self._enter(CLOSED)
            if self.transport.is_closing():
                return
            cycle = self.cycle
            if cycle is not None:
                if cycle.response_started:
                    answer = b""  # a status line now would land inside the response
                if not cycle.response_complete:
                    # The application's reads now say the client left, and what it
                    # sends is dropped: our answer is the only one on the wire.
                    cycle.disconnected = True
                    cycle.message_event.set()
            if answer:
                self.transport.write(answer)
            self.transport.close()

        def _headers_due(self) -> None:
            self._timer = None
            if self.transport.is_closing():
                return
            if self.cycle is not None and not self.cycle.response_complete:
                self._enter(HEADERS)  # still answering the previous request (pipelining)
                return
            log.warning("closed a connection whose request headers did not arrive within "
                        "%g s", header_timeout)
            self._drop(headers_late)

        def _body_due(self) -> None:
            self._timer = None
            if self.transport.is_closing():
                return
            now = self.loop.time()
            deadline = self._body_start + body_timeout
            due = self.body_due(body_grace)
            if self.flow.read_paused:
                # The server stopped reading (the application is behind), not the client.
                due = max(due, now + 1.0)
            if now >= deadline:
                log.warning("closed a connection whose request body did not arrive within "
                            "%g s", body_timeout)
                self._drop(body_late)
            elif now >= due:
                log.warning("closed a connection whose request body arrived at under %g "
                            "bytes/s", min_body_rate)
                self._drop(body_slow)
            else:
                self._timer = self.loop.call_later(min(due, deadline) - now, self._body_due)

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
