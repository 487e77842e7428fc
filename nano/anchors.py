"""The anchor set: correct trajectories sampled once from the starting policy and kept fixed,
whose mean per-token log-likelihood under the current policy is the direct measure of
likelihood displacement (it falls when training pushes good responses down).

The set is a JSON-lines file in the run directory (`anchors.jsonl`), written once and read
on every resume, so a run measures the same trajectories from its first step to its last.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

from nano.rollout import Sample

FILE = "anchors.jsonl"
SEED = 12345  # the anchor draw's own seed: every run from one start and question file shares it
CHUNK = 32  # questions per batched rollout while sampling
ROUNDS = 4  # times a question set too small for the size asked is gone through


class AnchorError(ValueError):
    """An anchor file or draw that cannot be used; the message says what to do."""


def draw(backend, retriever, questions: Sequence, size: int, settings) -> list[tuple]:
    """Up to `size` (question, sample) pairs with reward 1, sampled with `backend` one
    response per question, the questions in a fixed shuffled order; a small question set is
    gone through again (at most ROUNDS times) until `size` are found. The torch and Python
    random states are left as found, so a run samples the same training batches with or
    without an anchor set."""
    import torch

    from nano.rollout import rollout

    order = random.Random(SEED).sample(list(questions), len(questions))
    kept: list[tuple] = []
    python_state = random.getstate()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        for _ in range(ROUNDS):
            for start in range(0, len(order), CHUNK):
                chunk = order[start:start + CHUNK]
                for sample in rollout(backend, retriever, chunk, 1, settings):
                    if sample.reward == 1 and sum(sample.mask):
                        kept.append((chunk[sample.group], sample))
                if len(kept) >= size:
                    break
            if len(kept) >= size:
                break
    random.setstate(python_state)
    return kept[:size]


def write(path: Path, anchors: Sequence[tuple], decode) -> None:
    """The anchor set as JSON lines (ids for the measure, text for a reader), written to a
    temporary name and renamed, so the file is whole or absent."""
    lines = []
    for question, s in anchors:
        lines.append(json.dumps({
            "id": question.id, "question": question.question,
            "golden_answers": list(question.golden_answers), "prediction": s.prediction,
            "response": decode(s.response_ids), "prompt_ids": s.prompt_ids,
            "response_ids": s.response_ids, "mask": s.mask, "answer_span": s.answer_span,
            "searches": s.searches}, ensure_ascii=False) + "\n")
    tmp = path.with_name(path.name + ".part")
    tmp.write_text("".join(lines), encoding="utf-8")
    tmp.replace(path)


def read(path: Path) -> list[Sample]:
    """The samples of an anchor file; an AnchorError naming the line when one is malformed."""
    samples = []
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise AnchorError(f"{path}: cannot read the anchor set ({error.strerror}); pass an "
                          f"{FILE} that an earlier `nano rl` run wrote.") from None
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            prompt, response, mask = (record["prompt_ids"], record["response_ids"],
                                      record["mask"])
            span = record.get("answer_span", [0] * len(response))
            ok = (len(response) == len(mask) == len(span) and prompt and any(mask)
                  and all(isinstance(t, int) and t >= 0 for t in prompt + response))
        except (ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            raise AnchorError(f"{path}:{n}: not an anchor record (prompt_ids, response_ids "
                              "and a mask of the same length with a generated token); pass "
                              f"an {FILE} that an earlier `nano rl` run wrote.")
        samples.append(Sample(n - 1, 1.0, prompt, response, mask, span,
                              int(record.get("searches", 0)), record.get("prediction")))
    if not samples:
        raise AnchorError(f"{path} holds no anchor trajectories; pass an {FILE} that an "
                          "earlier `nano rl` run wrote, or drop the flag to sample a set.")
    return samples


def check_tokens(samples: Sequence[Sample], vocab_size: int, path: Path) -> None:
    """An AnchorError when the set's token ids do not fit the model's vocabulary (a set made
    with another tokenizer)."""
    top = max(max(s.prompt_ids + s.response_ids) for s in samples)
    if top >= vocab_size:
        raise AnchorError(f"{path}: token id {top} is outside the model's vocabulary "
                          f"({vocab_size}); the set was made with another tokenizer. Use an "
                          "anchor set sampled from this model, or drop --anchors.")


def mean_log_prob(log_probs: Sequence, samples: Sequence[Sample]) -> float:
    """Mean per-token log-prob over the generated tokens of all samples (`log_probs` as
    `batched_log_probs` returns them: zeros on observation tokens)."""
    total = sum(float(lp.sum()) for lp in log_probs)
    tokens = sum(sum(s.mask) for s in samples)
    return total / tokens
