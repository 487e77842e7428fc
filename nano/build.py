"""`python -m nano data`: tokenizer, training trajectories and the vitalqa benchmark files."""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from agent.loop import AgentSettings
from nano.data import (
    benchmark_path,
    benchmark_question,
    benchmark_questions,
    benchmark_support,
    build_questions,
    read_human,
    write_benchmark,
)
from nano.options import option
from nano.questions import TITLE_FAMILIES, GeneratedQuestion
from nano.teacher import trajectories
from nano.tokenizer import build_tokenizer
from retriever.client import LocalRetriever
from retriever.corpus import load_records, resolve_corpus

HUMAN_QUESTIONS = Path(__file__).with_name("vitalqa_human.jsonl")
# Training copies (phrasings) per question family: the span and two-hop families are rarer
# in the corpus and harder to learn, so they get more phrasings.
COPIES = {"definition": 2, "description": 2, "superlative": 3, "span": 3, "twohop": 3, "read": 5}
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class DataConfig:
    out: Path = option(Path("nano-data"), "directory for tokenizer/ and train.jsonl")
    benchmark: Path | None = option(None, "write the vitalqa benchmark under DIR too (the "
                                          "shipped copy: assets)", flag="--benchmark-dir")
    corpus: str = option("default", "the corpus the questions and documents come from")
    engine: str = option("bm25", "retrieval engine the teacher searches with")
    vocab_size: int = option(4096, "BPE vocabulary size")
    tokenizer: Path | None = option(None, "use the tokenizer saved in DIR (a model's, to "
                                          "fine-tune it) instead of training one")
    exclude_support: Path | None = option(
        ROOT / "assets" / "naturalqa", "no training question about an article that a "
        "question in DIR/*.jsonl is answered from (metadata.support)")
    title_share: float = option(0.4, "at most this share of the training mix has the title "
                                     "as its answer (definition and description runs)")
    read_copies: int = option(COPIES["read"], "phrasings of each stated relation in the read "
                                               "family (its cloze sentences stay at one)")
    limit: int | None = option(None, "at most this many training questions")
    quote_evidence: bool = option(False, "the think before a span answer quotes the words "
                                         "that lead to it in the document")
    trajectories: bool = option(True, "write the training trajectories (--no-trajectories: "
                                      "only the tokenizer and the benchmark file)")

    def __post_init__(self) -> None:
        if self.vocab_size < 512:
            raise ValueError(f"--vocab-size is {self.vocab_size}; give at least 512 (the "
                             "byte alphabet, the special tokens and merges).")
        if self.read_copies < 1:
            raise ValueError(f"--read-copies is {self.read_copies}; give at least 1.")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"--limit is {self.limit}; give at least 1 (or leave it out).")
        if not 0 < self.title_share < 1:
            raise ValueError(f"--title-share is {self.title_share}; give a fraction between "
                             "0 and 1.")
        if self.tokenizer is not None and not (self.tokenizer / "tokenizer.json").is_file():
            raise ValueError(f"--tokenizer {self.tokenizer}: no tokenizer.json there; pass a "
                             "model or tokenizer directory.")
        if self.exclude_support is not None and not self.exclude_support.is_dir():
            raise ValueError(f"--exclude-support {self.exclude_support} is not a directory; "
                             "pass the folder of a benchmark's .jsonl files.")
        if self.out.exists() and not self.out.is_dir():
            raise ValueError(f"--out {self.out} is a file; pass a directory.")


def training_selection(train: list[GeneratedQuestion], limit: int | None = None,
                       copies: dict[str, int] | None = None) -> list[GeneratedQuestion]:
    """Questions kept for training: `copies` (default COPIES) phrasings per family, in a
    stable mixed order."""
    from nano.questions import stable_int

    copies = copies or COPIES
    keep = [q for q in train if int(q.id.rsplit("-", 1)[1]) < copies[q.family]]
    keep.sort(key=lambda q: stable_int("order:" + q.id))
    return keep[:limit] if limit else keep


def build_data(config: DataConfig, log=print) -> dict:
    from tqdm import tqdm

    start = time.perf_counter()
    records = load_records(resolve_corpus(config.corpus))
    config.out.mkdir(parents=True, exist_ok=True)
    if config.tokenizer is not None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(config.tokenizer))
    else:
        tokenizer = build_tokenizer(records, config.vocab_size)
    tokenizer.save_pretrained(str(config.out / "tokenizer"))
    excluded = (benchmark_support(config.exclude_support) if config.exclude_support
                else frozenset())
    copies = {**COPIES, "read": config.read_copies}
    train, held = build_questions(records, max(copies.values()), excluded)
    summary: dict = {"articles": len(records), "excluded_articles": len(excluded)}
    if config.benchmark is not None:
        questions = [benchmark_question(q) for q in benchmark_questions(held)]
        path = benchmark_path(config.benchmark)
        summary["benchmark"] = dict(write_benchmark(questions + read_human(HUMAN_QUESTIONS),
                                                    path))
        log(f"wrote {path}: {summary['benchmark']}")
    if not config.trajectories:
        return summary
    selected = training_selection(train, config.limit, copies)
    retriever = LocalRetriever(engine=config.engine, corpus=config.corpus)
    families: Counter = Counter()
    searches: Counter = Counter()
    tmp = config.out / "train.jsonl.tmp"
    with tmp.open("w", encoding="utf-8") as out, tqdm(total=len(selected),
                                                       desc="trajectories") as bar:
        for record in trajectories(selected, tokenizer, retriever, AgentSettings(),
                                   progress=bar, quote=config.quote_evidence):
            families[record["family"]] += 1
            searches[record["searches"]] += 1
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
    tmp.replace(config.out / "train.jsonl")
    mixed = write_mix(config.out / "train.jsonl", config.out / "train_mix.jsonl",
                      title_share=config.title_share)
    summary.update(questions=len(selected), trajectories=dict(families),
                   searches=dict(searches), mix=mixed,
                   seconds=round(time.perf_counter() - start, 1))
    (config.out / "data_summary.json").write_text(json.dumps(summary, indent=1))
    log(f"wrote {config.out / 'train.jsonl'}: {summary}")
    return summary


def write_mix(source: Path, target: Path, title_share: float = 0.4, seed: int = 0) -> dict:
    """The training mix: every run whose answer is a span (span, two-hop, read), and title
    runs up to `title_share` of the whole: superlatives first (the rarest, and asked as people
    ask), then description, then definition (the most common and easiest family); shuffled.
    Returns the count per family."""
    import random

    by_family: dict[str, list[str]] = {}
    with source.open(encoding="utf-8") as lines:
        for line in lines:
            by_family.setdefault(json.loads(line)["family"], []).append(line)
    keep = [line for family, runs in by_family.items() if family not in TITLE_FAMILIES
            for line in runs]
    budget = int(title_share / (1 - title_share) * len(keep))
    counts = Counter({family: len(runs) for family, runs in by_family.items()
                      if family not in TITLE_FAMILIES})
    superlatives = by_family.get("superlative", [])[:budget]
    budget -= len(superlatives)
    descriptions = by_family.get("description", [])[:budget // 2]
    definitions = by_family.get("definition", [])[:budget - len(descriptions)]
    counts.update(superlative=len(superlatives), description=len(descriptions),
                  definition=len(definitions))
    keep += superlatives + descriptions + definitions
    random.Random(seed).shuffle(keep)
    target.write_text("".join(keep), encoding="utf-8")
    return dict(+counts)  # families with no run left out
