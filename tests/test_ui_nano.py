"""Where the nano agent shows in the studio: the Ask tab's examples (held-out questions the
model really answers, picked by running it), the Compare tab's default pair, what the model
is said to be beside the picker, and the bundled nano-scale runs in the Training-curves tab.

Tiny real Qwen2 models (agent/testing.py) stand in for the nano agent and its GRPO / LLDS
versions; the shipped ones have their own end-to-end test (tests/test_ui_nano_browser.py).
"""

from __future__ import annotations

import json
import re

import pytest

from agent import models
from agent.config import BackendOptions
from agent.loop import AgentSettings
from agent.models import NANO, NANO_GRPO, NANO_LLDS
from agent.testing import free_port
from app.ui import examples as examples_module
from app.ui.examples import load_examples, pick_examples


@pytest.fixture
def nano_registry(tmp_path, monkeypatch, tiny_models):
    """The registry with tiny real models as the nano agent and its GRPO / LLDS versions."""
    entries = [{"id": NANO, "path": str(tiny_models["scripted"]), "label": "Nano (test)",
                "method": "SFT", "size": "tiny",
                "description": "Not an LLDS checkpoint: the studio's embedded default."},
               {"id": NANO_GRPO, "path": str(tiny_models["scripted"]), "label": "Nano GRPO",
                "method": "GRPO", "description": "Nano-scale, made by this project."},
               {"id": NANO_LLDS, "path": str(tiny_models["eos"]), "label": "Nano LLDS",
                "method": "LLDS", "description": "Nano-scale, made by this project."}]
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"models": entries}))
    monkeypatch.setattr(models, "REGISTRY_FILE", path)
    models.registry.cache_clear()
    yield
    models.registry.cache_clear()


def write_benchmark(path, questions):
    path.write_text("".join(json.dumps(q) + "\n" for q in questions), encoding="utf-8")
    return path


def test_examples_are_the_held_out_questions_the_model_answers(tmp_path, tiny_models,
                                                               local_retriever):
    # The scripted tiny model searches, then answers "Kubrick" whatever it is asked.
    answer = json.loads((tiny_models["scripted"] / "scripted_paths.json").read_text())
    said = answer["\n\n"][1].strip()
    bench = write_benchmark(tmp_path / "test.jsonl", [
        {"id": "a", "question": "who directed the space film", "golden_answers": [said],
         "metadata": {"family": "span"}},
        {"id": "b", "question": "capital of France", "golden_answers": ["Paris"],
         "metadata": {"family": "definition"}},
        {"id": "c", "question": f"the {said} question", "golden_answers": [said.lower()],
         "metadata": {"family": "definition"}}])
    backend = BackendOptions(device="cpu").load(str(tiny_models["scripted"]))
    # The scripted model answers only after a whole observation (an uncut one).
    chosen, asked, right = pick_examples(backend, local_retriever, bench, n=5,
                                         settings=AgentSettings(max_obs_tokens=4000))
    assert (asked, right) == (3, 2)
    assert {e["id"] for e in chosen} == {"a", "c"}
    assert all(e["answer"].strip().lower() == said.lower() for e in chosen)


def test_examples_file_round_trip_and_bad_files(tmp_path, tiny_models, monkeypatch,
                                               default_corpus):
    said = json.loads((tiny_models["scripted"] / "scripted_paths.json").read_text())
    said = said["\n\n"][1].strip()
    bench = write_benchmark(tmp_path / "test.jsonl", [
        {"id": "a", "question": "who directed it", "golden_answers": [said]}])
    out = tmp_path / "ask_examples.json"
    monkeypatch.chdir(tmp_path)  # a benchmark named relative to where it is run
    code = examples_module.main(["--model", str(tiny_models["scripted"]), "--benchmark",
                                 bench.name, "--out", str(out), "--engine", "bm25s",
                                 "--max-obs-tokens", "4000"])
    assert code == 0 and load_examples(out) == ["who directed it"]
    assert json.loads(out.read_text())["benchmark"] == str(bench)
    bad = write_benchmark(tmp_path / "none.jsonl", [
        {"id": "a", "question": "who", "golden_answers": ["nobody-says-this"]}])
    assert examples_module.main(["--model", str(tiny_models["scripted"]), "--benchmark",
                                 str(bad), "--out", str(tmp_path / "x.json"),
                                 "--engine", "bm25s", "--max-obs-tokens", "4000"]) == 1
    assert not (tmp_path / "x.json").exists()
    (tmp_path / "broken.json").write_text("{not json")
    assert load_examples(tmp_path / "broken.json") == []
    assert load_examples(tmp_path / "missing.json") == []


def test_the_compare_question_is_one_b_answers_and_a_does_not(tmp_path, tiny_models,
                                                               monkeypatch, default_corpus):
    said = json.loads((tiny_models["scripted"] / "scripted_paths.json").read_text())
    said = said["\n\n"][1].strip()
    bench = write_benchmark(tmp_path / "test.jsonl", [
        {"id": "a", "question": "capital of France", "golden_answers": ["Paris"]},
        {"id": "b", "question": "who directed it", "golden_answers": [said]},
        {"id": "c", "question": "who directed that", "golden_answers": [said]}])
    out = tmp_path / "compare_example.json"
    pair = (str(tiny_models["eos"]), str(tiny_models["scripted"]))  # A says nothing
    code = examples_module.main(["--compare", *pair, "--benchmark", str(bench), "--out",
                                 str(out), "--engine", "bm25s", "--max-obs-tokens", "4000"])
    data = json.loads(out.read_text())
    assert code == 0 and data["question"] == "who directed it" and data["em"] == [0, 1]
    assert [row["id"] for row in data["asked"]] == ["a", "b"]  # stops at the first found
    assert data["asked"][0]["em"] == [None, 0]  # A is asked only where B is right
    assert data["answers"][1].strip().lower() == said.lower()
    assert examples_module.load_compare_example(pair, out)["id"] == "b"
    assert examples_module.load_compare_example(pair[::-1], out) is None  # another pair
    (tmp_path / "broken.json").write_text("{not json")
    assert examples_module.load_compare_example(pair, tmp_path / "broken.json") is None


def launch_nano_studio(retriever, examples_file, monkeypatch):
    from app.ui import build_app, launch_options

    monkeypatch.setattr(examples_module, "EXAMPLES_FILE", examples_file)
    # The shipped Compare question was measured on the shipped pair, not on these stand-ins.
    monkeypatch.setattr(examples_module, "COMPARE_FILE", examples_file.parent / "none.json")
    pair = models.default_pair(NANO)
    demo = build_app(BackendOptions(device="cpu").load, retriever, default_model=NANO,
                     baseline_model=pair[0], compare_pair=pair)
    port = free_port()
    demo.launch(**launch_options(port=port, prevent_thread_lock=True, quiet=True))
    return demo, f"http://127.0.0.1:{port}/"


def component(demo, elem_id: str) -> dict:
    return next(c for c in demo.config["components"]
                if c.get("props", {}).get("elem_id") == elem_id)


def test_a_nano_studio_shows_its_examples_pair_and_what_the_model_is(
        nano_registry, tmp_path, local_retriever, monkeypatch):
    from gradio_client import Client

    examples_file = tmp_path / "ask_examples.json"
    examples_file.write_text(json.dumps({"examples": [
        {"question": "who directed the space film"}, {"question": "the Kubrick question"}]}))
    demo, url = launch_nano_studio(local_retriever, examples_file, monkeypatch)
    try:
        assert component(demo, "compare-model-a")["props"]["value"] == NANO_GRPO
        assert component(demo, "compare-model-b")["props"]["value"] == NANO_LLDS
        assert component(demo, "compare-question")["props"]["value"] == \
            "who directed the space film"
        info = component(demo, "ask-model-info")["props"]["value"]
        assert "Not an LLDS checkpoint" in info and "embedded default" in info
        dataset_values = [c["props"].get("samples") for c in demo.config["components"]
                          if c.get("type") == "dataset"]
        assert [["who directed the space film"], ["the Kubrick question"]] in dataset_values
        client = Client(url, verbose=False)  # the "nano" name loads the model behind it
        chat, stats, *_ = client.predict("who directed the space film", NANO, True, 0.7, 1.0,
                                         4, 3, 500, True, api_name="/ask")
        text = json.dumps(chat)
        assert "Model Nano (test) ready" in text
        assert "Search:" in text and "running" not in stats
    finally:
        demo.close()


def test_bundled_runs_plot_overlaid_and_say_what_they_are(tmp_path, monkeypatch,
                                                         local_retriever):
    from gradio_client import Client

    from app.ui import curves_tab
    from curves.synthetic import synthetic_run, write_console, write_jsonl

    root = tmp_path / "nano-runs"
    for folder in ("grpo", "llds-a", "notes", "collapse/llds-a-lr3e-4-seed0",
                   "sweep/grpo-lr3e-4-seed0"):
        (root / folder).mkdir(parents=True)  # "notes": a folder with no log is skipped
    # The logs name their runs otherwise than their folders, as the shipped ones do.
    write_console(root / "grpo" / "train.log", [("nano-grpo", synthetic_run("grpo", 120))])
    write_jsonl(root / "llds-a" / "metrics.jsonl", synthetic_run("llds", 120),
                name="nano-llds-a")
    (root / "llds-a" / "train.log").write_text("step:1 - x:1\n")  # metrics.jsonl preferred
    write_jsonl(root / "collapse" / "llds-a-lr3e-4-seed0" / "metrics.jsonl",
                synthetic_run("llds", 60), name="nano-llds-a-lambda0.2-lr0.0003-seed0")
    write_jsonl(root / "sweep" / "grpo-lr3e-4-seed0" / "metrics.jsonl",
                synthetic_run("grpo", 60), name="nano-grpo-lambda0-lr0.0003-seed0")
    (root / "grpo" / "command.txt").write_text("python -m nano rl --method grpo --seed 0\n")
    (root / "README.md").write_text("# Two runs (a null result)\n\nShort runs, no reward "
                                    "signal.\n\n## More\n\nDetails.\n")
    # The collapse experiment's runs first, then the sweep's 3e-4 run, then the rest.
    assert curves_tab.bundled_logs(root) == [
        root / "collapse" / "llds-a-lr3e-4-seed0" / "metrics.jsonl",
        root / "sweep" / "grpo-lr3e-4-seed0" / "metrics.jsonl",
        root / "grpo" / "train.log", root / "llds-a" / "metrics.jsonl"]
    names = ["collapse/llds-a-lr3e-4-seed0", "sweep/grpo-lr3e-4-seed0", "grpo", "llds-a"]
    monkeypatch.setattr(curves_tab, "BUNDLED_RUNS", root)
    from app.ui import build_app, launch_options

    demo = build_app(lambda model: None, local_retriever)
    port = free_port()
    demo.launch(**launch_options(port=port, prevent_thread_lock=True, quiet=True))
    try:
        assert component(demo, "curves-bundled")["props"]["visible"] is True
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        # The picker holds one entry an experiment with logs, the collapse regime first.
        picker = component(demo, "curves-group")["props"]
        groups = [c[0] for c in picker["choices"]]
        assert groups == [g for g, _ in curves_tab.BUNDLED_GROUPS
                          if g.startswith(("Collapse", "Learning", "Main"))]
        assert picker["value"] == groups[0]
        main = groups[-1]
        messages, details, summary, labels, marked, first_plot, *_ = client.predict(
            main, 0.6, True, "minmax", api_name="/curves_bundled")
        # Results first, in plain words; the details (each run, the settings) folded below.
        assert messages.startswith("**What they show.** " + curves_tab.MAIN_RUNS_FINDINGS)
        assert "made by this project on a CPU" in messages
        assert messages.count("not the paper's") == 1
        assert "- `grpo`: grpo, seed 0" in details  # from its command.txt
        assert str(tmp_path) not in messages + details  # no path of the machine
        shown = ["grpo", "llds-a"]  # the main group: the top-level run folders
        for run in shown:  # each run's likelihood, as measured, under its folder's name
            assert re.search(rf"`{run}` \(\w+, own samples\): likelihood highest at (the "
                             r"last step|step \d+, then [0-9.]+ (lower|higher) by step)",
                             details)
        # One name a run everywhere: its folder, not the name its log gives it.
        logged = re.compile(r"nano-(grpo|llds)")
        assert not logged.search(messages + details) and not logged.search(json.dumps(summary))
        assert [row[0] for row in summary["value"]["data"]] == shown
        assert "(set by the user)" not in messages + details
        methods = {row[0]: row[1] for row in labels["data"]}
        assert methods == {"grpo": "GRPO", "llds-a": "LLDS"}
        assert marked["value"] == "every run"  # two runs: every run's marks are drawn
        assert first_plot["visible"] is True
        figure = json.loads(first_plot["value"]["plot"])
        traces = " ".join(str(trace.get("name", "")) for trace in figure["data"])
        assert all(run in traces for run in shown)  # overlaid in one panel
        assert not logged.search(traces)
        # The other experiments, picked: their own runs and findings.
        messages, details, summary, *_ = client.predict(groups[0], 0.6, True, "minmax",
                                                        api_name="/curves_bundled")
        assert [row[0] for row in summary["value"]["data"]] == [names[0]]
        messages, *_ = client.predict(groups[1], 0.6, True, "minmax",
                                      api_name="/curves_bundled")
        assert messages.startswith("**What they show.** " + curves_tab.SWEEP_FINDINGS)
        # Relabel and Analyze again: the bundled runs are re-plotted with the new label.
        client.predict(main, 0.6, True, "minmax", api_name="/curves_bundled")
        messages, details, summary, labels, *_ = client.predict(
            None, {"headers": ["run", "method"],
                   "data": [[name, "LLDS" if name == "grpo" else methods[name]]
                            for name in shown]},
            0.6, True, "minmax", "", "every run", main, api_name="/curves")
        assert {row[0]: row[1] for row in labels["data"]}["grpo"] == "LLDS"
        assert {row[0]: row[1] for row in summary["value"]["data"]}["grpo"] == "LLDS"
        assert "made by this project" in messages
        # Only the label the user changed reads as set by the user.
        assert details.count("set by the user") == 1
        assert "grpo: LLDS (set by the user)" in details
    finally:
        demo.close()


def test_bundled_logs_take_the_collapse_runs_as_they_come(tmp_path):
    """The collapse experiment's folder fills run by run: a run with only its console log
    so far is read from it, one with no log yet is skipped, and more runs are picked up
    as they come, ahead of the sweep's run and the main runs."""
    from app.ui.curves_tab import bundled_logs, bundled_name

    root = tmp_path / "nano-runs"
    for folder in ("main-grpo-seed0", "sweep/grpo-lr1e-4-seed0", "sweep/grpo-lr3e-4-seed0",
                   "collapse/grpo-lr3e-4-seed0", "collapse/llds-a-lr3e-4-seed0"):
        (root / folder).mkdir(parents=True)
        (root / folder / "metrics.jsonl").write_text('{"step": 0}\n')
    (root / "collapse" / "llds-a-lr3e-4-seed0" / "metrics.jsonl").unlink()
    (root / "collapse" / "llds-a-lr3e-4-seed0" / "train.log").write_text("step:0\n")
    (root / "collapse" / "grpo-lr3e-4-seed1").mkdir()  # started, nothing logged yet
    names = [bundled_name(log, root) for log in bundled_logs(root)]
    assert names == ["collapse/grpo-lr3e-4-seed0", "collapse/llds-a-lr3e-4-seed0",
                     "sweep/grpo-lr3e-4-seed0", "main-grpo-seed0"]
    (root / "collapse" / "grpo-lr3e-4-seed1" / "metrics.jsonl").write_text('{"step": 0}\n')
    assert [bundled_name(log, root) for log in bundled_logs(root)][:3] == [
        "collapse/grpo-lr3e-4-seed0", "collapse/grpo-lr3e-4-seed1",
        "collapse/llds-a-lr3e-4-seed0"]


def test_without_bundled_runs_the_button_is_hidden(tmp_path, monkeypatch, local_retriever):
    from app.ui import build_app, curves_tab

    monkeypatch.setattr(curves_tab, "BUNDLED_RUNS", tmp_path / "none")
    demo = build_app(lambda model: None, local_retriever)
    assert component(demo, "curves-bundled")["props"]["visible"] is False
