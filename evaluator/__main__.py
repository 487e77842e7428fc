"""`python -m evaluator --all` · `python -m evaluator report RUN...` ·
`... report --paired RUN_A RUN_B` · `... show RUN`."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from agent.config import (
    add_agent_flags,
    add_model_flags,
    add_retriever_flags,
    agent_settings,
    env,
    make_backend,
    make_retriever,
    retriever_label,
)
from evaluator.benchmarks import (
    BENCHMARK_NAMES,
    LOCAL_BENCHMARKS,
    DataError,
    load_with_warnings,
    resolve_names,
)
from evaluator.runner import DEFAULT_MAX_CONSECUTIVE_ERRORS


def _at_least(low: int):
    """An argparse type: an integer >= low, else a usage error (exit 2) naming the value."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is below the smallest allowed, {low}")
        return value
    parse.__name__ = f"integer >= {low}"
    return parse


def _run_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m evaluator",
        description="Score a search agent on the Search-R1 benchmarks (exact Search-R1 "
                    "protocol). Subcommands: `report RUN [RUN...]`, `show RUN --dataset D`.")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--all", action="store_true",
                       help="the paper's seven benchmarks (from the Hub or --data-dir)")
    which.add_argument("--datasets",
                       help=f"comma-separated, from {','.join(BENCHMARK_NAMES)}; offline, with "
                            f"no --data-dir: the shipped {', '.join(LOCAL_BENCHMARKS)}")
    pick = parser.add_mutually_exclusive_group()
    pick.add_argument("--limit", type=_at_least(1),
                      help="first N questions (FlashRAG uses 1000); a larger N on an "
                           "existing run grows it")
    pick.add_argument("--sample", type=_at_least(1),
                      help="a random sample of N questions (--seed); a larger N with the "
                           "same seed grows an existing run")
    parser.add_argument("--data-dir", help="local benchmarks: DIR/nq/test.jsonl and so on")
    parser.add_argument("--merged-parquet", help="Search-R1's merged test.parquet")
    parser.add_argument("--batch-size", type=_at_least(1), default=8,
                        help="questions advanced together (transformers; llamacpp: one "
                             "sequence each in one context, at most 8)")
    parser.add_argument("--concurrency", type=_at_least(1), default=32,
                        help="requests in flight (openai backend)")
    parser.add_argument("--output", help="run directory (default runs/<model name>)")
    parser.add_argument("--overwrite", action="store_true",
                        help="discard the run stored in --output (its settings.json, "
                             "<dataset>.jsonl files and summaries; nothing else) when it was "
                             "made with other settings")
    parser.add_argument("--max-consecutive-errors", type=_at_least(0),
                        default=env("LLDS_MAX_CONSECUTIVE_ERRORS",
                                    str(DEFAULT_MAX_CONSECUTIVE_ERRORS)),
                        help="stop after this many questions in a row end in an error, e.g. "
                             "the retriever is down (0: never stop; env "
                             "LLDS_MAX_CONSECUTIVE_ERRORS)")
    parser.add_argument("--paper-retriever", action="store_true",
                        help="state that --retriever-url serves e5-base-v2 over wiki-18, the "
                             "paper's retriever (a server cannot prove it; the run records "
                             "that it was stated)")
    add_model_flags(parser)
    add_retriever_flags(parser)
    add_agent_flags(parser)
    return parser


def _check_agent_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Nonsense agent settings end at parsing (exit 2), not mid-run or as odd numbers."""
    low = {"--topk": (args.topk, 1), "--max-turns": (args.max_turns, 0),
           "--max-new-tokens": (args.max_new_tokens, 1),
           "--max-obs-tokens": (args.max_obs_tokens, 1)}
    for flag, (value, least) in low.items():
        if value < least:
            parser.error(f"argument {flag}: {value} is below the smallest allowed, {least}")
    if args.paper_retriever and not args.retriever_url:
        parser.error("argument --paper-retriever: it states what a --retriever-url server "
                     "serves; an in-process retriever is checked, not stated")
    if args.temperature is not None and not args.temperature >= 0:
        parser.error(f"argument --temperature: {args.temperature} is not >= 0")
    if not 0 < args.top_p <= 1:
        parser.error(f"argument --top-p: {args.top_p} is not in (0, 1]")


def default_output(model: str) -> Path:
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(model.rstrip("/")).name) or "run"
    return Path("runs") / name


def warn_about_damaged_results(run_dir: Path, names: list[str] | None = None) -> None:
    """A warning for each line of a results file that is not a whole record: it is skipped
    (its question runs again on resume) and left in the file as it is."""
    from evaluator.rundir import damaged_lines

    paths = [run_dir / f"{n}.jsonl" for n in names] if names is not None \
        else sorted(run_dir.glob("*.jsonl"))
    for path in paths:
        for number in damaged_lines(path):
            print(f"warning: {path}:{number} is not a whole result record; it is skipped "
                  "(its question counts as not run) and left in the file.", file=sys.stderr)


def cmd_run(argv: list[str]) -> int:
    from evaluator.rundir import (
        RunDirBusy,
        RunDirError,
        check_run_dir,
        hold_run_dir,
        run_settings,
    )

    parser = _run_parser()
    args = parser.parse_args(argv)
    _check_agent_flags(parser, args)
    if not args.all and not args.datasets:
        print("error: say which benchmarks: --all or --datasets nq,hotpotqa", file=sys.stderr)
        return 2
    names = resolve_names(None if args.all else args.datasets.split(","))
    settings = agent_settings(args)
    try:  # all data first: a missing file should not wait for a model to load
        data = {n: load_with_warnings(n, args.data_dir, args.merged_parquet, args.limit,
                                      args.sample, args.seed or 0) for n in names}
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for _, notes in data.values():
        for note in notes:
            print(f"warning: {note}", file=sys.stderr)
    run_dir = Path(args.output) if args.output else default_output(args.model)
    stored = run_settings(args.model, args.backend, retriever_label(args), settings,
                          seed=args.seed or 0, limit=args.limit, sample=args.sample,
                          datasets=names, expected={n: len(q) for n, (q, _) in data.items()})
    try:  # checked before the lock file is made, so a refused directory gains nothing
        check_run_dir(run_dir, stored, overwrite=args.overwrite)
    except RunDirError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        with hold_run_dir(run_dir):
            return _run_held(args, names, data, settings, run_dir, stored)
    except RunDirError as err:  # busy is no usage error: the command works once it is free
        print(f"error: {err}", file=sys.stderr)
        return 1 if isinstance(err, RunDirBusy) else 2


def _run_held(args: argparse.Namespace, names: list[str], data, settings, run_dir: Path,
              stored: dict) -> int:
    """The run, with the run directory's lock held: checked again (another process may have
    changed it before the lock was taken), the retriever and the model opened, then every
    pending question answered."""
    from tqdm import tqdm

    from agent.backends.base import ModelLoadError
    from evaluator.provenance import collect
    from evaluator.report import render_markdown, write_summary
    from evaluator.rundir import (
        RunDirError,
        apply_run_dir,
        check_run_dir,
        finished_ids,
        with_provenance,
    )
    from evaluator.runner import RunStopped, RunWriteError, evaluate
    from retriever.client import RetrieverError

    try:  # changed only once the model has loaded too
        plan = check_run_dir(run_dir, stored, overwrite=args.overwrite)
    except RunDirError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    warn_about_damaged_results(run_dir, [] if args.overwrite else names)
    retriever = make_retriever(args)
    if args.retriever_url:  # one request now, not an error record per question later
        try:
            retriever.search(["health check"], topk=1)
        except RetrieverError as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
    try:
        backend = make_backend(args, concurrency=args.concurrency)
    except ModelLoadError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:  # an in-process engine opens here, as its first search would
        provenance = collect(args, backend, retriever, names)
    except (RetrieverError, OSError, ValueError, RuntimeError, ImportError) as err:
        print(f"error: could not open the retriever: {err}", file=sys.stderr)
        return 2
    apply_run_dir(with_provenance(plan, provenance))
    batch = args.concurrency if args.backend == "openai" else args.batch_size
    stopped: RunStopped | RunWriteError | None = None
    for name, (questions, _) in data.items():
        path = run_dir / f"{name}.jsonl"
        scores: list[float] = []
        bar = tqdm(total=len(questions), desc=name, unit="q", dynamic_ncols=True)
        bar.update(len(finished_ids(path) & {q.id for q in questions}))
        try:
            for record in evaluate(questions, backend, retriever, settings, path, batch,
                                   max_consecutive_errors=args.max_consecutive_errors):
                if record.stop_reason != "error":
                    scores.append(record.metrics["em"])
                bar.update(1)
                if scores:
                    bar.set_postfix(em=f"{sum(scores) / len(scores):.3f}")
        except RunStopped as err:
            stopped = err
            break
        except RunWriteError as err:  # the disk is full: a summary would not fit either
            bar.close()
            print(f"error: {err}", file=sys.stderr)
            return 1
        finally:
            bar.close()
    summary = write_summary(run_dir)
    print(render_markdown(summary), end="")
    print(f"\nresults: {run_dir}/ (summary.md, summary.csv, summary.json, <dataset>.jsonl)")
    if stopped is not None:
        print(f"error: {stopped}", file=sys.stderr)
        return 1
    if not summary["complete"]:
        print(f"error: {summary['note']}", file=sys.stderr)
        return 1
    return 0


def cmd_report(argv: list[str]) -> int:
    from evaluator.compare import compare_runs, paired_report
    from evaluator.report import render_markdown, write_summary

    parser = argparse.ArgumentParser(
        prog="python -m evaluator report",
        description="One run: its summary (rewritten in the run). Several: EM side by side. "
                    "--paired A B: B against A question by question.")
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--paired", action="store_true",
                        help="compare exactly two runs on their common questions: EM of "
                             "each, the difference with its paired SE, the questions only "
                             "one got right, and the exact McNemar p-value")
    args = parser.parse_args(argv)
    if args.paired and len(args.runs) != 2:
        parser.error(f"--paired compares exactly two runs (RUN_A RUN_B); got {len(args.runs)}")
    missing = [r for r in args.runs if not (Path(r) / "settings.json").is_file()]
    if missing:
        print(f"error: not a run directory (no settings.json): {', '.join(missing)}",
              file=sys.stderr)
        return 2
    for run in args.runs:
        warn_about_damaged_results(Path(run))
    try:
        if args.paired:
            print(paired_report(*args.runs), end="")
        elif len(args.runs) == 1:
            print(render_markdown(write_summary(args.runs[0])), end="")
        else:
            print(compare_runs(args.runs), end="")
    except ValueError as err:  # a settings.json or a results line that is not ours
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def cmd_show(argv: list[str]) -> int:
    from evaluator.report import failures, render_failures

    parser = argparse.ArgumentParser(prog="python -m evaluator show")
    parser.add_argument("run")
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--failures", action="store_true",
                        help="only the questions the run got wrong (default: every question)")
    parser.add_argument("--limit", type=int, default=None)
    args = parser.parse_args(argv)
    try:
        items = failures(args.run, args.dataset, wrong_only=args.failures)
    except (KeyError, FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(render_failures(items, limit=args.limit), end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"report": cmd_report, "show": cmd_show}
    if argv and argv[0] in commands:
        return commands[argv[0]](argv[1:])
    return cmd_run(argv)


if __name__ == "__main__":
    sys.exit(main())
