"""What every engine is: `search(queries, topk) -> list[list[Doc]]`, and the base class
that isolates bad queries (`IsolatedSearch`).

A query the engine cannot take costs only its own result, never the batch it was merged
into. Engines search in batches (the server merges concurrent clients; the evaluator sends a
rollout batch), so without this one malformed query would fail every other query, and a
resumed run would fail the same batch again.
"""

from __future__ import annotations

import logging
import re
from typing import Protocol

from retriever.doc import Doc

log = logging.getLogger("retriever")

# Lone UTF-16 surrogates: a well-formed str never holds them, but JSON's "\ud800" escape
# decodes to one, and neither the JVM bridge nor the tokenizers can encode them.
_SURROGATES = re.compile("[\ud800-\udfff]")
# A query that still fails after a batch failed is searched again alone; this query, which
# every healthy engine can answer, tells a broken engine from a bad query.
_PROBE = "wikipedia"


class Engine(Protocol):
    name: str
    num_docs: int

    def search(self, queries: list[str], topk: int) -> list[list[Doc]]: ...


def clean_query(query: str) -> str:
    """The query without what no engine can encode (lone surrogates)."""
    return _SURROGATES.sub("", query) if _SURROGATES.search(query) else query


class IsolatedSearch:
    """`search` for engines that implement `search_batch`: cleans each query, and when a
    batch fails, splits it in halves until the failing queries stand alone. A failed query
    gets an empty result and a logged reason. When the engine cannot answer even a probe
    query it is broken, not fed a bad query: that error is raised."""

    name: str

    def search_batch(self, queries: list[str], topk: int) -> list[list[Doc]]:
        raise NotImplementedError

    def search(self, queries: list[str], topk: int) -> list[list[Doc]]:
        return self.search_reporting(queries, topk)[0]

    def search_reporting(self, queries: list[str],
                         topk: int) -> tuple[list[list[Doc]], dict[int, str]]:
        """Results in query order, and {query index: why it failed} for failed queries."""
        cleaned = [clean_query(q) for q in queries]
        try:
            return self.search_batch(cleaned, topk), {}
        except Exception as batch_error:
            err = batch_error
            try:
                self.search_batch([_PROBE], 1)
            except Exception:
                raise err from None
        results: list[list[Doc]] = [[] for _ in cleaned]
        failures: dict[int, str] = {}
        if len(cleaned) == 1:
            failures[0] = _reason(err)
        else:
            self._search_halves(cleaned, 0, topk, results, failures)
        for i, why in failures.items():
            log.warning("%s engine: query %d failed and got no documents (%s): %s",
                        self.name, i, why, ascii(queries[i][:200]))
        return results, failures

    def _search_halves(self, queries: list[str], offset: int, topk: int,
                       results: list[list[Doc]], failures: dict[int, str]) -> None:
        """Search the halves of a failed batch (two or more queries), recursing into a
        failed half until each failing query stands alone."""
        half = len(queries) // 2
        for part, start in ((queries[:half], offset), (queries[half:], offset + half)):
            try:
                results[start:start + len(part)] = self.search_batch(part, topk)
            except Exception as err:
                if len(part) == 1:
                    failures[start] = _reason(err)
                else:
                    self._search_halves(part, start, topk, results, failures)


def _reason(err: Exception) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0][:300] if text else 'no message'}"
