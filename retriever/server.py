"""The Search-R1 compatible retrieval server: `POST /retrieve`, `GET /health`.

Requests are served fairly: each is cut into slices of at most `SLICE_RESULTS` results,
and every round takes one slice from each waiting request (round-robin) and sends them to
the engine together, on one worker thread. A one-query request therefore waits for one
round, not for a big request ahead of it, while concurrent clients still share the engine's
batch speed; no JVM or index object is used from two Python threads at once. Each slice is
turned into JSON as soon as it is searched, so a big answer is held as bytes, not as
objects. A query the engine cannot take fails alone (`IsolatedSearch`): it gets no
documents and is named in the answer's `errors`. Work for a client that hung up is skipped.

Limits, each with a flag: queries and results (queries x topk) per request, body size,
open connections, how long a request's headers and body may take to arrive, and the slowest
rate at which a body may come (retriever/connections.py enforces the connection rules).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import ctypes.util
import json
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field, StrictStr, ValidationError, field_validator
from starlette.requests import ClientDisconnect

from retriever.base import Engine
from retriever.doc import Doc

# A Search-R1 training run sends a whole rollout batch in one request (512 prompts x 5
# samples = 2,560 queries); its client reads `result` without checking the status.
MAX_QUERIES = 8192
# Documents one request may ask for (queries x topk): a rollout batch at topk 25, or 8,192
# queries at topk 8. An answer at the limit is about 25 MB on Wikipedia-sized passages.
MAX_RESULTS = 65536
MAX_QUERY_CHARS = 2000
MAX_TOPK = 100
# What one request body may hold: 8,192 queries of ~2,000 ASCII characters fit; memory
# stays bounded whatever a client sends.
MAX_BODY_MB = 32
# Open connections; more are answered 503 and closed, so descriptors never run out.
MAX_CONNECTIONS = 1000
# Seconds a client has to send a request's headers, and then its body.
HEADER_TIMEOUT = 10.0
BODY_TIMEOUT = 60.0
# After its first BODY_GRACE seconds a body must average MIN_BODY_RATE bytes/s, so a client
# sending a byte every few seconds is cut in seconds, not after BODY_TIMEOUT; and at the
# connection limit, a body behind that rate makes room for a newcomer. A 32 MiB body at
# the rate would take hours: any real client is far faster.
MIN_BODY_RATE = 1024.0
BODY_GRACE = 5.0
# One request's share of a scheduling round, and a round's total, in results.
SLICE_RESULTS = 1024
ROUND_RESULTS = 8192
# An answer this big (in results) is followed by returning freed memory to the system.
TRIM_AFTER_RESULTS = 8192
log = logging.getLogger("retriever")


@dataclass(frozen=True)
class ServerLimits:
    max_queries: int = MAX_QUERIES
    max_results: int = MAX_RESULTS
    max_body_mb: float = MAX_BODY_MB
    max_connections: int = MAX_CONNECTIONS
    header_timeout: float = HEADER_TIMEOUT
    body_timeout: float = BODY_TIMEOUT
    min_body_rate: float = MIN_BODY_RATE
    body_grace: float = BODY_GRACE

    def __post_init__(self) -> None:
        bad = [f"--{name.replace('_', '-')}" for name, value in asdict(self).items()
               if not value > 0]
        if bad:
            raise ValueError(f"{', '.join(bad)} must be positive.")


class RetrieveRequest(BaseModel):
    queries: list[StrictStr]
    # Missing, null or 0: the server's default (as Search-R1's server).
    topk: int | None = Field(default=None, ge=0, le=MAX_TOPK)
    return_scores: bool = False

    @field_validator("queries")
    @classmethod
    def _short_queries(cls, queries: list[str]) -> list[str]:
        for i, q in enumerate(queries):
            if len(q) > MAX_QUERY_CHARS:
                raise ValueError(f"query {i} has {len(q)} characters; the limit is "
                                 f"{MAX_QUERY_CHARS}")
        return queries


class ClientGone(Exception):
    """The client disconnected before its request was answered."""


def rows_as_list(rows: list[list[Doc]]) -> list[list[Doc]]:
    return rows


class Job:
    """One request: its queries, how far its slices have got, and what they produced."""

    __slots__ = ("queries", "topk", "render", "future", "next", "parts", "failures")

    def __init__(self, queries: list[str], topk: int, render: Callable, future: asyncio.Future):
        self.queries, self.topk, self.render, self.future = queries, topk, render, future
        self.next = 0  # first query not yet given to a round
        self.parts: list = []  # what `render` made of each searched slice, in order
        self.failures: dict[int, str] = {}

    def take_slice(self, slice_results: int) -> tuple[int, int]:
        start = self.next
        self.next = min(len(self.queries), start + max(1, slice_results // self.topk))
        return start, self.next


class FairScheduler:
    """Runs searches in rounds on a single worker thread, one slice of every waiting
    request per round, so that no request waits behind the whole of a bigger one."""

    def __init__(self, engine: Engine, slice_results: int = SLICE_RESULTS,
                 round_results: int = ROUND_RESULTS):
        self.engine = engine
        self.slice_results, self.round_results = slice_results, round_results
        self.waiting: collections.deque[Job] = collections.deque()
        self.wakeup = asyncio.Event()
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="search")
        self.dropped = 0  # requests whose client left before they were answered
        self.failed_queries = 0
        # Engines that isolate bad queries say which failed; any other engine just searches.
        self._search = getattr(engine, "search_reporting", None) or (
            lambda queries, topk: (engine.search(queries, topk), {}))

    async def search(self, queries: list[str], topk: int, request: Request | None = None,
                     render: Callable[[list[list[Doc]]], object] = rows_as_list,
                     ) -> tuple[list, dict[int, str]]:
        """What `render` made of each slice's results, in query order, and {query index:
        failure}. `render` runs on the worker thread, right after its slice is searched.
        If the request's client disconnects first, the rest is skipped: ClientGone."""
        if not queries:
            return [], {}
        job = Job(queries, topk, render, asyncio.get_running_loop().create_future())
        self.waiting.append(job)
        self.wakeup.set()
        if request is None:
            return await job.future
        watcher = asyncio.create_task(_disconnected(request))
        try:
            await asyncio.wait({job.future, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
        if not job.future.done():
            job.future.cancel()  # the scheduler drops it
            raise ClientGone
        return job.future.result()

    def _next_round(self) -> list[tuple[Job, int, int]]:
        """One slice from each waiting request, in turn, until the round is full. Requests
        left over, and those with slices to go, wait at the back of the line."""
        chosen, size = [], 0
        for _ in range(len(self.waiting)):
            if size >= self.round_results:
                break
            job = self.waiting.popleft()
            if job.future.done():  # cancelled: its client disconnected
                self.dropped += 1
                continue
            start, end = job.take_slice(self.slice_results)
            chosen.append((job, start, end))
            size += (end - start) * job.topk
            if job.next < len(job.queries):
                self.waiting.append(job)
        return chosen

    def _search_group(self, group: list[tuple[Job, int, int]]) -> list[tuple[object, dict]]:
        """Worker thread: the slices of one topk as one engine batch; each slice rendered,
        with its failures indexed by query in its own request."""
        topk = group[0][0].topk
        results, failures = self._search(
            [q for job, start, end in group for q in job.queries[start:end]], topk)
        out, offset = [], 0
        for job, start, end in group:
            width = end - start
            mine = {start + i - offset: why for i, why in failures.items()
                    if offset <= i < offset + width}
            out.append((job.render(results[offset:offset + width]), mine))
            offset += width
        return out

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self.waiting:
                self.wakeup.clear()
                await self.wakeup.wait()
                continue
            groups: dict[int, list[tuple[Job, int, int]]] = {}
            for chosen in self._next_round():
                groups.setdefault(chosen[0].topk, []).append(chosen)
            # One engine batch per topk, the smallest first: its requests are answered
            # before a big slice is searched.
            for group in sorted(groups.values(),
                                key=lambda g: sum((end - start) * job.topk
                                                  for job, start, end in g)):
                try:
                    outcome = await loop.run_in_executor(self.worker, self._search_group,
                                                         group)
                except Exception as err:  # the engine itself failed: each request hears
                    for job, _, _ in group:
                        if not job.future.done():
                            job.future.set_exception(err)
                        with contextlib.suppress(ValueError):
                            self.waiting.remove(job)
                    continue
                for (job, _, end), (part, failures) in zip(group, outcome, strict=True):
                    job.parts.append(part)
                    job.failures.update(failures)
                    self.failed_queries += len(failures)
                    if end == len(job.queries) and not job.future.done():
                        job.future.set_result((job.parts, job.failures))


async def _disconnected(request: Request) -> None:
    """Returns when the client hangs up. The body has been read, so the server's next
    message for this request is the disconnect."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class BodyTooLarge(Exception):
    pass


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def _describe(errors: list[dict]) -> str:
    parts = []
    for e in errors:
        if e.get("type") == "json_invalid":
            parts.append(f"the body is not valid JSON ({e.get('ctx', {}).get('error', '')})")
            continue
        where = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {e.get('msg', 'invalid')}")
    return "; ".join(parts)


def _json_rows(return_scores: bool) -> Callable[[list[list[Doc]]], bytes]:
    """Renders a slice's rows as the JSON of its `result` items, without the brackets."""
    def render(rows: list[list[Doc]]) -> bytes:
        if return_scores:
            items = [[{"document": d.document(), "score": d.score} for d in row]
                     for row in rows]
        else:
            items = [[d.document() for d in row] for row in rows]
        return orjson.dumps(items)[1:-1]
    return render


def _glibc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None
    except OSError:
        return None


_GLIBC = _glibc()
_M_MMAP_THRESHOLD = -3


def _release_memory() -> None:
    """Hand the allocator's free pages back to the system (glibc keeps them otherwise)."""
    if _GLIBC is not None:
        _GLIBC.malloc_trim(0)


def _map_big_buffers() -> None:
    """Allocate buffers of 1 MiB and more (an answer's JSON) as their own memory maps,
    which go back to the system when freed. glibc would otherwise raise this threshold
    after the first big free and serve later big buffers from a heap that stays."""
    if _GLIBC is not None:
        _GLIBC.mallopt(_M_MMAP_THRESHOLD, 2**20)


def _error(status: int, detail: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"detail": f"Bad /retrieve request: {detail}"})


def create_app(engine: Engine, default_topk: int = 3,
               limits: ServerLimits | None = None) -> FastAPI:
    limits = limits or ServerLimits()
    scheduler = FairScheduler(engine)
    max_body = int(limits.max_body_mb * 2**20)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        task = asyncio.create_task(scheduler.run())
        yield
        task.cancel()
        scheduler.worker.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="Search-R1 compatible retriever", lifespan=lifespan)

    @app.exception_handler(RequestValidationError)
    async def _bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(status_code=422, content={
            "detail": f"Bad /retrieve request: {_describe(exc.errors())}. Expected JSON "
                      '{"queries": ["..."], "topk": 3, "return_scores": true}.',
            "errors": [{"loc": e.get("loc"), "msg": e.get("msg")} for e in exc.errors()],
        })

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "engine": engine.name, "num_docs": engine.num_docs,
                "default_topk": default_topk, **asdict(limits),
                "dropped_requests": scheduler.dropped,
                "failed_queries": scheduler.failed_queries,
                **getattr(engine, "details", {})}

    @app.post("/retrieve", openapi_extra={"requestBody": {"content": {"application/json": {
        "schema": RetrieveRequest.model_json_schema()}}, "required": True}})
    async def retrieve(request: Request):
        try:
            async with asyncio.timeout(limits.body_timeout):
                body = await _read_body(request, max_body)
        except BodyTooLarge:
            return _error(413, f"the body is larger than the limit of {limits.max_body_mb:g} "
                               "MiB (start the server with --max-body-mb N to raise it, or "
                               "send fewer queries per request).")
        except TimeoutError:  # the rest of the body may never come: close the connection
            answer = _error(408, f"the body did not arrive within {limits.body_timeout:g} s "
                                 "(the server's --body-timeout).")
            answer.headers["connection"] = "close"
            return answer
        except ClientDisconnect:  # gone, or cut by the connection guard (too slow a body)
            return Response(status_code=499)
        try:
            # The standard library's parser: it keeps a lone surrogate ("\ud800"), which
            # the engines drop, where a stricter parser would refuse the whole request.
            payload = json.loads(body)
        except RecursionError:
            return _error(422, "the body is JSON nested too deeply to be a request. Expected "
                               '{"queries": ["..."], "topk": 3, "return_scores": true}.')
        except ValueError as err:
            raise RequestValidationError([{"type": "json_invalid", "loc": ("body",),
                                           "msg": "JSON decode error",
                                           "ctx": {"error": str(err)}}]) from None
        try:
            parsed = RetrieveRequest.model_validate(payload)
        except ValidationError as err:
            raise RequestValidationError(err.errors()) from None
        del body, payload
        if len(parsed.queries) > limits.max_queries:
            return _error(422, f"queries: {len(parsed.queries)} queries; the limit is "
                               f"{limits.max_queries} per request (start the server with "
                               "--max-queries N for bigger batches).")
        topk = parsed.topk or default_topk
        results = len(parsed.queries) * topk
        if results > limits.max_results:
            return _error(422, f"{len(parsed.queries)} queries x topk {topk} = {results} "
                               f"results; the limit is {limits.max_results} per request "
                               "(send fewer queries per request or a smaller topk, or start "
                               "the server with --max-results N).")
        try:
            parts, failures = await scheduler.search(parsed.queries, topk, request,
                                                     render=_json_rows(parsed.return_scores))
        except ClientGone:
            return Response(status_code=499)  # nobody is listening
        except Exception as err:
            log.exception("the %s engine failed", engine.name)
            return JSONResponse(status_code=500, content={
                "detail": f"The {engine.name} engine failed: {type(err).__name__}: {err}"})
        # The parts are JSON already: joined, not parsed and written again.
        out = [b'{"result":[', b",".join(p for p in parts if p), b"]"]
        del parts
        if failures:
            out.append(b',"errors":' + orjson.dumps(
                [{"query": i, "detail": why} for i, why in sorted(failures.items())]))
        out.append(b"}")
        answer = Response(b"".join(out), media_type="application/json")
        del out
        if results >= TRIM_AFTER_RESULTS:
            answer.background = _Release()
        return answer

    return app


class _Release:
    """Runs once a big answer is sent; its buffers are freed when the request's objects
    go, a moment later, and then the memory is handed back."""

    async def __call__(self) -> None:
        asyncio.get_running_loop().call_later(0.2, _release_memory)


def serve(engine: Engine, host: str = "127.0.0.1", port: int = 8000, default_topk: int = 3,
          limits: ServerLimits | None = None, log_level: str = "info") -> None:
    import uvicorn

    from retriever.connections import guarded_h11, limit_log_rates, raise_open_files_limit

    limits = limits or ServerLimits()
    raise_open_files_limit(limits.max_connections)
    _map_big_buffers()
    config = uvicorn.Config(
        create_app(engine, default_topk, limits), host=host, port=port, log_level=log_level,
        # No per-request access log: at thousands of requests a second it costs real time.
        access_log=False,
        http=guarded_h11(limits.max_connections, limits.header_timeout, limits.body_timeout,
                         limits.min_body_rate, limits.body_grace))
    limit_log_rates()  # after uvicorn has configured its loggers
    uvicorn.Server(config).run()
