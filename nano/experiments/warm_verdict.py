"""The fifteenth attempt's verdict (issue 43; the rule is in assets/nano-agent/ATTEMPTS.md):
the warm-started agent against its random-weights control and the shipped nano agent.

    python -m nano.experiments.warm_verdict --model shipped=assets/nano-agent \\
        --model warm=nano-run43/warm --model control=nano-run43/control --out nano-run43/eval

Each model answers every question of each set (greedy, top-3 in-process BM25, the
evaluator's batched path, `nano.evaluate.run_batched`); the answers are kept in
OUT/<model>/<set>.jsonl, so a rerun scores only what is missing. Printed: EM ± SE per model
and set, and the paired differences the rule reads (warm − control and warm − shipped, with
the paired SE and the questions right only in each), then the criteria (a)-(c) as they
come out; (d) and (e) come from `python -m benchmarks.nano --limit 60`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SETS = {"fresh": "assets/naturalqa/fresh.jsonl", "vitalqa": "assets/vitalqa/test.jsonl",
        "naturalqa-dev": "assets/naturalqa/dev.jsonl",
        "naturalqa-test": "assets/naturalqa/test.jsonl"}


def read_questions(path: Path) -> list:
    from evaluator.benchmarks import question_from_record

    lines = path.read_text(encoding="utf-8").splitlines()
    return [question_from_record(json.loads(line), path.stem, i)
            for i, line in enumerate(lines) if line.strip()]


def answer_all(model: str, questions: list, out: Path, retriever, batch_size: int = 8) -> dict:
    """question id -> EM for `model` (0/1), answering the questions `out` lacks."""
    from agent.backends.hf import TransformersBackend
    from agent.loop import AgentSettings
    from evaluator.metrics import exact_match
    from nano.evaluate import outcome, run_batched

    done = {}
    if out.is_file():
        for line in out.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            done[record["id"]] = record
    missing = [q for q in questions if q.id not in done]
    if missing:
        backend = TransformersBackend(model, device="cpu")
        out.parent.mkdir(parents=True, exist_ok=True)
        for start in range(0, len(missing), 32):
            chunk = missing[start:start + 32]
            runs = run_batched(chunk, backend, retriever, AgentSettings(), batch_size)
            with out.open("a", encoding="utf-8") as handle:
                for question, run in zip(chunk, runs, strict=True):
                    record = {"id": question.id, "question": question.question,
                              "answer": run.answer, "golden": question.golden_answers,
                              "em": exact_match(run.answer, question.golden_answers),
                              "outcome": outcome(question, run), "searches": run.searches,
                              "stop": run.stop_reason}
                    done[question.id] = record
                    handle.write(json.dumps(record) + "\n")
    return {q.id: int(done[q.id]["em"]) for q in questions}


def main(argv: list[str] | None = None) -> int:
    from evaluator.stats import mean_se, paired
    from retriever.client import open_retriever

    parser = argparse.ArgumentParser(prog="python -m nano.experiments.warm_verdict")
    parser.add_argument("--model", action="append", required=True,
                        help="NAME=DIR (shipped, warm and control are the rule's names)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sets", default=",".join(SETS))
    args = parser.parse_args(argv)
    models = dict(item.split("=", 1) for item in args.model)
    retriever = open_retriever(None, "default", "bm25s", None)
    scores: dict[str, dict[str, dict]] = {}
    for name in args.sets.split(","):
        questions = read_questions(ROOT / SETS[name])
        for model, directory in models.items():
            scores.setdefault(model, {})[name] = answer_all(
                directory, questions, args.out / model / f"{name}.jsonl", retriever)
            em = list(scores[model][name].values())
            print(f"{name:15s} {model:8s} EM {sum(em) / len(em):.3f} ± {mean_se(em):.3f} "
                  f"({sum(em)} of {len(em)})", flush=True)
    for name in args.sets.split(","):
        for a, b in (("control", "warm"), ("shipped", "warm"), ("shipped", "control")):
            if a in scores and b in scores:
                ids = list(scores[a][name])
                result = paired([scores[a][name][i] for i in ids],
                                [scores[b][name][i] for i in ids])
                print(f"{name:15s} {b} - {a}: {result.diff:+.3f} ± {result.diff_se:.3f} "
                      f"(right only in {b} {result.only_b}, only in {a} {result.only_a})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
