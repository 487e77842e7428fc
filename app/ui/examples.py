"""The Ask tab's examples for the nano agent: held-out questions it really answers.

`python -m app.ui.examples [--model nano] [--benchmark assets/naturalqa/test.jsonl] [--n 6]`
runs the model greedily on a held-out benchmark (the agent loop and the evaluator's
scoring, as `python -m evaluator` would) and writes the questions it gets right (exact
match), a few per question family, with how many it got right of how many asked, to
`assets/ask_examples.json`. The default set, naturalqa, is hand-written questions in
everyday wording. The Ask tab shows them when its default model is a nano model, and says
how often the model is right on such questions; re-run this after the nano agent is
retrained.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from agent.models import NANO, ROOT

EXAMPLES_FILE = ROOT / "assets" / "ask_examples.json"
COMPARE_FILE = ROOT / "assets" / "compare_example.json"
BENCHMARK_FILE = ROOT / "assets" / "naturalqa" / "test.jsonl"


def load_examples(path: Path | None = None) -> list[str]:
    """The stored example questions; [] when the file is missing or not ours."""
    path = EXAMPLES_FILE if path is None else path
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return [str(e["question"]) for e in data["examples"] if str(e["question"]).strip()]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def examples_score(path: Path | None = None) -> tuple[int, int] | None:
    """(answered right, asked) on the run that picked the stored examples; None if the
    file does not say."""
    path = EXAMPLES_FILE if path is None else path
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        right, asked = int(data["right"]), int(data["asked"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return (right, asked) if 0 <= right <= asked and asked > 0 else None


def spread(records: list, n: int) -> list:
    """Up to `n` records, taken in turn from each family (shortest questions first), so the
    examples show every kind of question the model answers."""
    by_family: dict[str, list] = {}
    for record, family in records:
        by_family.setdefault(family, []).append(record)
    for family in by_family.values():
        family.sort(key=lambda r: len(r.question))
    chosen: list = []
    while len(chosen) < n and any(by_family.values()):
        for family in sorted(by_family):
            if by_family[family] and len(chosen) < n:
                chosen.append(by_family[family].pop(0))
    return chosen


def pick_examples(backend, retriever, benchmark: Path, n: int = 6, limit: int | None = None,
                  settings=None) -> tuple[list[dict], int, int]:
    """(the chosen examples, questions asked, questions answered right); `settings`: the
    agent's (default: the protocol's, greedy, as the Ask tab runs it)."""
    from agent.events import Finished
    from agent.loop import AgentSettings, run_agent
    from evaluator.benchmarks import question_from_record, read_data_file
    from evaluator.rundir import make_record

    questions = [question_from_record(record, benchmark.parent.name, i, where)
                 for i, (where, record) in enumerate(read_data_file(benchmark))][:limit]
    right = []
    for question in questions:  # one at a time, as the Ask tab runs them
        *_, finished = run_agent(question.question, backend, retriever,
                                 settings or AgentSettings())
        if not isinstance(finished, Finished):  # the loop always ends with one
            continue
        record = make_record(question, finished)
        if record.metrics["em"] == 1.0 and record.searches >= 1:
            right.append((record, str(question.metadata.get("family", ""))))
    families = {r.id: f for r, f in right}
    examples = [{"question": r.question, "answer": r.prediction, "family": families[r.id],
                 "id": r.id} for r in spread(right, n)]
    return examples, len(questions), len(right)


def load_compare_example(pair: tuple[str, str], path: Path | None = None) -> dict | None:
    """The stored Compare question for exactly this (A, B) pair, with what each answered;
    None when the file is missing, not ours, or measured on another pair."""
    path = COMPARE_FILE if path is None else path
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if tuple(data["pair"]) != tuple(pair) or not str(data["question"]).strip():
            return None
        return data
    except (OSError, ValueError, KeyError, TypeError):
        return None


def pick_compare(backends: tuple, retriever, benchmark: Path, settings=None,
                 limit: int | None = None) -> dict:
    """Ask B the benchmark's questions in order, greedy, and A those B answers right, until
    one that B answers right and A does not; what each answered on every question asked
    (A: None where not asked). When there is none, the first B answers right (else the
    first asked)."""
    from agent.events import Finished
    from agent.loop import AgentSettings, run_agent
    from evaluator.benchmarks import question_from_record, read_data_file
    from evaluator.rundir import make_record

    questions = [question_from_record(record, benchmark.parent.name, i, where)
                 for i, (where, record) in enumerate(read_data_file(benchmark))][:limit]
    def ask(backend, question) -> tuple[str | None, int]:
        *_, finished = run_agent(question.question, backend, retriever,
                                 settings or AgentSettings())
        record = make_record(question, finished) if isinstance(finished, Finished) else None
        return (record.prediction, int(record.metrics["em"])) if record else (None, 0)

    # B first, and A only where B is right: A may be a collapsed model that writes to its
    # token limit on every turn, so asking it everything costs minutes a question.
    asked: list[dict] = []
    for question in questions:
        b_answer, b_em = ask(backends[1], question)
        a_answer, a_em = ask(backends[0], question) if b_em else (None, None)
        asked.append({"id": question.id, "question": question.question,
                      "answers": [a_answer, b_answer], "em": [a_em, b_em]})
        if b_em and not a_em:
            break
    chosen = next((r for r in asked if r["em"] == [0, 1]),
                  next((r for r in asked if r["em"][1]), asked[0] if asked else None))
    return {"chosen": chosen, "asked": asked}


def main(argv: list[str] | None = None) -> int:
    from agent.config import (
        BackendOptions,
        add_agent_flags,
        add_retriever_flags,
        agent_settings,
        make_retriever,
    )

    parser = argparse.ArgumentParser(prog="python -m app.ui.examples", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=NANO)
    parser.add_argument("--benchmark", type=Path, default=BENCHMARK_FILE)
    parser.add_argument("--n", type=int, default=6, help="how many examples")
    parser.add_argument("--limit", type=int, help="ask only the first N questions")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"default {EXAMPLES_FILE.name}, or {COMPARE_FILE.name} with "
                             "--compare")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"),
                        help="instead: the Compare tab's default question for this pair, "
                             "the first of --benchmark that B answers right and A does not")
    add_retriever_flags(parser)
    add_agent_flags(parser)
    args = parser.parse_args(argv)
    if not args.benchmark.is_file():
        print(f"error: no benchmark file {args.benchmark}", file=sys.stderr)
        return 2
    if args.compare:
        return write_compare(args, agent_settings(args), make_retriever(args),
                             args.out or COMPARE_FILE)
    args.out = args.out or EXAMPLES_FILE
    backend = BackendOptions(device="cpu").load(args.model)
    examples, asked, right = pick_examples(backend, make_retriever(args), args.benchmark,
                                           args.n, args.limit, agent_settings(args))
    if not examples:
        print(f"error: {args.model} answered none of {asked} questions right; nothing "
              "written.", file=sys.stderr)
        return 1
    benchmark = args.benchmark.resolve()
    payload = {"note": f"Held-out questions {args.model} answers right (greedy, exact "
                       f"match; {right} of {asked}); written by python -m app.ui.examples.",
               "model": args.model, "benchmark": str(benchmark.relative_to(ROOT))
               if benchmark.is_relative_to(ROOT) else str(benchmark),
               "asked": asked, "right": right,
               "examples": examples}
    args.out.write_text(json.dumps(payload, indent=1, ensure_ascii=False) + "\n",
                        encoding="utf-8")
    print(f"{len(examples)} examples ({right} of {asked} answered right) -> {args.out}")
    return 0


def write_compare(args, settings, retriever, out: Path) -> int:
    from agent.config import BackendOptions

    options = BackendOptions(device="cpu")
    pair = tuple(args.compare)
    found = pick_compare(tuple(options.load(m) for m in pair), retriever, args.benchmark,
                         settings, args.limit)
    chosen = found["chosen"]
    if chosen is None:
        print(f"error: no question in {args.benchmark}; nothing written.", file=sys.stderr)
        return 1
    benchmark = args.benchmark.resolve()
    payload = {"note": "The Compare tab's default question for this pair: the first of the "
                       "benchmark (in file order, greedy) that B answers right and A does "
                       "not; B was asked every question in order, A only those B answered "
                       "right (null: not asked). Written by "
                       "python -m app.ui.examples --compare.",
               "pair": list(pair), "benchmark": str(benchmark.relative_to(ROOT))
               if benchmark.is_relative_to(ROOT) else str(benchmark),
               "question": chosen["question"], "id": chosen["id"],
               "answers": chosen["answers"], "em": chosen["em"], "asked": found["asked"]}
    out.write_text(json.dumps(payload, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{chosen['question']!r}: A {chosen['answers'][0]!r} (EM {chosen['em'][0]}), B "
          f"{chosen['answers'][1]!r} (EM {chosen['em'][1]}); {len(found['asked'])} asked "
          f"-> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
