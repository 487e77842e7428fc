"""Results a user can cite: standard errors beside every mean, two runs paired question by
question, the paper's figures only for a run in the paper's setting, provenance in
settings.json and reports, and runs that grow with a larger --limit or --sample.

New modules are imported inside each test, so each test fails on its own behaviour."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest

from agent.loop import AgentSettings
from agent.testing import ROOT
from evaluator.__main__ import main
from evaluator.benchmarks import Question, select
from evaluator.report import summarize_run, write_summary
from evaluator.rundir import RunMismatch, check_run_dir, prepare_run_dir, run_settings
from tests.test_report import FLAGSHIP, _record, _settings, _write_run

WIKI18 = 21_015_324
PAPER_DENSE = {"engine": "dense", "documents": WIKI18, "encoder": "intfloat/e5-base-v2",
               "corpus": {"name": "wiki-18.jsonl", "path": "/data/wiki-18.jsonl",
                          "sha256": "ab" * 32},
               "details": {"index": f"e5_Flat.index (flat, {WIKI18} vectors)"}}
SMALL_BM25S = {"engine": "bm25s", "documents": 10_033,
               "corpus": {"name": "default", "path": "/cache/corpus.jsonl", "sha256": "cd" * 32}}


def _entry(retriever: dict, **more: object) -> dict:
    return {"date": "2026-01-01T00:00:00Z", "model": {"id": FLAGSHIP, "source": "hub",
                                                     "revision": "0" * 40},
            "studio": {"version": "0.1.0", "git_commit": "1" * 40, "git_dirty": False},
            "packages": {"python": "3.11", "torch": "2", "transformers": "5"},
            "device": "cuda: NVIDIA H200", "retriever": retriever, **more}


def _bamboogle(correct: int, total: int = 125) -> list[dict]:
    return [_record("bamboogle", i, ["Mars"],
                    "<answer>Mars</answer>" if i < correct else "<answer>Venus</answer>")
            for i in range(total)]


def _full_run(path: Path, retriever: dict, correct: int = 50, **settings: object) -> Path:
    """A finished full-split bamboogle run of the flagship (125 questions)."""
    stored = _settings(**{"datasets": ["bamboogle"], "expected": {"bamboogle": 125},
                          "provenance": [_entry(retriever)], **settings})
    return _write_run(path, stored, {"bamboogle": _bamboogle(correct)})


# ---------------------------------------------------------------------------- standard errors


def test_every_mean_has_its_standard_error(tmp_path):
    run = _write_run(tmp_path / "r", _settings(datasets=["nq", "bamboogle"]), {
        "nq": [_record("nq", i, ["Paris"], "<answer>Paris</answer>" if i < 3
                       else "<answer>Paris France</answer>") for i in range(10)],
        "bamboogle": _bamboogle(1, 4)})
    summary = summarize_run(run)
    nq, bamboogle = summary["datasets"]["nq"], summary["datasets"]["bamboogle"]
    assert nq["em_se"] == pytest.approx(math.sqrt(0.3 * 0.7 / 10))  # binomial
    # F1: three 1.0s and seven of 2/3 ("paris france" against "paris"): the sample SE
    f1 = [1.0] * 3 + [2 / 3] * 7
    mean = sum(f1) / 10
    sd = math.sqrt(sum((v - mean) ** 2 for v in f1) / 9)
    assert nq["f1_se"] == pytest.approx(sd / math.sqrt(10))
    assert nq["sub_em_se"] == 0.0 and nq["answered_se"] == 0.0
    assert bamboogle["em_se"] == pytest.approx(math.sqrt(0.25 * 0.75 / 4))
    # An unweighted mean over datasets: sqrt(sum SE^2) / k.
    assert summary["macro"]["em_se"] == pytest.approx(
        math.sqrt(nq["em_se"] ** 2 + bamboogle["em_se"] ** 2) / 2)
    markdown = (write_summary(run) and (run / "summary.md").read_text())
    assert "| nq | 10/3610 | 0.300 ± 0.145 |" in markdown
    assert "binomial, sqrt(p(1-p)/n), for EM" in markdown
    assert "sample SE of the mean for F1" in markdown
    header = (run / "summary.csv").read_text().splitlines()[0].split(",")
    assert {"em_se", "f1_se", "sub_em_se"} <= set(header)


def test_one_question_has_no_sample_standard_error():
    from evaluator.stats import binomial_se, mean_se

    assert mean_se([0.5]) is None and mean_se([]) is None
    assert binomial_se(None, 0) is None and binomial_se(1.0, 1) == 0.0


# ---------------------------------------------------------------------------- paired


@pytest.mark.parametrize("only_a, only_b", [(0, 6), (1, 9), (7, 3), (12, 30), (0, 0),
                                            (400, 460)])
def test_exact_mcnemar_is_the_two_sided_binomial_test(only_a, only_b):
    from scipy.stats import binomtest

    from evaluator.stats import mcnemar_exact_p

    expected = 1.0 if only_a + only_b == 0 else binomtest(only_a, only_a + only_b, 0.5).pvalue
    assert mcnemar_exact_p(only_a, only_b) == pytest.approx(expected, rel=1e-9)
    assert mcnemar_exact_p(only_a, only_b) == mcnemar_exact_p(only_b, only_a)


def test_mcnemar_by_hand():
    from evaluator.stats import mcnemar_exact_p

    assert mcnemar_exact_p(0, 6) == 2 / 64  # every discordant pair one way
    assert mcnemar_exact_p(1, 9) == 2 * 11 / 1024
    assert mcnemar_exact_p(5000, 5000) == 1.0  # capped; exact for large counts too


def _vitalqa_run(path: Path, model: str, right: set[int], total: int = 20,
                 errored: frozenset[int] = frozenset()) -> Path:
    records = []
    for i in range(total):
        record = _record("vitalqa", i, ["Mars"],
                         "<answer>Mars</answer>" if i in right else "<answer>Venus</answer>")
        if i in errored:
            record["stop_reason"], record["error"] = "error", "retriever down"
        records.append(record)
    return _write_run(path, _settings(model=model, datasets=["vitalqa"], limit=None,
                                      expected={"vitalqa": total}), {"vitalqa": records})


def test_paired_comparison_of_two_runs_on_the_same_questions(tmp_path, capsys):
    # A right on 0-9, B right on 5-17: both 5-9; only A 0-4; only B 10-17.
    a = _vitalqa_run(tmp_path / "nano-grpo", "nano-grpo", set(range(10)))
    b = _vitalqa_run(tmp_path / "nano-llds", "nano-llds", set(range(5, 18)),
                     errored=frozenset({19}))
    assert main(["report", "--paired", str(a), str(b)]) == 0
    text = capsys.readouterr().out
    # 19 common questions (B's errored one is left out): A 10/19, B 13/19.
    from evaluator.stats import mcnemar_exact_p, paired

    em_a = [1 if i < 10 else 0 for i in range(19)]
    em_b = [1 if 5 <= i < 18 else 0 for i in range(19)]
    expected = paired(em_a, em_b)
    assert expected.n == 19 and (expected.only_a, expected.only_b) == (5, 8)
    diffs = [b_ - a_ for a_, b_ in zip(em_a, em_b, strict=True)]
    mean = sum(diffs) / 19
    se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 18 / 19)
    assert expected.diff == pytest.approx(3 / 19) and expected.diff_se == pytest.approx(se)
    p = mcnemar_exact_p(5, 8)
    assert (f"| vitalqa | 19 | 0.526 | 0.684 | +0.158 ± {se:.3f} | 5 | 8 | {p:.3g} |"
            in text)
    assert "exact McNemar" in text and "Paired EM: nano-grpo vs nano-llds" in text


def test_paired_pools_datasets_and_refuses_other_questions(tmp_path, capsys):
    from evaluator.compare import paired_report

    def nq(answer: str) -> list[dict]:
        return [_record("nq", i, ["x"], f"<answer>{answer}</answer>") for i in range(3)]

    a = _write_run(tmp_path / "a", _settings(), {"nq": nq("x"), "bamboogle": _bamboogle(2, 4)})
    b = _write_run(tmp_path / "b", _settings(), {"nq": nq("y"), "bamboogle": _bamboogle(4, 4)})
    text = paired_report(a, b)
    assert "| nq | 3 | 1.000 | 0.000 | -1.000 ± 0.000 | 3 | 0 | 0.25 |" in text
    assert "| **all (pooled)** | 7 | 0.714 | 0.571 |" in text
    other = _write_run(tmp_path / "c", _settings(), {"nq": [
        {**_record("nq", 0, ["x"], "<answer>x</answer>"), "question": "another question?"}]})
    with pytest.raises(ValueError, match="question 'nq_0' differs between the runs"):
        paired_report(a, other)
    assert main(["report", "--paired", str(a), str(other)]) == 2
    assert "differs between the runs" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["report", "--paired", str(a), str(b), str(other)])
    assert exit_info.value.code == 2


# ---------------------------------------------------------------------------- the paper


def test_the_papers_figure_for_a_run_in_the_papers_setting(tmp_path):
    run = _full_run(tmp_path / "flagship", PAPER_DENSE, correct=50)
    summary = write_summary(run)
    bamboogle = summary["datasets"]["bamboogle"]
    assert bamboogle["paper_em"] == 0.395 and bamboogle["em_diff"] == pytest.approx(0.4 - 0.395)
    assert summary["paper"]["comparable"] == ["bamboogle"]
    assert summary["paper"]["not_comparable"] == []
    markdown = (run / "summary.md").read_text()
    assert "| 0.395 | +0.005 |" in markdown and "not comparable" not in markdown


def test_a_run_on_the_10k_corpus_is_not_compared_with_the_paper(tmp_path):
    run = _full_run(tmp_path / "small", SMALL_BM25S, topk=5)
    summary = write_summary(run)
    assert summary["datasets"]["bamboogle"]["paper_em"] is None
    assert summary["datasets"]["bamboogle"]["em_diff"] is None
    reasons = summary["paper"]["not_comparable"]
    assert reasons[0] == ("retriever: bm25s over default (10,033 passages): engine bm25s, not "
                          "wiki-18; the paper used intfloat/e5-base-v2 over wiki-18 "
                          "(21,015,324 passages, flat index)")
    assert "topk 5 (the paper: 3)" in reasons
    markdown = (run / "summary.md").read_text()
    assert "paper EM" not in markdown and "+0." not in markdown
    assert "Paper (Qwen2.5-3B-Base LLDS-MA (A)): not comparable: retriever: bm25s" in markdown


@pytest.mark.parametrize("change, reason", [
    ({"limit": 100}, "the first 100 questions per dataset, not the full split"),
    ({"greedy": False, "temperature": 0.7}, "greedy sampled (the paper: greedy)"),
    ({"max_turns": 2}, "max_turns 2 (the paper: 4)"),
    ({"expected": {"bamboogle": 100}}, "bamboogle: 100 questions; the full test split has 125"),
])
def test_each_difference_from_the_papers_setting_is_named(tmp_path, change, reason):
    run = _full_run(tmp_path / "r", PAPER_DENSE, **change)
    summary = summarize_run(run)
    assert reason in summary["paper"]["not_comparable"]
    assert summary["datasets"]["bamboogle"]["paper_em"] is None


def test_the_other_retriever_differences():
    from evaluator.paper import retriever_differences

    assert retriever_differences(PAPER_DENSE) == []
    ivf = {**PAPER_DENSE, "details": {"index": "e5.index (ivf-sq8, nlist 4096, nprobe 64)"}}
    assert "an approximate index" in retriever_differences(ivf)[0]
    other = {**PAPER_DENSE, "encoder": "BAAI/bge-base-en-v1.5"}
    assert "encoder BAAI/bge-base-en-v1.5" in retriever_differences(other)[0]
    assert retriever_differences({**PAPER_DENSE, "pooling": "mean", "query_prefix": "query: "}) \
        == []
    cls = {**PAPER_DENSE, "pooling": "cls", "query_prefix": ""}
    assert "cls pooling (e5: mean), query prefix '' (e5: 'query: ')" in \
        retriever_differences(cls)[0]
    server = {"url": "http://127.0.0.1:8000/retrieve", "health": None}
    assert "run with --paper-retriever" in retriever_differences(server)[0]
    assert retriever_differences({**server, "stated": "e5-base-v2 over wiki-18"}) == []
    small = {**server, "health": {"engine": "lucene", "num_docs": 10_033}, "stated": "yes"}
    assert [d.split(" runs ")[-1].split(" serves ")[-1][:8] for d in
            retriever_differences(small)] == ["lucene, ", "10,033 p"]


def test_an_unfinished_full_split_run_is_not_compared(tmp_path):
    stored = _settings(datasets=["bamboogle"], expected={"bamboogle": 125},
                       provenance=[_entry(PAPER_DENSE)])
    run = _write_run(tmp_path / "r", stored, {"bamboogle": _bamboogle(10, 40)})
    summary = summarize_run(run)
    assert "bamboogle: 40 of 125 questions scored (the run is not finished)" in \
        summary["paper"]["not_comparable"]


# ---------------------------------------------------------------------------- provenance


def test_a_file_hash_is_computed_once_and_kept_by_path_size_and_time(tmp_path):
    import hashlib

    from evaluator.provenance import file_sha256

    path = tmp_path / "corpus.jsonl"
    path.write_bytes(b'{"id": "0", "contents": "a"}\n')
    first = file_sha256(path)
    assert first == hashlib.sha256(path.read_bytes()).hexdigest()
    stat = path.stat()
    path.write_bytes(b'{"id": "1", "contents": "b"}\n')  # same size
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert file_sha256(path) == first  # from the cache: the file was not read again
    path.write_bytes(b'{"id": "1", "contents": "bb"}\n')
    assert file_sha256(path) == hashlib.sha256(path.read_bytes()).hexdigest() != first


def test_git_commit_is_read_from_the_checkout(tmp_path):
    from evaluator.provenance import git_commit, studio_identity

    if (ROOT / ".git").exists():
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True).stdout.strip()
        assert git_commit(ROOT) == head
    packed = tmp_path / "packed"
    (packed / ".git" / "refs" / "heads").mkdir(parents=True)
    (packed / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (packed / ".git" / "packed-refs").write_text(
        "# pack-refs with: peeled\n" + "c" * 40 + " refs/heads/main\n")
    assert git_commit(packed) == "c" * 40
    (packed / ".git" / "refs" / "heads" / "main").write_text("d" * 40 + "\n")
    assert git_commit(packed) == "d" * 40  # a loose ref wins over the packed one
    plain = tmp_path / "plain"
    plain.mkdir()
    identity = studio_identity(plain)
    assert identity["git_commit"] is None and "not run from a git checkout" in identity["git_note"]


def test_a_hub_model_is_named_by_its_cached_commit(tmp_path):
    from evaluator.provenance import hub_revision, model_identity

    commit = "e" * 40
    repo = tmp_path / "models--SEGAgentRL--LLDS-A-GRPO-Qwen2.5-3B-Base-MA"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "config.json").write_text("{}")
    assert hub_revision(FLAGSHIP, tmp_path) == commit
    identity = model_identity(FLAGSHIP, FLAGSHIP, "transformers", hub_cache=tmp_path)
    assert identity == {"id": FLAGSHIP, "source": "hub", "revision": commit}
    unknown = model_identity("someone/else", "someone/else", "transformers", hub_cache=tmp_path)
    assert unknown["revision"] is None and "not found in the local cache" in unknown["note"]


def test_a_local_model_is_named_by_a_hash_of_its_weights(tmp_path):
    from evaluator.provenance import model_identity

    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    (model / "config.json").write_text("{}")
    first = model_identity("nano", str(model), "transformers")
    assert first["source"] == "local" and first["weight_files"] == 1
    (model / "config.json").write_text('{"changed": true}')  # not a weight file
    assert model_identity("nano", str(model), "transformers") == first
    (model / "model.safetensors").write_bytes(b"weights, trained further")
    assert model_identity("nano", str(model), "transformers")["content_sha256"] != \
        first["content_sha256"]


def test_a_server_without_health_is_recorded_as_such():
    from evaluator.provenance import health_url, server_identity

    assert health_url("http://h:8000/retrieve") == "http://h:8000/health"
    found = server_identity("http://127.0.0.1:9/retrieve", timeout=2)
    assert found["url"] == "http://127.0.0.1:9/retrieve" and found["health"] is None
    assert "no /health answer" in found["health_note"]


def test_provenance_is_kept_across_resumes_and_grows_only_when_it_changes(tmp_path):
    from evaluator.rundir import apply_run_dir, with_provenance

    settings = run_settings("m", "transformers", "bm25s:default", AgentSettings(), seed=0,
                            limit=2, sample=None, datasets=["vitalqa"])
    first = _entry(SMALL_BM25S)
    apply_run_dir(with_provenance(check_run_dir(tmp_path / "r", settings), first))
    again = {**first, "date": "2026-02-02T00:00:00Z"}
    apply_run_dir(with_provenance(check_run_dir(tmp_path / "r", settings), again))
    stored = json.loads((tmp_path / "r" / "settings.json").read_text())
    assert stored["provenance"] == [first]  # a plain resume adds nothing
    upgraded = {**again, "packages": {**first["packages"], "torch": "3"}}
    apply_run_dir(with_provenance(check_run_dir(tmp_path / "r", settings), upgraded))
    stored = json.loads((tmp_path / "r" / "settings.json").read_text())
    assert stored["provenance"] == [first, upgraded] and stored["written_by"] == "evaluator"
    summary = write_summary(tmp_path / "r")
    assert summary["provenance"] == [first, upgraded]
    markdown = (tmp_path / "r" / "summary.md").read_text()
    assert "- model: SEGAgentRL/LLDS-A-GRPO-Qwen2.5-3B-Base-MA (hub, revision 0000" in markdown
    assert "- retriever: bm25s; 10,033 passages; corpus default" in markdown
    assert "- resumed 2026-02-02T00:00:00Z with another packages" in markdown


# ---------------------------------------------------------------------------- growing


def _stored(tmp_path: Path, **selection: object) -> Path:
    run = tmp_path / "run"
    prepare_run_dir(run, run_settings("m", "transformers", "bm25s:default", AgentSettings(),
                                      seed=int(selection.pop("seed", 0)),
                                      limit=selection.get("limit"),
                                      sample=selection.get("sample"),
                                      datasets=["vitalqa", "naturalqa"]))
    return run


def _wanted(**selection: object) -> dict:
    return run_settings("m", "transformers", "bm25s:default", AgentSettings(),
                        seed=int(selection.pop("seed", 0)), limit=selection.get("limit"),
                        sample=selection.get("sample"), datasets=["vitalqa", "naturalqa"])


def test_a_larger_limit_or_the_full_split_grows_the_run(tmp_path):
    run = _stored(tmp_path, limit=10)
    plan = check_run_dir(run, _wanted(limit=20))
    assert plan.settings["limit"] == 20 and plan.remove == ()
    assert check_run_dir(run, _wanted()).settings["limit"] is None  # the full split
    sampled = _stored(tmp_path / "s", sample=10, seed=3)
    assert check_run_dir(sampled, _wanted(sample=30, seed=3)).settings["sample"] == 30


@pytest.mark.parametrize("stored, wanted, message", [
    ({"limit": 20}, {"limit": 10}, "would select fewer, and a run never shrinks"),
    ({}, {"limit": 10}, "would select fewer, and a run never shrinks"),
    ({"sample": 20}, {"sample": 5}, "would select fewer"),
    ({"limit": 20}, {"sample": 30}, "is another selection rule"),
    ({"sample": 20, "seed": 1}, {"sample": 30, "seed": 2}, "seed: stored 1, now 2"),
])
def test_a_smaller_or_other_selection_is_refused(tmp_path, stored, wanted, message):
    run = _stored(tmp_path, **stored)
    with pytest.raises(RunMismatch, match=message):
        check_run_dir(run, _wanted(**wanted))


def test_a_run_grows_as_a_whole(tmp_path):
    run = _stored(tmp_path, limit=10)
    partial = {**_wanted(limit=20), "datasets": ["vitalqa"]}
    with pytest.raises(RunMismatch, match="leaves out naturalqa.*--datasets vitalqa,naturalqa"):
        check_run_dir(run, partial)
    check_run_dir(run, {**_wanted(limit=10), "datasets": ["vitalqa"]})  # a resume: fine


def test_a_sample_run_drawn_by_the_earlier_rule_is_refused(tmp_path):
    run = _stored(tmp_path, sample=10)
    stored = json.loads((run / "settings.json").read_text())
    del stored["sample_rule"]
    (run / "settings.json").write_text(json.dumps(stored))
    with pytest.raises(RunMismatch, match="drawn by an earlier rule"):
        check_run_dir(run, _wanted(sample=10))


def test_a_larger_sample_holds_every_question_of_a_smaller_one():
    questions = [Question(str(i), "nq", f"q{i}?", ["a"]) for i in range(3610)]
    for seed in (0, 1, 7):
        previous: set[str] = set()
        for size in (10, 100, 400, 1200, 3000):  # across sizes where random.sample switches
            chosen = select(questions, sample=size, seed=seed)
            ids = [q.id for q in chosen]
            assert len(ids) == size and ids == sorted(ids, key=int)  # file order
            assert previous <= set(ids)
            previous = set(ids)


@pytest.mark.slow
def test_cli_records_provenance_and_grows_a_run(tmp_path, tiny_models):
    from tests.test_evaluator import _cli, write_fixture

    data = write_fixture(tmp_path / "data", n_copies=2)  # 8 questions
    out = tmp_path / "run"
    args = ["--datasets", "nq", "--data-dir", str(data), "--model",
            str(tiny_models["scripted"]), "--engine", "bm25s", "--output", str(out)]
    first = _cli(*args, "--limit", "3", timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    before = (out / "nq.jsonl").read_text().splitlines()
    assert len(before) == 3
    grown = _cli(*args, "--limit", "6", timeout=300)
    assert grown.returncode == 0, grown.stderr[-3000:]
    after = (out / "nq.jsonl").read_text().splitlines()
    assert after[:3] == before and len(after) == 6  # kept, then the new questions added
    assert [json.loads(x)["id"] for x in after] == [f"nq-{c}-{i}" for c in (0, 1)
                                                    for i in range(4)][:6]
    shrink = _cli(*args, "--limit", "2")
    assert shrink.returncode == 2 and "never shrinks" in shrink.stderr
    assert (out / "nq.jsonl").read_text().splitlines() == after  # nothing lost
    stored = json.loads((out / "settings.json").read_text())
    assert stored["limit"] == 6 and stored["expected"] == {"nq": 6}
    entry = stored["provenance"][0]
    assert entry["model"]["source"] == "local" and len(entry["model"]["content_sha256"]) == 64
    assert entry["device"] == "cpu" and entry["packages"]["torch"] and entry["packages"]["bm25s"]
    assert entry["retriever"]["engine"] == "bm25s" and entry["retriever"]["documents"] > 1000
    assert len(entry["retriever"]["corpus"]["sha256"]) == 64
    assert entry["retriever"]["index"]["sha256"]
    assert entry["data"]["nq"]["split"] == "test" and entry["data"]["nq"]["sha256"]
    assert entry["studio"]["version"]
    report = _cli("report", str(out))
    assert report.returncode == 0 and "Provenance (started" in report.stdout
    assert "- device: cpu" in report.stdout and " ± " in report.stdout


@pytest.mark.slow
def test_a_retrieval_servers_health_is_recorded(retriever_server):
    from evaluator.paper import retriever_differences
    from evaluator.provenance import server_identity

    found = server_identity(f"{retriever_server}/retrieve")
    assert found["health"]["engine"] == "lucene" and found["health"]["num_docs"] > 1000
    assert "runs lucene" in retriever_differences(found)[0]
