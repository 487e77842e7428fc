"""Many visitors through the studio's HTTP API on loopback (gradio_client), as the load
benchmark drives it: each call answered with its own result or a clear refusal."""

from __future__ import annotations

import concurrent.futures
import re

from agent.testing import free_port
from tests.scripted_backend import ScriptedBackend
from tests.test_serving import by_question

ASK_SETTINGS = (True, 0.7, 1.0, 4, 3, 500, True)  # greedy, temp, top-p, turns, k, tokens, repeats


def launch(delay: float):
    from app.ui import build_app, launch_options

    backend = ScriptedBackend(by_question, delay=delay)

    class NoDocuments:
        def search(self, queries, topk=3):
            return [[] for _ in queries]

    demo = build_app(lambda model: backend, NoDocuments(), default_model="test/llds",
                     baseline_model="test/grpo")
    port = free_port()
    demo.launch(**launch_options(port=port, prevent_thread_lock=True, quiet=True))
    return demo, f"http://127.0.0.1:{port}/", backend


def answer_of(result) -> str:
    chat = result[0]
    return str(chat[-1]["content"]) if chat else ""


def test_one_client_four_calls_one_answer_three_clear_refusals():
    from gradio_client import Client

    demo, url, _ = launch(delay=0.05)
    try:
        client = Client(url, verbose=False)  # one client: one session
        jobs = [client.submit(f"question about topic{i}", "test/llds", *ASK_SETTINGS,
                              api_name="/ask") for i in range(4)]
        answers, refusals = [], []
        for job in jobs:
            try:
                answers.append(answer_of(job.result(timeout=60)))
            except Exception as err:  # the app's refusal, as gradio_client raises it
                assert type(err).__name__ == "AppError", repr(err)
                refusals.append(str(err))
        assert len(answers) == 1 and "topic" in answers[0]
        assert len(refusals) == 3 and all("already has a question running in Ask" in r
                                          for r in refusals)
    finally:
        demo.close()


def test_twenty_clients_each_get_their_own_answer_from_shared_batches():
    from gradio_client import Client

    demo, url, backend = launch(delay=0.02)
    try:
        def visit(i: int) -> str:
            client = Client(url, verbose=False)
            return answer_of(client.predict(f"question about topic{i}", "test/llds",
                                             *ASK_SETTINGS, api_name="/ask"))

        with concurrent.futures.ThreadPoolExecutor(20) as pool:
            answers = list(pool.map(visit, range(20)))
        for i, answer in enumerate(answers):  # their own, and only their own
            assert re.findall(r"topic\d+", answer) == [f"topic{i}"], answer
        assert max(backend.batch_sizes) >= 4  # visitors shared turns
    finally:
        demo.close()
