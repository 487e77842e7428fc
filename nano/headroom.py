"""`python -m nano headroom`: training questions on which the starting agent has room to learn.

GRPO learns only from groups that disagree. This samples each candidate question several
times with the agent at the rollout settings of `nano rl` (temperature 1, top-p 0.95, the
agent loop with the in-process retriever), measures the share of right answers, and keeps
the questions whose share lies in [--low, --high] (20-60 % by default), for
`python -m nano rl --train-data FILE`.

Candidates are training questions written from the corpus (no held-out vitalqa article, no
article a naturalqa question is answered from, since naturalqa's test split is part of the
held-out pool), a fixed number per family taken in a stable order, or the records of
--questions FILE.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from nano.options import check_bounds, option
from nano.rollout import RolloutOptions

FAMILIES = ("definition", "description", "superlative", "span", "twohop", "read")


@dataclass(frozen=True)
class HeadroomConfig(RolloutOptions):
    model: str = option("assets/nano-agent", "the starting agent (a Qwen2 model directory)")
    out: str = option("", "where the selected questions go (a new .jsonl file); required")
    questions: str = option("", "candidate questions (JSON lines with question and "
                                "golden_answers); default: training questions written from "
                                "the corpus, of --families")
    families: str = option("span,twohop,read", "comma-separated families of the written "
                                               "candidates (" + ", ".join(FAMILIES) + "); "
                                               "not used with --questions")
    candidates: int = option(128, "candidate questions to measure, shared evenly by the "
                                  "families")
    samples: int = option(4, "responses sampled per question")
    low: float = option(0.2, "lowest share of right answers kept")
    high: float = option(0.6, "highest share of right answers kept")
    chunk: int = option(32, "questions per batched rollout")
    seed: int = option(0, "seeds the sampling")
    threads: int = option(2, "torch threads")

    def __post_init__(self) -> None:
        self.check_rollout()
        check_bounds(self, at_least_one=("candidates", "samples", "chunk", "threads"))
        if not 0 <= self.low <= self.high <= 1:
            raise ValueError(f"--low {self.low} and --high {self.high}: they must satisfy "
                             "0 <= low <= high <= 1 (shares of right answers).")
        unknown = [f for f in self.family_list if f not in FAMILIES]
        if unknown or not self.family_list:
            raise ValueError(f"--families {self.families!r}: pick from {', '.join(FAMILIES)} "
                             "(comma-separated).")

    @property
    def family_list(self) -> list[str]:
        return [f.strip() for f in self.families.split(",") if f.strip()]


def check_paths(config: HeadroomConfig) -> None:
    """A ValueError saying what to pass, before anything is loaded or written."""
    if not (Path(config.model) / "config.json").is_file():
        raise ValueError(f"--model {config.model}: no model there (no config.json); pass a "
                         "Qwen2 model directory, e.g. assets/nano-agent.")
    if not config.out:
        raise ValueError("--out is required: a new .jsonl file for the selected questions.")
    out = Path(config.out)
    if out.suffix != ".jsonl":
        raise ValueError(f"--out {out}: name a .jsonl file (`nano rl --train-data` reads "
                         "JSON lines).")
    if out.exists():
        raise ValueError(f"--out {out} exists; it is never overwritten: choose another "
                         "name or move it away.")
    if config.questions and not Path(config.questions).is_file():
        raise ValueError(f"--questions {config.questions}: no such file; pass a JSON-lines "
                         "file whose records have question and golden_answers.")


def written_candidates(config: HeadroomConfig) -> list:
    """Training questions of the chosen families, --candidates in all, the same share of
    each family (taken in a stable hashed order), as evaluator Questions."""
    from evaluator.benchmarks import local_benchmark_file
    from nano.data import benchmark_question, benchmark_support, build_questions
    from nano.questions import stable_int
    from retriever.corpus import load_records, resolve_corpus

    support = benchmark_support(local_benchmark_file("naturalqa").parent)
    train, _ = build_questions(load_records(resolve_corpus(config.corpus)), 1, exclude=support)
    families = config.family_list
    out = []
    for n, family in enumerate(families):
        share = config.candidates // len(families) + (n < config.candidates % len(families))
        pool = sorted((q for q in train if q.family == family),
                      key=lambda q: stable_int("headroom:" + q.id))
        out.extend(benchmark_question(q) for q in pool[:share])
    return out


def file_candidates(config: HeadroomConfig) -> list:
    """The first --candidates records of --questions (--families does not apply)."""
    from nano.rl import read_questions

    return read_questions(config.questions)[:config.candidates]


def select(questions: list, rewards: list[float], config: HeadroomConfig) -> list[dict]:
    """The records of the questions whose share of right answers is in [low, high]."""
    out = []
    for question, reward in zip(questions, rewards, strict=True):
        if config.low <= reward <= config.high:
            metadata = {**question.metadata, "headroom_reward": reward,
                        "headroom_samples": config.samples}
            out.append({"id": question.id, "question": question.question,
                        "golden_answers": list(question.golden_answers),
                        "metadata": metadata})
    return out


def measure(config: HeadroomConfig) -> dict:
    """Sample, select, write --out; returns the counts per family."""
    import torch
    from tqdm import tqdm

    from agent.backends.hf import TransformersBackend
    from nano.rollout import TimedRetriever, rollout, rollout_settings
    from retriever.client import LocalRetriever

    questions = file_candidates(config) if config.questions else written_candidates(config)
    if not questions:
        raise ValueError("no candidate questions: check --questions and --families.")
    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    backend = TransformersBackend(config.model, device="cpu", dtype="float32")
    retriever = TimedRetriever(LocalRetriever(engine=config.engine, corpus=config.corpus))
    settings = rollout_settings(config)
    started = time.perf_counter()
    rewards: list[float] = []
    with tqdm(total=len(questions), desc="headroom", unit="question") as bar:
        for start in range(0, len(questions), config.chunk):
            chunk = questions[start:start + config.chunk]
            samples = rollout(backend, retriever, chunk, config.samples, settings)
            for n in range(len(chunk)):
                group = [s.reward for s in samples if s.group == n]
                rewards.append(sum(group) / len(group))
            bar.update(len(chunk))
    selected = select(questions, rewards, config)
    out = Path(config.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in selected),
                   encoding="utf-8")
    tmp.replace(out)
    family = [q.metadata.get("family", "-") for q in questions]
    by_family: dict[str, Counter] = {}
    for name, reward in zip(family, rewards, strict=True):
        by_family.setdefault(name, Counter())[reward] += 1
    return {"seconds": time.perf_counter() - started, "measured": dict(Counter(family)),
            "selected": dict(Counter(r["metadata"].get("family", "-") for r in selected)),
            "rewards": {name: dict(sorted(counts.items()))
                        for name, counts in by_family.items()},
            "mean_reward": sum(rewards) / len(rewards)}


def report(summary: dict, config: HeadroomConfig) -> str:
    """One paragraph: how many qualified of how many, per family, and the reward spread."""
    measured, selected = summary["measured"], summary["selected"]
    per_family = ", ".join(f"{f} {selected.get(f, 0)}/{n}" for f, n in measured.items())
    spread = "; ".join(f"{f} " + ", ".join(f"{r:.2f}: {n}" for r, n in counts.items())
                       for f, counts in summary["rewards"].items())
    return (f"{sum(selected.values())} of {sum(measured.values())} questions have a share "
            f"of right answers in [{config.low:g}, {config.high:g}] over {config.samples} "
            f"samples ({per_family}); mean share {summary['mean_reward']:.3f}; questions per "
            f"share: {spread}; {summary['seconds']:.0f} s. Written to {config.out}.")
