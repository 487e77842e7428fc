"""python -m curves PATH... [--label NAME=GRPO|LLDS] [--seed-band minmax|se] [--out report.html]

Prints the summary table, writes a self-contained HTML report, and exits non-zero (with a
message on stderr, never a traceback) when any file could not be read.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd


def _parse_labels(items: list[str], parser: argparse.ArgumentParser) -> dict[str, str]:
    labels = {}
    for item in items:
        name, sep, method = item.rpartition("=")
        if not sep or not name or method.strip().upper() not in ("GRPO", "LLDS"):
            parser.error(f"--label wants NAME=GRPO or NAME=LLDS, got {item!r}")
        labels[name] = method.strip().upper()
    return labels


def main(argv: list[str] | None = None, prog: str = "python -m curves") -> int:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Check GRPO / LLDS training logs for Lazy Likelihood Displacement.")
    parser.add_argument("files", nargs="+", metavar="PATH",
                        help="verl console log, W&B parquet/CSV export or history JSON lines, "
                             "CSV, TensorBoard event file or logdir, W&B run folder or .wandb "
                             "file, MLflow mlruns/ folder, TRL trainer_state.json or a folder "
                             "(output or checkpoint) holding one")
    parser.add_argument("--label", action="append", default=[], metavar="NAME=GRPO|LLDS",
                        help="override the method guessed from a run's name (repeatable)")
    parser.add_argument("--out", default="curves_report.html", help="HTML report path")
    parser.add_argument("--smoothing", type=float, default=0.6, help="EMA weight, 0 to 0.99")
    parser.add_argument("--no-annotate", action="store_true", help="no phase shading")
    parser.add_argument("--metric", action="append", default=[], metavar="KEY",
                        help="also plot this raw key (repeatable)")
    parser.add_argument("--seed-band", choices=("minmax", "se"),
                        help="draw runs that differ only by seed (grpo-seed0, grpo-seed1, or "
                             "a seed in their config) as their mean with a band: minmax = "
                             "lowest to highest run, se = mean ± 1 standard error")
    args = parser.parse_args(argv)
    labels = _parse_labels(args.label, parser)
    if not 0 <= args.smoothing < 1:
        parser.error("--smoothing must be in [0, 1)")

    from curves import analyze_uploads
    from curves.report import write_report

    result = analyze_uploads(args.files, labels=labels, smoothing=args.smoothing,
                             annotate=not args.no_annotate, metrics=args.metric,
                             band=args.seed_band)
    for message in result.messages:
        if message.level != "info":
            print(message, file=sys.stderr)
    if result.runs:
        with pd.option_context("display.width", 200, "display.max_columns", None,
                               "display.max_colwidth", 60):
            print(result.summary.drop(columns=["notes"]).to_string(index=False))
        print(f"phase rule: {result.rule.describe()}")
        for analysis in result.analyses:
            if analysis.phase_series:
                print(f"{analysis.run}: " + "; ".join(
                    f"phase {label} from {where}"
                    for label, where in analysis.phase_series.items()))
            if analysis.notes:
                print(f"{analysis.run}: " + "; ".join(analysis.notes))
        try:
            path = write_report(result, args.out)
        except OSError as exc:
            print(f"error: cannot write the report to {args.out}: {exc.strerror}",
                  file=sys.stderr)
            return 1
        print(f"report: {path}")
    return 1 if result.errors else 0


if __name__ == "__main__":
    sys.exit(main())
