"""A test double: a backend that emits given turns. Lives in tests/ only.

The real-path twin of every test that uses it runs the tiny Qwen2 models in
agent/testing.py through the transformers backend.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from agent import protocol
from agent.backends.base import Sampling, TurnOutput

Script = Sequence[str] | Callable[[str, int], str]
_QUESTION = re.compile(r"Question: (.*)\n$")


def question_of(prompt: str) -> str:
    match = _QUESTION.search(prompt)
    return match.group(1) if match else prompt


class ScriptedBackend:
    """Turn n of every question is `script[n]` (or `script(question, n)`), streamed in
    whitespace-separated pieces, `delay` seconds apart. Tokens are whitespace pieces."""

    name = "scripted"

    def __init__(self, script: Script, delay: float = 0.0, eos_after_last: bool = True):
        self.script = script
        self.delay = delay
        self.eos_after_last = eos_after_last
        self.calls: list[list[str]] = []
        self.windows: list[int | None] = []  # keep_last of each turn
        self.batch_sizes: list[int] = []

    def build_prompt(self, question: str) -> str:
        return protocol.build_prompt(question)

    def count_tokens(self, text: str) -> int:
        return len(re.findall(r"\S+\s*|\s+", text))

    def truncate(self, text: str, max_tokens: int) -> str:
        return "".join(re.findall(r"\S+\s*|\s+", text)[:max_tokens])

    def _turn(self, context: Sequence[str]) -> tuple[str, bool]:
        n = len(context) // 2  # context = [prompt, turn, inserted, turn, inserted, ...]
        question = question_of(context[0])
        if callable(self.script):
            return self.script(question, n), False
        if n >= len(self.script):
            return "", self.eos_after_last
        return self.script[n], False

    def stream(self, context: Sequence[str], max_new_tokens: int, sampling: Sampling,
               cancel: threading.Event | None = None,
               keep_last: int | None = None) -> Iterator[str | TurnOutput]:
        self.calls.append(list(context))
        self.windows.append(keep_last)
        text, eos = self._turn(context)
        pieces = re.findall(r"\S+\s*|\s+", text)
        out = ""
        for n, piece in enumerate(pieces[:max_new_tokens]):
            if cancel is not None and cancel.is_set():
                yield TurnOutput(out, n, "cancelled")
                return
            if self.delay:
                time.sleep(self.delay)
            out += piece
            yield piece
            if (stop := protocol.find_stop(out)) >= 0:  # the text up to it; the loop cuts
                yield TurnOutput(out[:stop], n + 1, "stop")
                return
        finish = "eos" if eos or len(pieces) <= max_new_tokens else "length"
        yield TurnOutput(out, min(len(pieces), max_new_tokens), finish)

    def generate(self, contexts: Sequence[Sequence[str]], max_new_tokens: Sequence[int],
                 sampling: Sampling,
                 keep_last: Sequence[int | None] | None = None) -> list[TurnOutput]:
        self.batch_sizes.append(len(contexts))
        outputs = []
        keep_last = keep_last or [None] * len(contexts)
        for context, budget, keep in zip(contexts, max_new_tokens, keep_last, strict=True):
            *_, last = self.stream(context, budget, sampling, keep_last=keep)
            outputs.append(last)
        return outputs
