"""Write the question files the nano RL runs used, from the nano package's question builder.

    python -m nano.experiments.make_questions OUT_DIR

(from the checkout: it reads assets/vitalqa).

train.jsonl: one phrasing of every question about a training-split article (no vitalqa
article), in a stable shuffled order. val.jsonl: every 6th record of
assets/vitalqa/test.jsonl (63 questions; the preliminary runs validated on its first 16 or
32, which are definition and description questions only). val_sample.jsonl: the fixed
sample of 48 spread over all families that `nano.evaluate.vitalqa(limit=48)` draws
(the main runs validate on all of it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(out: Path) -> None:
    from nano.data import build_questions
    from nano.questions import stable_int
    from retriever.corpus import load_records, resolve_corpus

    out.mkdir(parents=True, exist_ok=True)
    train, _ = build_questions(load_records(resolve_corpus("default")), 1)
    train.sort(key=lambda q: stable_int("rl:" + q.id))
    with (out / "train.jsonl").open("w", encoding="utf-8") as handle:
        for q in train:
            handle.write(json.dumps({"id": q.id, "question": q.question,
                                     "golden_answers": list(q.answers),
                                     "metadata": {"family": q.family}}) + "\n")
    bench = Path("assets/vitalqa/test.jsonl").read_text(encoding="utf-8").splitlines()
    (out / "val.jsonl").write_text("".join(line + "\n" for line in bench[::6]),
                                   encoding="utf-8")
    from nano.data import as_record
    from nano.evaluate import vitalqa

    sample = vitalqa(limit=48)
    (out / "val_sample.jsonl").write_text("".join(json.dumps(as_record(q)) + "\n"
                                                  for q in sample), encoding="utf-8")
    print(f"{len(train)} training questions, {len(bench[::6])} + {len(sample)} validation "
          f"questions in {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
