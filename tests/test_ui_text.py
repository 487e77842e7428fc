"""What the studio's pages say, checked without a browser: icons that render with any font,
turn counts that match Max turns, the parameter count read from the model's weights, and a
model pool that loads one model at a time and retries a failed load."""

from __future__ import annotations

import re
import threading
import time

import pytest

from agent.backends.base import ModelLoadError
from agent.events import TurnStarted
from agent.models import ROOT, parameter_count
from app.ui import transcript as fold
from app.ui.model_pool import ModelPool
from tests.scripted_backend import ScriptedBackend

# Pictographs, dingbats and the emoji variation selector: without an emoji font (Debian's
# Chromium as installed) they show as empty boxes.
EMOJI = re.compile("[\u2600-\u27bf\u2b00-\u2bff\u23e9-\u23ff\ufe0f\U0001f000-\U0001faff]")


def test_no_page_text_uses_an_emoji_icon():
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
             for path in sorted((ROOT / "app").rglob("*.py"))
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if EMOJI.search(line)]
    assert found == []
    from tests.test_ui_render import run_events

    messages = fold.render(run_events())
    assert not any(EMOJI.search(str(m)) for m in messages)
    assert fold.THOUGHT_TITLE == "Thought" and "Search: 2001 director" in str(messages)


@pytest.mark.parametrize("turn, final, line", [(1, False, "Turn 1 of 4 "),
                                               (4, False, "Turn 4 of 4 "),
                                               (5, True, "Closing turn (no search) ")])
def test_the_turn_line_counts_to_max_turns(turn, final, line):
    transcript = fold.Transcript(now=lambda: 0.0)
    transcript.apply(TurnStarted(turn, 5, final))  # Max turns 4: 4 rounds with search + 1
    assert transcript.stats().line().startswith(line)


def test_parameter_count_is_read_from_the_weights():
    assert parameter_count("nano") == 4_200_960  # tied embeddings counted once
    assert parameter_count("Qwen/Qwen2.5-3B") is None  # not here: no figure
    from app.ui.context import Studio

    info = Studio(pool=ModelPool(lambda m: None), retriever=None).model_info("nano")
    assert "4.2M parameters" in info and "~5M" not in info


def test_pool_loads_one_model_at_a_time():
    loading, most = [], []

    def factory(model):
        loading.append(model)
        most.append(len(loading))
        time.sleep(0.2)
        loading.remove(model)
        return ScriptedBackend([])

    pool = ModelPool(factory)
    threads = [threading.Thread(target=pool.get, args=(m,)) for m in ("a/a", "b/b", "c/c")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert max(most) == 1 and all(pool.is_loaded(m) for m in ("a/a", "b/b", "c/c"))


def test_a_failed_load_is_tried_again():
    calls = []

    def factory(model):
        calls.append(model)
        if len(calls) == 1:
            raise RuntimeError("Cannot copy out of meta tensor")
        return ScriptedBackend([])

    pool = ModelPool(factory)
    with pytest.raises(ModelLoadError, match="meta tensor"):
        pool.get("a/a")
    assert pool.get("a/a") is not None and pool.status("a/a")[0] == "ready"


def test_start_up_warms_the_retriever_and_the_model_with_one_question(local_retriever):
    from app.ui.model_pool import warm_up_model

    class Counting:  # the real retriever, its searches counted
        engine = True

        def __init__(self):
            self.queries = []

        def search(self, queries, topk=3):
            self.queries += queries
            return local_retriever.search(queries, topk)

    asked = []

    def script(question: str, turn: int) -> str:
        asked.append(question)
        return ("<search> Kubrick </search>" if turn == 0
                else "<answer> Stanley Kubrick </answer>")

    retriever, pool = Counting(), ModelPool(lambda m: ScriptedBackend(script))
    warm_up_model(pool, "a/a", retriever, "Who directed 2001?").join(30)
    assert pool.is_loaded("a/a") and set(asked) == {"Who directed 2001?"}
    assert retriever.queries[0] == "warm up" and "Kubrick" in retriever.queries
    assert pool.hold("a/a", timeout=0.0)  # the warm-up gave its run slot back


def test_the_shipped_examples_are_answered_right_and_say_how_often():
    import json

    from app.ui.ask_tab import example_groups
    from app.ui.context import Studio
    from app.ui.examples import EXAMPLES_FILE, examples_score

    shipped = json.loads(EXAMPLES_FILE.read_text(encoding="utf-8"))
    golden = {}
    for line in (ROOT / shipped["benchmark"]).read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        golden[record["question"]] = [g.lower() for g in record["golden_answers"]]
    for example in shipped["examples"]:  # each one's recorded answer is a golden answer
        assert example["answer"].strip().lower() in golden[example["question"]]
    right, asked = examples_score()
    studio = Studio(pool=ModelPool(lambda m: None), retriever=None, default_model="nano")
    [(questions, label, _)] = example_groups(studio)
    assert questions == [e["question"] for e in shipped["examples"]]
    assert "answers right" in label and f"right {right} times in {asked}" in label


def test_a_failed_warm_up_load_still_warms_the_retriever_and_frees_the_model(local_retriever):
    from app.ui.model_pool import warm_up_model

    searched = []

    class Counting:
        engine = True

        def search(self, queries, topk=3):
            searched.extend(queries)
            return local_retriever.search(queries, topk)

    def factory(model):
        raise ModelLoadError("not cached")

    pool = ModelPool(factory)
    warm_up_model(pool, "a/a", Counting(), "q").join(30)
    assert searched == ["warm up"] and pool.status("a/a")[0] == "failed"
    assert pool.hold("a/a", timeout=0.0)  # the slot is free for the visitor's question
