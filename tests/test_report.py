"""Run-directory reports, on fixture runs written here."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from evaluator.__main__ import main
from evaluator.compare import compare_runs
from evaluator.metrics import score_prediction
from evaluator.paper import load_paper_results, paper_row
from evaluator.report import (
    failures,
    protocol_line,
    render_failures,
    summarize_run,
    write_summary,
)
from evaluator.rundir import damaged_lines, load_run, read_jsonl

FLAGSHIP = "SEGAgentRL/LLDS-A-GRPO-Qwen2.5-3B-Base-MA"


def _settings(**overrides: object) -> dict:
    settings = {"model": FLAGSHIP, "backend": "hf", "retriever": "e5", "max_turns": 4,
                "topk": 3, "max_new_tokens": 500, "greedy": True, "temperature": 0.0,
                "limit": None, "sample": None, "seed": 0, "datasets": ["nq", "bamboogle"]}
    settings.update(overrides)
    return settings


def _record(dataset: str, index: int, golden: list[str], response: str,
            failure: str | None = None, retrieved: list[str] | None = None) -> dict:
    from agent.protocol import extract_answer

    retrieved = retrieved or []
    prediction = extract_answer(response)
    return {
        "id": f"{dataset}_{index}", "dataset": dataset, "question": f"question {index}?",
        "golden_answers": golden, "prediction": prediction, "response": response,
        "trajectory": "prompt" + response, "retrieved": retrieved,
        "metrics": score_prediction(prediction, golden, retrieved),
        "answered": prediction is not None,
        "failure": failure if failure or prediction is not None else "no_answer",
        "searches": 1, "turns": 2, "invalid_actions": 0, "new_tokens": 50, "seconds": 0.5,
        "stop_reason": "answer" if prediction is not None else "eos",
    }


def _write_run(path: Path, settings: dict, records: dict[str, list[dict]],
               truncate: str | None = None) -> Path:
    path.mkdir(parents=True)
    (path / "settings.json").write_text(json.dumps(settings), encoding="utf-8")
    for dataset, recs in records.items():
        text = "".join(json.dumps(r) + "\n" for r in recs)
        if dataset == truncate:
            text += '{"id": "cut", "dataset": "nq", "quest'  # a run killed mid-write
        (path / f"{dataset}.jsonl").write_text(text, encoding="utf-8")
    return path


def _nq(correct: int, total: int) -> list[dict]:
    out = []
    for i in range(total):
        answer = "<answer>Paris</answer>" if i < correct else "<answer>Lyon</answer>"
        out.append(_record("nq", i, ["Paris"], answer, retrieved=['"Paris"\nParis.']))
    return out


def _bamboogle() -> list[dict]:
    return [
        _record("bamboogle", 0, ["Ada Lovelace"], "<answer>ada lovelace</answer>"),
        _record("bamboogle", 1, ["1969"], "<think>unsure</think>"),  # no answer tag
        _record("bamboogle", 2, ["The Moon"], "<answer>the moon base</answer>",
                failure="max_turns"),
        _record("bamboogle", 3, ["Mars"], "<answer>Mars</answer>"),
    ]


@pytest.fixture
def run_a(tmp_path: Path) -> Path:
    return _write_run(tmp_path / "runs" / "flagship", _settings(limit=4),
                      {"nq": _nq(3, 4), "bamboogle": _bamboogle()}, truncate="nq")


def test_read_jsonl_skips_truncated_last_line(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text('{"a": 1}\n\n{"a": 2}\n{"a": 3, "b"', encoding="utf-8")
    assert read_jsonl(path) == [{"a": 1}, {"a": 2}]
    assert damaged_lines(path) == []  # a cut last line is a kill, not damage
    path.write_text('{"a": 1}\n{bad}\n{"a": 2}\n', encoding="utf-8")
    assert read_jsonl(path) == [{"a": 1}, {"a": 2}] and damaged_lines(path) == [2]


def test_load_run(run_a: Path) -> None:
    (run_a / "notes.jsonl").write_text('{"event": "start"}\n', encoding="utf-8")
    (run_a / "musique.jsonl").write_text("", encoding="utf-8")
    run = load_run(run_a)
    assert run.name == "flagship"
    assert list(run.records) == ["nq", "bamboogle"]  # benchmark order; no notes, no empty
    assert len(run.records["nq"]) == 4


def test_load_run_resumed_duplicates_last_wins(tmp_path: Path) -> None:
    first = _record("nq", 0, ["Paris"], "<answer>Lyon</answer>")
    again = _record("nq", 0, ["Paris"], "<answer>Paris</answer>")
    run_dir = _write_run(tmp_path / "r", _settings(), {"nq": [first, again]})
    records = load_run(run_dir).records["nq"]
    assert len(records) == 1 and records[0].prediction == "Paris"


def test_paper_results_asset() -> None:
    paper = load_paper_results()
    assert "2512.04220v2" in paper["source"]
    assert len(paper["rows"]) == 14
    for row in paper["rows"]:
        mean = sum(row["em"].values()) / 7
        assert mean == pytest.approx(row["avg"], abs=0.0011), row["label"]
    assert any("0.430" in note for note in paper["notes"])
    mapped = {i: r["label"] for r in paper["rows"] for i in r["model_ids"]}
    assert mapped == {
        FLAGSHIP: "Qwen2.5-3B-Base LLDS-MA (A)",
        "SEGAgentRL/LLDS-R-GRPO-Qwen2.5-3B-Base": "Qwen2.5-3B-Base LLDS (R)",
        "SEGAgentRL/LLDS-A-GRPO-Qwen2.5-7B-Base": "Qwen2.5-7B-Base LLDS",
        "SEGAgentRL/LLDS-A-GRPO-Qwen2.5-7B-Ins": "Qwen2.5-7B-Instruct LLDS",
    }


def test_paper_row_matching() -> None:
    assert paper_row(FLAGSHIP)["em"]["nq"] == 0.483
    assert paper_row("/models/LLDS-A-GRPO-Qwen2.5-7B-Ins/")["label"] == "Qwen2.5-7B-Instruct LLDS"
    assert paper_row("segagentrl/llds-a-grpo-qwen2.5-7b-base")["label"] == "Qwen2.5-7B-Base LLDS"
    assert paper_row("Qwen/Qwen2.5-3B") is None
    assert paper_row(None) is None


def test_protocol_line() -> None:
    assert "full split" in protocol_line(_settings())
    assert "first 1000 per dataset (FlashRAG protocol)" in protocol_line(_settings(limit=1000))
    line = protocol_line(_settings(sample=200, seed=3, greedy=False, temperature=0.7))
    assert "random sample of 200 per dataset, seed 3" in line
    assert "temperature 0.7" in line
    for part in ("retriever e5", "max_turns 4", "topk 3", f"model {FLAGSHIP}"):
        assert part in line


def test_summarize_run(run_a: Path) -> None:
    summary = summarize_run(run_a)
    nq, bam = summary["datasets"]["nq"], summary["datasets"]["bamboogle"]
    assert nq["n"] == 4 and nq["em"] == 0.75 and nq["complete"]
    assert bam["em"] == 0.5 and bam["sub_em"] == 0.75 and bam["answered"] == 0.75
    assert bam["failures"] == {"max_turns": 1, "no_answer": 1}
    assert summary["macro"]["em"] == pytest.approx(0.625)
    assert summary["in_domain"]["em"] == 0.75
    assert summary["out_of_domain"]["em"] == 0.5
    # A 4-question subset with no recorded retriever is not the paper's setting: no
    # published figure, no difference, and the reasons instead.
    assert nq["paper_em"] is None and nq["em_diff"] is None
    assert summary["macro"]["paper_em"] is None
    assert summary["paper"]["label"] == "Qwen2.5-3B-Base LLDS-MA (A)"
    assert summary["paper"]["comparable"] == []
    reasons = summary["paper"]["not_comparable"]
    assert any(r.startswith("retriever: not recorded") for r in reasons)
    assert "the first 4 questions per dataset, not the full split" in reasons


def test_write_summary_files(run_a: Path) -> None:
    write_summary(run_a)
    data = json.loads((run_a / "summary.json").read_text())
    assert data["datasets"]["nq"]["em"] == 0.75
    rows = list(csv.DictReader(io.StringIO((run_a / "summary.csv").read_text())))
    assert [r["row"] for r in rows] == ["nq", "bamboogle", "macro", "in_domain", "out_of_domain"]
    assert rows[0]["paper_em"] == rows[1]["em_diff"] == ""  # not the paper's setting
    assert rows[0]["em_se"] == "0.216506"  # sqrt(.75 * .25 / 4), rounded: no float noise
    assert rows[0]["f1_se"] == "0.25"  # sample SE of (1, 1, 1, 0)
    markdown = (run_a / "summary.md").read_text()
    assert "first 4 per dataset (FlashRAG protocol)" in markdown
    assert ("| nq | 4 | 0.750 ± 0.217 | 0.750 ± 0.217 | 0.750 ± 0.250 | 1.000 ± 0.000 | "
            "1.00 ± 0.00 |") in markdown
    assert "| **macro avg** (2 sets) | 8 | 0.625 ± 0." in markdown
    assert "| **in-domain** (1 set) |" in markdown
    assert "paper EM" not in markdown
    assert "Paper (Qwen2.5-3B-Base LLDS-MA (A)): not comparable: retriever: not recorded" \
        in markdown
    assert "the first 4 questions per dataset, not the full split" in markdown
    assert "bamboogle: max_turns 1, no_answer 1" in markdown


def test_markdown_without_paper_and_partial(tmp_path: Path) -> None:
    run_dir = _write_run(tmp_path / "base", _settings(model="Qwen/Qwen2.5-3B"),
                         {"nq": _nq(1, 2)})
    markdown = write_summary(run_dir) and (run_dir / "summary.md").read_text()
    assert "paper EM" not in markdown
    assert "| nq | 2/3610 |" in markdown
    assert "Partial (run not finished): nq." in markdown
    assert "out-of-domain" not in markdown  # no out-of-domain sets yet


def test_empty_run(tmp_path: Path) -> None:
    run_dir = _write_run(tmp_path / "empty", _settings(), {})
    summary = write_summary(run_dir)
    assert summary["datasets"] == {}
    assert "No results yet." in (run_dir / "summary.md").read_text()


def test_compare_runs(run_a: Path, tmp_path: Path) -> None:
    run_b = _write_run(tmp_path / "runs" / "baseline", _settings(model="Qwen/Qwen2.5-3B", limit=4),
                       {"nq": _nq(1, 4)})
    text = compare_runs([run_a, run_b])
    assert "| dataset | flagship | baseline | Δ (baseline − flagship) |" in text
    assert "| nq | 0.750 ± 0.217 | 0.250 ± 0.217 | -0.500 |" in text
    assert "| bamboogle | 0.500 ± 0.250 | - | - |" in text
    assert "| **avg (each run's sets)** | 0.625 ± 0.165 | 0.250 ± 0.217 | -0.375 |" in text
    assert "| **avg (shared: 1 set)** | 0.750 ± 0.217 | 0.250 ± 0.217 | -0.500 |" in text
    assert "flagship: Protocol: first 4" in text


def test_compare_three_runs_same_names(tmp_path: Path) -> None:
    dirs = [_write_run(tmp_path / p / "run", _settings(), {"nq": _nq(i, 3)})
            for i, p in enumerate(("a", "b", "c"))]
    text = compare_runs(dirs)
    assert "Δ" not in text
    assert str(tmp_path / "a" / "run") in text  # labels fall back to full paths
    assert "0.000 ± 0.000 | 0.333 ± 0.272 | 0.667 ± 0.272" in text
    assert "* partial" in text


def test_failures(run_a: Path) -> None:
    wrong = failures(run_a, "bamboogle")
    assert [w["id"] for w in wrong] == ["bamboogle_1", "bamboogle_2"]
    no_answer, long_answer = wrong
    assert no_answer["failure"] == "no_answer" and no_answer["normalized_prediction"] is None
    assert no_answer["normalized_golden"] == ["1969"]
    assert long_answer["failure"] == "max_turns"
    assert long_answer["normalized_prediction"] == "moon base"
    assert long_answer["normalized_golden"] == ["moon"]
    assert long_answer["sub_em"] == 1
    nq_wrong = failures(run_a, "nq")
    assert nq_wrong[0]["failure"] == "wrong_answer" and nq_wrong[0]["answer_retrieved"]
    with pytest.raises(KeyError, match="musique"):
        failures(run_a, "musique")


def test_render_failures(run_a: Path) -> None:
    text = render_failures(failures(run_a, "bamboogle"), limit=1)
    assert "[bamboogle_1] question 1?" in text
    assert "predicted: (no answer)" in text
    assert "golden:    '1969'" in text
    assert "... and 1 more" in text
    assert render_failures([]) == "No failures.\n"


def test_report_command(run_a: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(run_a)]) == 0
    assert "| nq |" in capsys.readouterr().out
    assert (run_a / "summary.md").is_file()
    with pytest.raises(SystemExit):
        main(["report"])


def test_show_lists_every_question_or_only_failures(run_a: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", str(run_a), "--dataset", "bamboogle", "--failures"]) == 0
    wrong = capsys.readouterr().out
    assert "[bamboogle_1]" in wrong and "[bamboogle_0]" not in wrong
    assert main(["show", str(run_a), "--dataset", "bamboogle"]) == 0
    every = capsys.readouterr().out
    assert "[bamboogle_0]" in every and "reason: right answer" in every
    assert "[bamboogle_1]" in every


def test_a_line_that_is_not_a_record_says_which(tmp_path: Path) -> None:
    record = _record("nq", 0, ["Paris"], "<answer>Paris</answer>")
    del record["metrics"]
    run_dir = _write_run(tmp_path / "r", _settings(), {"nq": [record]})
    with pytest.raises(ValueError, match=r"nq.jsonl:1: .*no metrics"):
        load_run(run_dir)
