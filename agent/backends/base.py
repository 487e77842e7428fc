"""The one small interface every model backend implements."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from agent import protocol


@dataclass(frozen=True)
class Sampling:
    greedy: bool = True
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None


@dataclass(frozen=True)
class TurnOutput:
    text: str  # generated text up to EOS, closing tag included when a stop string fired
    new_tokens: int  # tokens generated (EOS included), also those the loop then cuts off
    finish: str  # "stop" (the stop string `</search>`), "eos", "length" or "cancelled"


class ModelLoadError(RuntimeError):
    """A model that cannot be loaded; the message says why and what to do."""


class Backend(Protocol):
    """Generates one turn of the Search-R1 loop.

    A context is a list of text segments: the templated prompt, then alternately generated
    turns and inserted text (observations, invalid-action notes). Segments are tokenized one
    by one and concatenated, as Search-R1 builds its rollouts.
    """

    name: str

    def build_prompt(self, question: str) -> str: ...

    def count_tokens(self, text: str) -> int: ...

    def truncate(self, text: str, max_tokens: int) -> str: ...

    def stream(self, context: Sequence[str], max_new_tokens: int, sampling: Sampling,
               cancel: threading.Event | None = None,
               keep_last: int | None = None) -> Iterator[str | TurnOutput]:
        """Yield text deltas of one turn, then one TurnOutput.

        Generation stops at EOS, the budget or `protocol.STOP_STRINGS`, never elsewhere.
        `keep_last`: feed the model only the last that many tokens of the context
        (Search-R1's rolling window); the loop passes it only when the context is longer.
        """
        ...

    def generate(self, contexts: Sequence[Sequence[str]], max_new_tokens: Sequence[int],
                 sampling: Sampling,
                 keep_last: Sequence[int | None] | None = None) -> list[TurnOutput]:
        """One turn for each context, together (batched or concurrent); `keep_last` per
        context as in `stream`."""
        ...


class TokenizerText:
    """The text side of a Backend over a Hugging Face tokenizer (`self.tokenizer`): one copy,
    so a teacher that writes training data truncates exactly as inference does. Without a
    tokenizer (None), a token is estimated at `CHARS_PER_TOKEN` characters."""

    tokenizer: Any
    CHARS_PER_TOKEN = 4

    def build_prompt(self, question: str) -> str:
        return protocol.build_prompt(question, self.tokenizer)

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def count_tokens(self, text: str) -> int:
        if self.tokenizer is None:
            return -(-len(text) // self.CHARS_PER_TOKEN)
        return len(self._encode(text))

    def truncate(self, text: str, max_tokens: int) -> str:
        if self.tokenizer is None:
            return text[:max_tokens * self.CHARS_PER_TOKEN]
        ids = self._encode(text)
        return text if len(ids) <= max_tokens else self.tokenizer.decode(ids[:max_tokens])
