"""From questions to training samples: rollouts through the project's agent loop, the EM
reward on the model's own text, and token ids with the state mask.

The agent loop (`run_agent_batch`) is the only place that knows the Search-R1 format; this
module turns each `Finished` into ids by tokenising its segments one by one (as Search-R1
builds rollouts) and marks the generated ones, so observations never enter the loss.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

from agent.loop import AgentSettings, run_agent_batch
from evaluator.benchmarks import Question
from evaluator.metrics import exact_match
from nano.options import check_bounds, option

_ANSWER_SPAN_RE = re.compile(r"<answer>.*?</answer>", re.DOTALL)


@dataclass(frozen=True)
class RolloutOptions:
    """The rollout fields `nano rl` and `nano headroom` share: the headroom of a question
    means something for RL only when it is measured with the rollouts RL will make."""

    top_p: float = option(0.95, "nucleus sampling in rollouts")
    temperature: float = option(1.0, "sampling temperature in rollouts")
    max_turns: int = option(3, "search rounds per rollout")
    max_new_tokens: int = option(500, "tokens per generated turn")
    max_obs_tokens: int = option(500, "an observation is cut at this many tokens")
    max_context_tokens: int = option(4096, "a rollout stops at this context length")
    engine: str = option("bm25s", "retrieval engine")
    corpus: str = option("default", "retrieval corpus")

    def check_rollout(self) -> None:
        """Rollout values that cannot run, refused with what to pass instead."""
        check_bounds(self, at_least_one=("max_new_tokens", "max_obs_tokens",
                                         "max_context_tokens"),
                     not_negative=("max_turns",))
        if not self.temperature > 0:
            raise ValueError(f"--temperature is {self.temperature}; it must be above 0.")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"--top-p is {self.top_p}; it must be in (0, 1].")


def rollout_settings(config: RolloutOptions, greedy: bool = False) -> AgentSettings:
    """The agent's settings from a config with the rollout fields (`nano rl`, `nano
    headroom`): sampled at its temperature and top-p, or greedy (validation)."""
    sampling = {} if greedy else {"temperature": config.temperature, "top_p": config.top_p}
    return AgentSettings(max_turns=config.max_turns, max_new_tokens=config.max_new_tokens,
                         max_obs_tokens=config.max_obs_tokens,
                         max_context_tokens=config.max_context_tokens, greedy=greedy,
                         **sampling)


@dataclass
class Sample:
    """One response to one question, tokenised for training."""

    group: int  # index of its question in the step's batch: GRPO groups by it
    reward: float
    prompt_ids: list[int]
    response_ids: list[int]
    mask: list[int]  # 1 on tokens the model generated
    answer_span: list[int]  # 1 on the tokens of the final <answer>...</answer>
    searches: int
    prediction: str | None


class TimedRetriever:
    """Wraps a retriever and adds up the seconds its searches take."""

    def __init__(self, retriever):
        self.retriever = retriever
        self.seconds = 0.0

    def search(self, queries: list[str], topk: int = 3):
        start = time.perf_counter()
        try:
            return self.retriever.search(queries, topk)
        finally:
            self.seconds += time.perf_counter() - start


def _answer_span_mask(tokenizer, text: str, ids: list[int]) -> list[int]:
    """1 on the tokens overlapping the turn's last <answer>...</answer>."""
    spans = list(_ANSWER_SPAN_RE.finditer(text))
    if not spans or not getattr(tokenizer, "is_fast", False):
        return [0] * len(ids)
    start, end = spans[-1].span()
    offsets = tokenizer(text, add_special_tokens=False,
                        return_offsets_mapping=True)["offset_mapping"]
    if len(offsets) != len(ids):
        return [0] * len(ids)
    return [int(a < end and b > start) for a, b in offsets]


def encode(backend, finished, group: int, reward: float) -> Sample:
    """Token ids of prompt and response, segment by segment, with the masks."""
    segments = finished.segments
    prompt_ids = backend.context_ids([segments[0].text])
    response_ids: list[int] = []
    mask: list[int] = []
    span: list[int] = []
    last_generated = max((i for i, s in enumerate(segments) if s.generated), default=-1)
    for i, segment in enumerate(segments[1:], start=1):
        ids = backend.context_ids([segment.text])
        response_ids += ids
        mask += [int(segment.generated)] * len(ids)
        span += (_answer_span_mask(backend.tokenizer, segment.text, ids)
                 if i == last_generated else [0] * len(ids))
    return Sample(group, reward, prompt_ids, response_ids, mask, span, finished.searches,
                  finished.answer)


def rollout(backend, retriever: TimedRetriever, questions: Sequence[Question], n: int,
            settings: AgentSettings) -> list[Sample]:
    """n responses per question, all in one batched agent run; samples in group order."""
    if hasattr(backend, "forget_cache"):  # the weights changed since the last batch
        backend.forget_cache()
    asked = [q.question for q in questions for _ in range(n)]
    finished: list = [None] * len(asked)
    for index, result in run_agent_batch(asked, backend, retriever, settings):
        finished[index] = result
    samples = []
    for index, result in enumerate(finished):
        if result.stop_reason == "error":
            raise RuntimeError(f"A rollout failed: {result.error}")
        question = questions[index // n]
        # The agent computes the prediction once, from the model's own turns (Finished.answer).
        reward = float(exact_match(result.answer, question.golden_answers))
        samples.append(encode(backend, result, index // n, reward))
    return samples
