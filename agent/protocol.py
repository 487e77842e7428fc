"""The Search-R1 inference protocol as pure functions: no torch, no I/O.

Every string here is byte-exact to what the LLDS / Search-R1 checkpoints were trained on
(docs/protocol.md says what each one is and why). A model only behaves as published when it
sees exactly these.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# The document format belongs to the retriever; the protocol renders with it.
from retriever.doc import render_documents, split_title

__all__ = ["INSTRUCTION", "INVALID_ACTION_MESSAGE", "PROTOCOL_TAGS", "STOP_STRINGS", "Action",
           "answer_of", "build_prompt", "cut_turn", "extract_answer", "find_stop",
           "normalize_question", "observation", "parse_action", "render_documents",
           "split_title", "user_message"]

INSTRUCTION = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> "
    "first every time you get new information. After reasoning, if you find you lack "
    "some knowledge, you can call a search engine by <search> query </search> and it "
    "will return the top searched results between <information> and </information>. "
    "You can search as many times as your want. If you find no further external "
    "knowledge needed, you can directly provide the answer inside <answer> and "
    "</answer>, without detailed illustrations. For example, <answer> Beijing </answer>. "
    "Question: {question}\n"
)

INVALID_ACTION_MESSAGE = (
    "\nMy previous action is invalid. If I want to search, I should put the query between "
    "<search> and </search>. If I want to give the final answer, I should put the answer "
    "between <answer> and </answer>. Let me try again.\n"
)

# Where generation of a turn may stop before EOS or the budget. Search-R1's rollouts generate
# to EOS and then cut after the first `</search>`, else the first `</answer>`. Stopping at the
# first `</search>` cannot change that outcome (everything after it is cut), so it is the one
# stop string. Stopping at `</answer>` could: a later `</search>` moves the cut past it (`...
# </answer> <search> q </search>` is a search), and a later `<answer>` block before that
# `</search>` changes the scored answer. (Search-R1's infer.py lists `</search>` with an
# optional leading space and trailing newlines as token sequences; matched as text,
# `</search>` alone covers them all.)
STOP_STRINGS = ("</search>",)

# The protocol's tags. A tokenizer may hold some as special tokens (Qwen3-derived ones can
# flag `<think>`); they are the model's text and are never dropped when decoding.
PROTOCOL_TAGS = ("<think>", "</think>", "<search>", "</search>", "<answer>", "</answer>",
                 "<information>", "</information>")

_ACTION_RE = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)
_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def normalize_question(question: str) -> str:
    """Strip the question and make it end with a question mark, as Search-R1 does."""
    question = question.strip()
    if not question.endswith("?"):
        question += "?"
    return question


def user_message(question: str) -> str:
    """The single-line user turn of the Search-R1 prompt (with its trailing newline)."""
    return INSTRUCTION.format(question=normalize_question(question))


def build_prompt(question: str, tokenizer: Any = None) -> str:
    """The full prompt text: the user message, chat-templated when the tokenizer has one."""
    message = user_message(question)
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": message}], add_generation_prompt=True, tokenize=False
        )
    return message


def cut_turn(text: str) -> str:
    """Cut a generated turn after the first `</search>`, else after the first `</answer>`.

    Applied to a turn still being generated, it gives the part that is already certain to
    stay, except that a `</answer>` cut may still grow to a later `</search>`: what a front
    end may show while streaming.
    """
    for tag in ("</search>", "</answer>"):
        end = text.find(tag)
        if end != -1:
            return text[: end + len(tag)]
    return text


def find_stop(text: str, stops: Iterable[str] = STOP_STRINGS) -> int:
    """Index just past the first stop string (`</search>`) in `text`; -1 when none yet.
    `stops` replaces the protocol's stop strings (to measure another rule)."""
    ends = [i + len(tag) for tag in stops if (i := text.find(tag)) != -1]
    return min(ends) if ends else -1


@dataclass(frozen=True)
class Action:
    kind: str  # "search", "answer" or "invalid"
    content: str = ""


def parse_action(text: str) -> Action:
    """The first `<search>` or `<answer>` block of a turn; `invalid` when there is none."""
    match = _ACTION_RE.search(text)
    if match is None:
        return Action("invalid")
    return Action(match.group(1), match.group(2).strip())


def observation(rendered_docs: str) -> str:
    """The text inserted after a search: the documents wrapped in <information> tags."""
    return f"\n\n<information>{rendered_docs.strip()}</information>\n\n"


def extract_answer(text: str) -> str | None:
    """The content of the last `<answer>…</answer>` in one piece of model-written text,
    stripped; None if there is none. Nothing is removed first: see `answer_of`."""
    matches = _ANSWER_RE.findall(text)
    return matches[-1].strip() if matches else None


def answer_of(turns: Iterable[str]) -> str | None:
    """The prediction of a run: the last `<answer>` block found in the model's own turns.

    Each generated turn (as cut) is searched on its own, so a match never spans inserted
    text: an unclosed `<answer>` in one turn never joins a `</answer>` after an observation
    or the invalid-action note. The prompt's `<answer> Beijing </answer>` example, retrieved
    documents and the note are not the model's turns, so their tags never count. Search-R1
    scores the last match over prompt + response instead (README, "Protocol").
    """
    answer = None
    for turn in turns:
        found = extract_answer(turn)
        if found is not None:
            answer = found
    return answer
