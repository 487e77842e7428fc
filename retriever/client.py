"""Retrievers the rest of the project calls: over HTTP, or in-process. Same `Doc`s."""

from __future__ import annotations

import threading
import time
from typing import Protocol

import httpx

from retriever.base import Engine
from retriever.doc import Doc
from retriever.engine import open_engine

DEFAULT_URL = "http://127.0.0.1:8000/retrieve"


class RetrieverError(RuntimeError):
    """The retriever could not answer; the message names it and says what to do."""


class Retriever(Protocol):
    def search(self, queries: list[str], topk: int = 3) -> list[list[Doc]]: ...


def doc_from_result(item: dict) -> Doc:
    """One item of a `/retrieve` answer (`{"document": {...}, "score"}` or a bare document)."""
    document = item.get("document", item)
    return Doc(id=str(document.get("id", "")), contents=document["contents"],
               score=float(item.get("score", 0.0)))


class HttpRetriever:
    """A client of any Search-R1 `/retrieve` server (ours, or Search-R1's own)."""

    def __init__(self, url: str = DEFAULT_URL, timeout: float = 30.0, retries: int = 1):
        self.url = url
        self.retries = retries
        self.client = httpx.Client(timeout=timeout)

    def search(self, queries: list[str], topk: int = 3) -> list[list[Doc]]:
        if not queries:
            return []
        payload = {"queries": list(queries), "topk": topk, "return_scores": True}
        for attempt in range(self.retries + 1):
            try:
                response = self.client.post(self.url, json=payload)
                break
            except httpx.HTTPError as err:
                if attempt == self.retries:
                    raise RetrieverError(
                        f"Could not reach the retriever at {self.url} ({type(err).__name__}: "
                        f"{err}). Start one with `python -m retriever serve`, or use the "
                        "in-process retriever (--corpus default)."
                    ) from err
                time.sleep(0.2)
        if response.status_code != 200:
            raise RetrieverError(f"The retriever at {self.url} answered {response.status_code}: "
                                 f"{response.text[:500]}")
        try:
            rows = response.json()["result"]
            return [[doc_from_result(item) for item in row] for row in rows]
        except (ValueError, KeyError, TypeError) as err:
            raise RetrieverError(f"The retriever at {self.url} did not answer in the "
                                 f"Search-R1 format ({err}).") from err

    def close(self) -> None:
        self.client.close()


class LocalRetriever:
    """An engine in this process; opened lazily so that start-up stays fast."""

    def __init__(self, engine: str = "lucene", corpus: str | None = "default",
                 index: str | None = None, opened: Engine | None = None):
        self.spec = {"engine": engine, "corpus": corpus, "index": index}
        self._engine = opened
        # One search at a time: the JVM searcher and the torch encoder are not shared
        # across Python threads (UI sessions each run in their own thread).
        self._lock = threading.Lock()

    @property
    def engine(self) -> Engine:
        with self._lock:
            if self._engine is None:
                self._engine = open_engine(**self.spec)
            return self._engine

    def search(self, queries: list[str], topk: int = 3) -> list[list[Doc]]:
        engine = self.engine
        try:
            with self._lock:
                return engine.search(list(queries), topk)
        except Exception as err:
            raise RetrieverError(f"The in-process {self.spec['engine']} retriever failed: "
                                 f"{err}") from err


def open_retriever(url: str | None = None, corpus: str | None = "default", engine: str = "lucene",
                   index: str | None = None) -> Retriever:
    """The HTTP client when a URL is given, else the in-process engine (opened lazily)."""
    if url:
        return HttpRetriever(url)
    return LocalRetriever(engine=engine, corpus=corpus, index=index)
