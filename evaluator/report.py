"""Reports of one run: its summary (per dataset, averages, the paper's figures beside ours)
as Markdown and CSV, and the questions it got wrong.

Rendering only: the run directory is read and written through `evaluator.rundir`, the
published figures come from `evaluator.paper`, and two or more runs side by side are
`evaluator.compare`'s.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from evaluator.benchmarks import BENCHMARKS
from evaluator.metrics import normalize_answer
from evaluator.paper import (
    dataset_differences,
    load_paper_results,
    paper_mean,
    paper_row,
    run_differences,
)
from evaluator.rundir import load_run, save_summary
from evaluator.summary import summarize

AVERAGE_ROWS = (("macro", "macro avg"), ("in_domain", "in-domain"),
                ("out_of_domain", "out-of-domain"))
CSV_COLUMNS = ("row", "n", "expected", "errored", "em", "em_se", "sub_em", "sub_em_se", "f1",
               "f1_se", "retrieval_recall", "retrieval_recall_se", "answered", "answered_se",
               "searches", "searches_se", "turns", "invalid_actions", "new_tokens", "seconds",
               "paper_em", "em_diff")
SE_NOTE = ("± one standard error: binomial, sqrt(p(1-p)/n), for EM, sub-EM and answered; the "
           "sample SE of the mean for F1 and searches; an average over datasets combines "
           "its datasets' SEs as sqrt(sum SE^2)/k.")


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
    """How many questions a finished run of this dataset has under the run's selection:
    what the run counted when it loaded the data, else (an older run) the published size
    capped by the limit or sample; None for an unknown set."""
    stored = settings.get("expected")
    if isinstance(stored, Mapping) and isinstance(stored.get(name), int):
        return stored[name]
    bench = BENCHMARKS.get(name)
    if bench is None:
        return None
    for key in ("limit", "sample"):
        if settings.get(key) is not None:
            return min(int(settings[key]), bench.size)
    return bench.size


RESUME_HINT = ("Run the same command again to resume: finished questions are kept; errored "
               "and unfinished ones run.")


def mark_completion(stats: dict[str, Any], expected: int | None) -> None:
    """Set `expected` and `complete` on one dataset's stats (from `aggregate`): complete when
    no question errored and every expected question was scored."""
    stats["expected"] = expected
    stats["complete"] = not stats.get("errored") and (expected is None
                                                      or stats["n"] >= expected)


def completion_note(datasets: Mapping[str, Mapping[str, Any]],
                    missing: Sequence[str] = ()) -> str | None:
    """Why a run is incomplete, in words, with how to resume; None when it is complete.

    `datasets`: stats marked by `mark_completion`; `missing`: datasets not started. The
    averages of an incomplete run cover the scored questions only, and the note says so.
    """
    errored = sum(s.get("errored", 0) for s in datasets.values())
    first_error = next((s["first_error"] for s in datasets.values() if s.get("first_error")),
                       None)
    unfinished = [n for n, s in datasets.items()
                  if s.get("expected") is not None and s["n"] + s.get("errored", 0)
                  < s["expected"]]
    if not errored and not unfinished and not missing:
        return None
    parts = ["Incomplete run."]
    if errored:
        cause = str(first_error).strip()
        parts.append(f"{errored} question(s) ended in an error and are not scored. First "
                     f"error: {cause}" + ("" if cause.endswith((".", "!", "?")) else "."))
    if unfinished:
        parts.append(f"Partial (run not finished): {', '.join(unfinished)}.")
    if missing:
        parts.append(f"Not started: {', '.join(missing)}.")
    parts.append("The figures cover the scored questions only. " + RESUME_HINT)
    return " ".join(parts)


def summarize_run(run_dir: str | Path) -> dict[str, Any]:
    """The run's summary as plain data: per-dataset rows, averages, paper comparison, and
    whether the run is complete (`complete`, `errored`, `first_error`, `note`)."""
    run = load_run(run_dir)
    summary = summarize(run.records)
    row = paper_row(run.settings.get("model"))
    run_level = run_differences(run.settings) if row else []
    differences = list(run_level)
    comparable: set[str] = set()
    for name, stats in summary["datasets"].items():
        mark_completion(stats, expected_count(name, run.settings))
        if row is None or name not in row["em"]:
            stats["paper_em"] = stats["em_diff"] = None
            continue
        bench = BENCHMARKS.get(name)
        own = dataset_differences(name, run.settings, stats, bench.split if bench else None,
                                  bench.size if bench else None)
        differences += own
        if not run_level and not own:
            comparable.add(name)
        # The published figure and the difference only where the run matches the paper.
        stats["paper_em"] = row["em"][name] if name in comparable else None
        stats["em_diff"] = difference(stats["em"], stats["paper_em"])
    for key, _ in AVERAGE_ROWS:
        stats = summary[key]
        matched = bool(stats["datasets"]) and all(n in comparable for n in stats["datasets"])
        stats["paper_em"] = paper_mean(row, stats["datasets"]) if row and matched else None
        stats["em_diff"] = difference(stats["em"], stats["paper_em"])
    missing = [str(n) for n in run.settings.get("datasets", []) if n not in summary["datasets"]]
    summary["run"] = run.name
    summary["settings"] = run.settings
    summary["protocol"] = protocol_line(run.settings)
    summary["provenance"] = run.settings.get("provenance") or []
    summary["paper"] = None if row is None else {
        "label": row["label"],
        "source": load_paper_results()["source"],
        "note": row.get("note"),
        "comparable": sorted(comparable, key=list(summary["datasets"]).index),
        "not_comparable": differences,
    }
    summary["errored"] = sum(s["errored"] for s in summary["datasets"].values())
    summary["first_error"] = next((s["first_error"] for s in summary["datasets"].values()
                                   if s["first_error"]), None)
    summary["missing"] = missing
    summary["note"] = completion_note(summary["datasets"], missing)
    summary["complete"] = summary["note"] is None
    summary["resume_hint"] = None if summary["complete"] else RESUME_HINT
    return summary


def difference(ours: float | None, paper: float | None) -> float | None:
    return None if ours is None or paper is None else ours - paper


def number(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def signed(value: float | None) -> str:
    return "-" if value is None else f"{value:+.3f}"


def _count(stats: Mapping[str, Any]) -> str:
    """Scored questions; out of how many when incomplete, and how many errored."""
    if stats.get("complete", True):
        return str(stats["n"])
    count = str(stats["n"])
    if stats.get("expected") is not None:
        count += f"/{stats['expected']}"
    return count + (f" ({stats['errored']} errored)" if stats.get("errored") else "")


def sets(count: int) -> str:
    return f"{count} set" if count == 1 else f"{count} sets"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def with_se(stats: Mapping[str, Any], key: str, digits: int = 3) -> str:
    """`0.750 ± 0.022`: a mean and its standard error (`-` for a missing one)."""
    value, se = stats.get(key), stats.get(f"{key}_se")
    if value is None:
        return "-"
    return number(value, digits) + ("" if se is None else f" ± {number(se, digits)}")


def _short(digest: Any) -> str:
    return f"{digest[:16]}…" if isinstance(digest, str) else "none"


def _model_line(model: Mapping[str, Any]) -> str:
    if model.get("source") == "local":
        files = model.get("weight_files", 0)
        return (f"{model.get('id')} (local {model.get('path')}; weights sha256 "
                f"{_short(model.get('content_sha256'))}, {files} file{'' if files == 1 else 's'})")
    if model.get("source") == "hub":
        return f"{model.get('id')} (hub, revision {model.get('revision') or 'unknown'})"
    return f"{model.get('id')} (served by {model.get('base_url')}; revision unknown)"


def _retriever_line(retriever: Mapping[str, Any]) -> str:
    if "url" in retriever:
        health = retriever.get("health")
        said = ", ".join(f"{k} {health[k]}" for k in ("engine", "num_docs", "index")
                         if isinstance(health, Mapping) and k in health)
        line = f"server {retriever['url']}; /health: {said or retriever.get('health_note')}"
        return line + (f"; {retriever['stated']}" if retriever.get("stated") else "")
    corpus = retriever.get("corpus")
    documents = retriever.get("documents")
    parts = [f"{retriever.get('engine')}"
             + (f" ({retriever['encoder']})" if retriever.get("encoder") else ""),
             f"{documents:,} passages" if isinstance(documents, int) else "passages unknown"]
    if corpus:
        parts.append(f"corpus {corpus.get('name')} ({corpus.get('path')}, sha256 "
                     f"{_short(corpus.get('sha256'))})")
    index = retriever.get("index")
    if index:
        parts.append(f"index {index.get('path') or index.get('name')}"
                     + (f" (sha256 {_short(index['sha256'])})" if index.get("sha256") else ""))
    return "; ".join(parts)


def provenance_lines(entries: Sequence[Mapping[str, Any]]) -> list[str]:
    """The provenance of a run as Markdown list items: the first session in full, then what
    changed in each later one (full hashes are in settings.json and summary.json)."""
    if not entries:
        return ["Provenance: not recorded (a run from before provenance was stored, or one "
                "made by the Evaluate tab)."]
    first = entries[0]
    studio = first.get("studio", {})
    if studio.get("git_commit"):
        git = f"git {studio['git_commit'][:12]}" + (
            " with uncommitted changes" if studio.get("git_dirty") else "")
    else:
        git = studio.get("git_note", "no git commit")
    packages = ", ".join(f"{k} {v}" for k, v in first.get("packages", {}).items())
    lines = [f"Provenance (started {first.get('date')}; full hashes in settings.json):",
             f"- model: {_model_line(first.get('model', {}))}",
             f"- studio: {studio.get('version')}, {git}",
             f"- packages: {packages}",
             f"- device: {first.get('device')}",
             f"- retriever: {_retriever_line(first.get('retriever', {}))}"]
    for name, data in (first.get("data") or {}).items():
        where = data.get("path") or f"{data.get('dataset')} ({data.get('config')})"
        lines.append(f"- data {name}: {where}, split {data.get('split') or 'not recorded'}"
                     + (f", sha256 {_short(data['sha256'])}" if data.get("sha256") else ""))
    for before, entry in zip(entries, entries[1:], strict=False):
        changed = [k for k in entry if k != "date" and entry.get(k) != before.get(k)]
        lines.append(f"- resumed {entry.get('date')} with another {', '.join(changed)}"
                     " (settings.json lists each session)")
    return lines


def render_markdown(summary: Mapping[str, Any]) -> str:
    """The summary as a markdown table (each mean ± its standard error) with the protocol
    line, the paper's figures where the run matches its setting (else what differs), and
    the provenance (fine in a terminal too)."""
    paper = summary.get("paper")
    shown = bool(paper and paper.get("comparable"))
    header = ["dataset", "n", "EM", "sub-EM", "F1", "answered", "searches"]
    if shown:
        header += ["paper EM", "Δ EM"]

    def cells(label: str, stats: Mapping[str, Any], count: str) -> list[str]:
        row = [label, count, with_se(stats, "em"), with_se(stats, "sub_em"),
               with_se(stats, "f1"), with_se(stats, "answered"),
               with_se(stats, "searches", 2)]
        if shown:
            row += [number(stats.get("paper_em")), signed(stats.get("em_diff"))]
        return row

    out = [f"# Run {summary.get('run', '')}".rstrip(), "", summary["protocol"], ""]
    if summary.get("note"):
        out += [f"**{summary['note']}**", ""]
    if not summary["datasets"]:
        return "\n".join([*out, "No results yet.", "",
                          *provenance_lines(summary.get("provenance") or [])]) + "\n"
    rows = [cells(name, stats, _count(stats)) for name, stats in summary["datasets"].items()]
    for key, label in AVERAGE_ROWS:
        stats = summary[key]
        if stats["datasets"]:
            rows.append(cells(f"**{label}** ({sets(len(stats['datasets']))})", stats,
                              str(stats["n"])))
    out += [markdown_table(header, rows), "", SE_NOTE]
    failed = [f"{name}: " + ", ".join(f"{why} {count}" for why, count in s["failures"].items())
              for name, s in summary["datasets"].items() if s["failures"]]
    if failed:
        out += ["", "Failures: " + "; ".join(failed) + "."]
    if paper:
        out.append("")
        if shown:
            out.append(f"Paper: {paper['label']}, {paper['source']}, shown for "
                       f"{', '.join(paper['comparable'])}; averages of the paper's figures "
                       "over the same datasets.")
        if paper.get("not_comparable"):
            out.append(f"Paper ({paper['label']}): not comparable: "
                       + "; ".join(paper["not_comparable"]) + ".")
        if shown and paper.get("note"):
            out.append(f"Note: {paper['note']}")
    out += ["", *provenance_lines(summary.get("provenance") or [])]
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
    """Compute the summary and save it in the run as summary.json, .csv and .md."""
    summary = summarize_run(run_dir)
    save_summary(run_dir, summary, render_markdown(summary), render_csv(summary))
    return summary


# ---------------------------------------------------------------------------- questions


def failures(run_dir: str | Path, dataset: str, wrong_only: bool = True) -> list[dict[str, Any]]:
    """Questions the run got wrong (EM 0; every question when not `wrong_only`), normalised
    prediction beside normalised golds.

    `failure` is the runner's reason when the agent broke down, else "wrong_answer" (None
    for a right answer); `answer_retrieved` tells a reasoning miss (the answer was in the
    documents) from a retrieval miss.
    """
    run = load_run(run_dir)
    if dataset not in run.records:
        have = ", ".join(run.records) or "none"
        raise KeyError(f"{run.path} has no results for {dataset!r} (has: {have})")
    wrong = []
    for record in run.records[dataset]:
        metrics = record.metrics
        if metrics["em"] and wrong_only:
            continue
        golden = [str(g) for g in record.golden_answers]
        prediction = record.prediction
        wrong.append({
            "id": record.id,
            "question": record.question,
            "prediction": prediction,
            "normalized_prediction": None if prediction is None else normalize_answer(prediction),
            "golden_answers": golden,
            "normalized_golden": [normalize_answer(g) for g in golden],
            "failure": None if metrics["em"] else record.failure or "wrong_answer",
            "sub_em": metrics["sub_em"],
            "f1": metrics["f1"],
            "answer_retrieved": bool(metrics["retrieval_recall"]),
            "searches": record.searches,
        })
    return wrong


def render_failures(items: Sequence[Mapping[str, Any]], limit: int | None = None) -> str:
    """Questions from `failures` as plain text blocks for a terminal."""
    shown = items if limit is None else items[:limit]
    blocks = []
    for item in shown:
        prediction = item["normalized_prediction"]
        blocks.append("\n".join([
            f"[{item['id']}] {item['question']}",
            f"  predicted: {'(no answer)' if prediction is None else repr(prediction)}",
            f"  golden:    {', '.join(repr(g) for g in item['normalized_golden'])}",
            f"  reason: {item['failure'] or 'right answer'}; f1 {item['f1']:.2f}; "
            f"answer in retrieved docs: {'yes' if item['answer_retrieved'] else 'no'}; "
            f"searches {item['searches']}",
        ]))
    more = len(items) - len(shown)
    if more > 0:
        blocks.append(f"... and {more} more")
    return "\n\n".join(blocks) + ("\n" if blocks else "No failures.\n")
