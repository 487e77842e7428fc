"""The Search-R1 compatible retrieval server: `POST /retrieve`, `GET /health`.

Concurrent requests are coalesced: whatever arrives while the engine is busy is sent to it
as one batch (pyserini's multi-threaded batch search), on one worker thread. Many clients
then share the engine's batch speed, and no JVM or index object is used from two Python
threads at once. A query the engine cannot take fails alone (`IsolatedSearch`): it gets no
documents and is named in the answer's `errors`, and every other query is answered.
Work for a client that hung up before its turn is skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from concurrent.futures import ThreadPoolExecutor

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field, StrictStr, ValidationError, field_validator

from retriever.doc import Doc
from retriever.engine import Engine

# A Search-R1 training run sends a whole rollout batch in one request (512 prompts x 5
# samples = 2,560 queries); its client reads `result` without checking the status.
MAX_QUERIES = 8192
MAX_QUERY_CHARS = 2000
MAX_TOPK = 100
# What one request body may hold: 8,192 queries of ~2,000 ASCII characters fit; memory
# stays bounded whatever a client sends.
MAX_BODY_MB = 32
log = logging.getLogger("retriever")


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
    """The client disconnected before its request's turn on the engine."""


class Job:
    """One request's queries, waiting for its turn on the engine."""

    __slots__ = ("queries", "topk", "future")

    def __init__(self, queries: list[str], topk: int, future: asyncio.Future):
        self.queries, self.topk, self.future = queries, topk, future


class SearchBatcher:
    """Merges concurrent searches into engine batches, run on a single worker thread."""

    def __init__(self, engine: Engine, max_batch: int = MAX_QUERIES):
        self.engine = engine
        self.max_batch = max_batch
        self.queue: asyncio.Queue[Job] = asyncio.Queue()
        self.held: Job | None = None  # overflowed the last batch: it starts the next one
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="search")
        self.dropped = 0  # requests skipped because their client had gone
        self.failed_queries = 0
        # Engines that isolate bad queries say which failed; any other engine just searches.
        self._search = getattr(engine, "search_reporting", None) or (
            lambda queries, topk: (engine.search(queries, topk), {}))

    async def search(self, queries: list[str], topk: int,
                     request: Request | None = None) -> tuple[list[list[Doc]], dict[int, str]]:
        """Results and {query index: failure} for one request. If the request's client
        disconnects before its turn, the work is dropped and ClientGone raised."""
        if not queries:
            return [], {}
        job = Job(queries, topk, asyncio.get_running_loop().create_future())
        await self.queue.put(job)
        if request is None:
            return await job.future
        watcher = asyncio.create_task(_disconnected(request))
        try:
            await asyncio.wait({job.future, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
        if not job.future.done():
            job.future.cancel()  # the batcher skips it
            raise ClientGone
        return job.future.result()

    def _next_jobs(self, first: Job) -> list[Job]:
        """`first` and the waiting jobs that fit in one batch, skipping abandoned ones."""
        jobs, size = [], 0
        candidate: Job | None = first
        while candidate is not None:
            if candidate.future.done():  # cancelled: its client disconnected
                self.dropped += 1
            elif jobs and size + len(candidate.queries) > self.max_batch:
                self.held = candidate  # would overflow this batch: it starts the next
                break
            else:
                jobs.append(candidate)
                size += len(candidate.queries)
            candidate = None if self.queue.empty() else self.queue.get_nowait()
        return jobs

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            first, self.held = self.held or await self.queue.get(), None
            jobs = self._next_jobs(first)
            if not jobs:
                continue
            queries = [q for job in jobs for q in job.queries]
            topk = max(job.topk for job in jobs)
            try:
                results, failures = await loop.run_in_executor(self.worker, self._search,
                                                               queries, topk)
            except Exception as err:  # the engine itself failed: every waiting request hears
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(err)
                continue
            self.failed_queries += len(failures)
            start = 0
            for job in jobs:
                end = start + len(job.queries)
                if not job.future.done():
                    rows = [row[:job.topk] for row in results[start:end]]
                    mine = {i - start: why for i, why in failures.items() if start <= i < end}
                    job.future.set_result((rows, mine))
                start = end


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


def create_app(engine: Engine, default_topk: int = 3, max_queries: int = MAX_QUERIES,
               max_body_mb: float = MAX_BODY_MB) -> FastAPI:
    batcher = SearchBatcher(engine, max_batch=max(max_queries, MAX_QUERIES))
    max_body = int(max_body_mb * 2**20)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        task = asyncio.create_task(batcher.run())
        yield
        task.cancel()
        batcher.worker.shutdown(wait=False, cancel_futures=True)

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
                "default_topk": default_topk, "max_queries": max_queries,
                "max_body_mb": max_body_mb, "dropped_requests": batcher.dropped,
                "failed_queries": batcher.failed_queries,
                **getattr(engine, "details", {})}

    @app.post("/retrieve", openapi_extra={"requestBody": {"content": {"application/json": {
        "schema": RetrieveRequest.model_json_schema()}}, "required": True}})
    async def retrieve(request: Request):
        try:
            body = await _read_body(request, max_body)
        except BodyTooLarge:
            return JSONResponse(status_code=413, content={
                "detail": f"Bad /retrieve request: the body is larger than the limit of "
                          f"{max_body_mb:g} MiB (start the server with --max-body-mb N to "
                          "raise it, or send fewer queries per request)."})
        try:
            # The standard library's parser: it keeps a lone surrogate ("\ud800"), which
            # the engines drop, where a stricter parser would refuse the whole request.
            payload = json.loads(body)
        except ValueError as err:
            raise RequestValidationError([{"type": "json_invalid", "loc": ("body",),
                                           "msg": "JSON decode error",
                                           "ctx": {"error": str(err)}}]) from None
        try:
            parsed = RetrieveRequest.model_validate(payload)
        except ValidationError as err:
            raise RequestValidationError(err.errors()) from None
        if len(parsed.queries) > max_queries:
            return JSONResponse(status_code=422, content={
                "detail": f"Bad /retrieve request: queries: {len(parsed.queries)} queries; "
                          f"the limit is {max_queries} per request (start the server with "
                          "--max-queries N for bigger batches)."})
        topk = parsed.topk or default_topk
        try:
            results, failures = await batcher.search(parsed.queries, topk, request)
        except ClientGone:
            return Response(status_code=499)  # nobody is listening
        except Exception as err:
            log.exception("the %s engine failed", engine.name)
            return JSONResponse(status_code=500, content={
                "detail": f"The {engine.name} engine failed: {type(err).__name__}: {err}"})
        if parsed.return_scores:
            body = {"result": [[{"document": d.document(), "score": d.score} for d in row]
                               for row in results]}
        else:
            body = {"result": [[d.document() for d in row] for row in results]}
        if failures:
            body["errors"] = [{"query": i, "detail": why} for i, why in sorted(failures.items())]
        # Plain str/float data: orjson directly, skipping FastAPI's generic encoder, which
        # costs more than the search itself for a batch of 100 queries (json.dumps: a third).
        return Response(orjson.dumps(body), media_type="application/json")

    return app


def serve(engine: Engine, host: str = "127.0.0.1", port: int = 8000, default_topk: int = 3,
          max_queries: int = MAX_QUERIES, max_body_mb: float = MAX_BODY_MB,
          log_level: str = "info") -> None:
    import uvicorn

    # No per-request access log: at thousands of requests a second it costs real time.
    uvicorn.run(create_app(engine, default_topk, max_queries, max_body_mb), host=host,
                port=port, log_level=log_level, access_log=False)
