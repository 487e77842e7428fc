"""Reports over run directories: summaries, paper comparison, run comparison, failures.

A run directory `runs/NAME/` holds `settings.json` and one `<dataset>.jsonl` of result
records per benchmark (one JSON object per question, written by the runner). Everything
here reads those files and returns plain data or plain text; only `write_summary` writes.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from evaluator.benchmarks import BENCHMARK_NAMES, BENCHMARKS
from evaluator.metrics import normalize_answer, record_metrics, summarize

PAPER_RESULTS_PATH = Path(__file__).resolve().parent.parent / "assets" / "paper_results.json"
SUMMARY_FILES = ("summary.json", "summary.csv", "summary.md")
AVERAGE_ROWS = (("macro", "macro avg"), ("in_domain", "in-domain"),
                ("out_of_domain", "out-of-domain"))
CSV_COLUMNS = ("row", "n", "expected", "em", "sub_em", "f1", "retrieval_recall", "answered",
               "searches", "turns", "invalid_actions", "new_tokens", "seconds",
               "paper_em", "em_diff")


# ---------------------------------------------------------------------------- reading


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Records of a JSON-lines file, skipping a truncated last line (a killed run's)."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as error:
            if number == len(lines):
                break  # the runner was killed mid-write; the rest of the file is whole
            raise ValueError(f"{path}:{number}: not valid JSON ({error})") from error
    return records


def read_settings(run_dir: str | Path) -> dict[str, Any]:
    """The run's settings.json, or {} when it is missing (an interrupted or hand-made run)."""
    path = Path(run_dir) / "settings.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


@dataclass
class Run:
    path: Path
    settings: dict[str, Any]
    records: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.path.name


def _dataset_order(name: str) -> tuple[int, str]:
    return (BENCHMARK_NAMES.index(name) if name in BENCHMARKS else len(BENCHMARK_NAMES), name)


def load_run(run_dir: str | Path) -> Run:
    """A run's settings and its records per dataset, in benchmark order.

    Any `*.jsonl` named after a benchmark counts, and any other whose records carry
    golden answers (a custom set); a resumed run may repeat an id, the last one wins.
    """
    path = Path(run_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"No run directory {path}")
    run = Run(path=path, settings=read_settings(path))
    for file in sorted(path.glob("*.jsonl"), key=lambda f: _dataset_order(f.stem)):
        records = read_jsonl(file)
        if not records:
            continue  # a dataset the runner has only just opened
        if file.stem not in BENCHMARKS and "golden_answers" not in records[0]:
            continue
        by_id: dict[str, dict[str, Any]] = {}
        for index, record in enumerate(records):
            by_id[str(record.get("id", index))] = record
        run.records[file.stem] = list(by_id.values())
    return run


# ---------------------------------------------------------------------------- paper


@cache
def _paper_file(path: str) -> dict[str, Any]:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def load_paper_results(path: str | Path = PAPER_RESULTS_PATH) -> dict[str, Any]:
    """The published EM table (assets/paper_results.json)."""
    return _paper_file(str(path))


def paper_row(model: str | None, paper: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """The paper's row for a model id or local path, when it is a known checkpoint.

    A local path matches by its last component, so `/models/LLDS-A-GRPO-Qwen2.5-7B-Base`
    finds `SEGAgentRL/LLDS-A-GRPO-Qwen2.5-7B-Base`.
    """
    if not model:
        return None
    paper = paper if paper is not None else load_paper_results()
    wanted = model.strip().rstrip("/").lower()
    tail = wanted.rsplit("/", 1)[-1]
    for row in paper["rows"]:
        for model_id in row.get("model_ids", []):
            known = model_id.lower()
            if wanted == known or tail == known.rsplit("/", 1)[-1]:
                return row
    return None


def _paper_mean(row: Mapping[str, Any], names: Sequence[str]) -> float | None:
    values = [row["em"][n] for n in names if n in row["em"]]
    return sum(values) / len(values) if values else None


# ---------------------------------------------------------------------------- summary


def protocol_line(settings: Mapping[str, Any]) -> str:
    """One line saying how the numbers were produced, so they are never misread."""
    if settings.get("limit") is not None:
        selection = f"first {settings['limit']} per dataset (FlashRAG protocol)"
    elif settings.get("sample") is not None:
        selection = (f"random sample of {settings['sample']} per dataset, "
                     f"seed {settings.get('seed')}")
    else:
        selection = "full split per dataset (Search-R1 protocol)"
    decoding = ("greedy" if settings.get("greedy", True)
                else f"sampled, temperature {settings.get('temperature')}")
    parts = [
        selection,
        f"model {settings.get('model', '?')}",
        f"backend {settings.get('backend', '?')}",
        f"retriever {settings.get('retriever', '?')}",
        f"max_turns {settings.get('max_turns', '?')}",
        f"topk {settings.get('topk', '?')}",
        decoding,
    ]
    return "Protocol: " + "; ".join(parts)


def expected_count(name: str, settings: Mapping[str, Any]) -> int | None:
    """How many questions a finished run of this dataset has under the run's selection."""
    bench = BENCHMARKS.get(name)
    if bench is None:
        return None
    for key in ("limit", "sample"):
        if settings.get(key) is not None:
            return min(int(settings[key]), bench.size)
    return bench.size


def summarize_run(run_dir: str | Path) -> dict[str, Any]:
    """The run's summary as plain data: per-dataset rows, averages, paper comparison."""
    run = load_run(run_dir)
    summary = summarize(run.records)
    row = paper_row(run.settings.get("model"))
    for name, stats in summary["datasets"].items():
        stats["expected"] = expected_count(name, run.settings)
        stats["complete"] = stats["expected"] is None or stats["n"] >= stats["expected"]
        paper_em = row["em"].get(name) if row else None
        stats["paper_em"] = paper_em
        stats["em_diff"] = _diff(stats["em"], paper_em)
    for key, _ in AVERAGE_ROWS:
        stats = summary[key]
        paper_em = _paper_mean(row, stats["datasets"]) if row else None
        stats["paper_em"] = paper_em
        stats["em_diff"] = _diff(stats["em"], paper_em)
    summary["run"] = run.name
    summary["settings"] = run.settings
    summary["protocol"] = protocol_line(run.settings)
    summary["paper"] = None if row is None else {
        "label": row["label"],
        "source": load_paper_results()["source"],
        "note": row.get("note"),
    }
    return summary


def _diff(ours: float | None, paper: float | None) -> float | None:
    return None if ours is None or paper is None else ours - paper


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _signed(value: float | None) -> str:
    return "-" if value is None else f"{value:+.3f}"


def _count(stats: Mapping[str, Any]) -> str:
    if stats.get("complete", True) or stats.get("expected") is None:
        return str(stats["n"])
    return f"{stats['n']}/{stats['expected']}"  # a partial dataset shows how far it got


def _sets(count: int) -> str:
    return f"{count} set" if count == 1 else f"{count} sets"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def render_markdown(summary: Mapping[str, Any]) -> str:
    """The summary as a markdown table with the protocol line (fine in a terminal too)."""
    paper = summary.get("paper")
    header = ["dataset", "n", "EM", "sub-EM", "F1", "answered", "searches"]
    if paper:
        header += ["paper EM", "Δ EM"]

    def cells(label: str, stats: Mapping[str, Any], count: str) -> list[str]:
        row = [label, count, _num(stats["em"]), _num(stats["sub_em"]), _num(stats["f1"]),
               _num(stats["answered"]), _num(stats["searches"], 2)]
        if paper:
            row += [_num(stats.get("paper_em")), _signed(stats.get("em_diff"))]
        return row

    out = [f"# Run {summary.get('run', '')}".rstrip(), "", summary["protocol"], ""]
    if not summary["datasets"]:
        return "\n".join([*out, "No results yet."]) + "\n"
    rows = [cells(name, stats, _count(stats)) for name, stats in summary["datasets"].items()]
    for key, label in AVERAGE_ROWS:
        stats = summary[key]
        if stats["datasets"]:
            rows.append(cells(f"**{label}** ({_sets(len(stats['datasets']))})", stats,
                              str(stats["n"])))
    out.append(_table(header, rows))
    partial = [n for n, s in summary["datasets"].items() if not s["complete"]]
    if partial:
        out += ["", f"Partial (run not finished): {', '.join(partial)}."]
    failed = [f"{name}: " + ", ".join(f"{why} {count}" for why, count in s["failures"].items())
              for name, s in summary["datasets"].items() if s["failures"]]
    if failed:
        out += ["", "Failures: " + "; ".join(failed) + "."]
    if paper:
        out += ["", f"Paper: {paper['label']}, {paper['source']}; averages of the paper's figures "
                    "over the same datasets."]
        settings = summary.get("settings", {})
        if settings.get("limit") is not None or settings.get("sample") is not None:
            out.append("The paper scored full splits; a subset's EM is only an estimate of it.")
        if paper.get("note"):
            out.append(f"Note: {paper['note']}")
    return "\n".join(out) + "\n"


def render_csv(summary: Mapping[str, Any]) -> str:
    """One CSV row per dataset and per average, columns as CSV_COLUMNS."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, extrasaction="ignore",
                            lineterminator="\n")
    writer.writeheader()
    rows = [(name, stats) for name, stats in summary["datasets"].items()]
    rows += [(key, summary[key]) for key, _ in AVERAGE_ROWS if summary[key]["datasets"]]
    for label, stats in rows:
        writer.writerow({"row": label, **{k: _csv_value(v) for k, v in stats.items()
                                          if k in CSV_COLUMNS}})
    return buffer.getvalue()


def _csv_value(value: Any) -> Any:
    if value is None:
        return ""
    # six places hide float noise (0.10499999999999998) and keep every real digit
    return round(value, 6) if isinstance(value, float) else value


def write_summary(run_dir: str | Path) -> dict[str, Any]:
    """Compute the summary and write summary.json, summary.csv and summary.md into the run."""
    run_dir = Path(run_dir)
    summary = summarize_run(run_dir)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    (run_dir / "summary.csv").write_text(render_csv(summary), encoding="utf-8")
    (run_dir / "summary.md").write_text(render_markdown(summary), encoding="utf-8")
    return summary


# ---------------------------------------------------------------------------- comparison


def _labels(paths: Sequence[Path]) -> list[str]:
    names = [p.name for p in paths]
    # two runs with the same folder name (different parents) need their paths to tell apart
    return [str(p) if names.count(p.name) > 1 else p.name for p in paths]


def compare_runs(dirs: Sequence[str | Path]) -> str:
    """EM per dataset of two or more runs side by side, with averages and the protocols."""
    summaries = [summarize_run(d) for d in dirs]
    labels = _labels([Path(d) for d in dirs])
    names = sorted({n for s in summaries for n in s["datasets"]}, key=_dataset_order)
    shared = [n for n in names if all(n in s["datasets"] for s in summaries)]
    two = len(summaries) == 2
    header = ["dataset", *labels] + ([f"Δ ({labels[1]} − {labels[0]})"] if two else [])

    def row(label: str, values: list[float | None], marks: list[str]) -> list[str]:
        cells = [label] + [_num(v) + m for v, m in zip(values, marks, strict=True)]
        if two:
            cells.append(_signed(_diff(values[1], values[0])))
        return cells

    rows = []
    for name in names:
        stats = [s["datasets"].get(name) for s in summaries]
        values = [st["em"] if st else None for st in stats]
        marks = ["*" if st and not st["complete"] else "" for st in stats]
        rows.append(row(name, values, marks))
    blank = [""] * len(summaries)
    rows.append(row("**avg (each run's sets)**", [s["macro"]["em"] for s in summaries], blank))
    if shared and shared != names:
        means = [sum(s["datasets"][n]["em"] for n in shared) / len(shared) for s in summaries]
        rows.append(row(f"**avg (shared: {_sets(len(shared))})**", means, blank))
    out = ["EM by dataset", "", _table(header, rows), ""]
    out += [f"{label}: {s['protocol']}" for label, s in zip(labels, summaries, strict=True)]
    if any("*" in cell for r in rows for cell in r):
        out.append("* partial: the run has not finished that dataset.")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------- failures


def failures(run_dir: str | Path, dataset: str) -> list[dict[str, Any]]:
    """Questions the run got wrong (EM 0), normalised prediction beside normalised golds.

    `failure` is the runner's reason when the agent broke down, else "wrong_answer";
    `answer_retrieved` tells a reasoning miss (the answer was in the documents) from a
    retrieval miss.
    """
    run = load_run(run_dir)
    if dataset not in run.records:
        have = ", ".join(run.records) or "none"
        raise KeyError(f"{run.path} has no results for {dataset!r} (has: {have})")
    wrong = []
    for record in run.records[dataset]:
        metrics = record_metrics(record)
        if metrics["em"]:
            continue
        golden = [str(g) for g in record.get("golden_answers") or []]
        prediction = record.get("prediction")
        wrong.append({
            "id": record.get("id"),
            "question": record.get("question"),
            "prediction": prediction,
            "normalized_prediction": None if prediction is None else normalize_answer(prediction),
            "golden_answers": golden,
            "normalized_golden": [normalize_answer(g) for g in golden],
            "failure": record.get("failure") or "wrong_answer",
            "sub_em": metrics["sub_em"],
            "f1": metrics["f1"],
            "answer_retrieved": bool(metrics["retrieval_recall"]),
            "searches": record.get("searches"),
        })
    return wrong


def render_failures(items: Sequence[Mapping[str, Any]], limit: int | None = None) -> str:
    """Failures as plain text blocks for a terminal."""
    shown = items if limit is None else items[:limit]
    blocks = []
    for item in shown:
        prediction = item["normalized_prediction"]
        blocks.append("\n".join([
            f"[{item['id']}] {item['question']}",
            f"  predicted: {'(no answer)' if prediction is None else repr(prediction)}",
            f"  golden:    {', '.join(repr(g) for g in item['normalized_golden'])}",
            f"  reason: {item['failure']}; f1 {item['f1']:.2f}; "
            f"answer in retrieved docs: {'yes' if item['answer_retrieved'] else 'no'}; "
            f"searches {item['searches']}",
        ]))
    more = len(items) - len(shown)
    if more > 0:
        blocks.append(f"... and {more} more")
    return "\n\n".join(blocks) + ("\n" if blocks else "No failures.\n")


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m evaluator.report RUN` writes and prints its summary; more runs compare."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("usage: python -m evaluator.report RUN_DIR [RUN_DIR ...]", file=sys.stderr)
        return 2
    if len(args) == 1:
        print(render_markdown(write_summary(args[0])), end="")
    else:
        print(compare_runs(args), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
