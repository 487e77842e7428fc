"""How much of the model's token rate reaches a Gradio client, and how soon the first token.

A paced backend (a stand-in written here: the model is not what is measured) streams N
tokens at a fixed rate through the real app on loopback; a gradio_client reads the Ask endpoint and
timestamps each streamed update. Goal: client rate >= 95% of the backend's, and the first
token on the client < 200 ms after the backend emitted it ("first-token ms"; "submit→seen"
adds the client's connect and queue join).

    python -m benchmarks.ui [--tokens 300] [--rates 50,200]
"""

from __future__ import annotations

import argparse
import os
import re
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from agent import protocol  # noqa: E402
from agent.backends.base import TurnOutput  # noqa: E402

_TOKENS = re.compile(r"(\d+) tokens")


class TimedBackend:
    """Streams one fixed turn, a whitespace piece every `delay` seconds, noting when each
    piece left it. Tokens are whitespace pieces."""

    name = "paced"

    def __init__(self, text: str, delay: float):
        self.text = text
        self.delay = delay
        self.sent: list[float] = []

    def build_prompt(self, question: str) -> str:
        return protocol.build_prompt(question)

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def truncate(self, text: str, max_tokens: int) -> str:
        return text

    def stream(self, context, max_new_tokens, sampling, cancel=None):
        self.sent = []
        pieces = re.findall(r"\S+\s*", self.text)[:max_new_tokens]
        for n, piece in enumerate(pieces):
            if cancel is not None and cancel.is_set():
                yield TurnOutput("".join(pieces[:n]), n, "cancelled")
                return
            time.sleep(self.delay)
            self.sent.append(time.perf_counter())
            yield piece
        yield TurnOutput(protocol.cut_turn("".join(pieces)), len(pieces), "stop")


def measure(url: str, backend: TimedBackend, model: str) -> dict:
    from gradio_client import Client

    client = Client(url, verbose=False)
    started = time.perf_counter()
    job = client.submit("Benchmark question?", model, True, 0.7, 1.0, 1, 3, 1024, True,
                        api_name="/ask")
    seen: list[tuple[float, int]] = []
    last = -1
    while not job.done() or len(job.outputs()) > last + 1:
        outputs = job.outputs()
        for output in outputs[last + 1:]:
            stats = str(output[1])  # outputs: chat, stats, raw, export, model status
            match = _TOKENS.search(stats)
            if match and "running" in stats:  # streamed updates, not the closing summary
                seen.append((time.perf_counter(), int(match.group(1))))
        last = len(outputs) - 1
        time.sleep(0.002)
    seen = [(t, n) for t, n in seen if n > 0]
    sent = backend.sent
    backend_rate = (len(sent) - 1) / (sent[-1] - sent[0])
    (t0, n0), (t1, n1) = seen[0], seen[-1]
    client_rate = (n1 - n0) / (t1 - t0) if t1 > t0 else float("nan")
    return {"backend_rate": backend_rate, "client_rate": client_rate,
            "ratio": client_rate / backend_rate, "first_token_ms": 1000 * (t0 - sent[0]),
            "submit_to_first_ms": 1000 * (t0 - started), "updates": len(seen),
            "tokens": n1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=300)
    parser.add_argument("--rates", default="50,200", help="backend tokens/s to try")
    args = parser.parse_args()

    from agent.testing import free_port
    from app.ui import build_app, launch_options

    backends: dict[str, TimedBackend] = {}
    text = "<think> " + " ".join(f"w{i}" for i in range(args.tokens)) + " </think>" \
           "<answer> done </answer>"
    rates = [float(r) for r in args.rates.split(",")]
    for rate in rates:
        backends[f"bench/{rate:g}"] = TimedBackend(text, delay=1.0 / rate)
    demo = build_app(lambda model: backends[model], retriever=None)
    port = free_port()
    demo.launch(**launch_options(port=port, prevent_thread_lock=True, quiet=True))
    url = f"http://127.0.0.1:{port}/"
    try:
        print(f"{'backend tok/s':>14} {'client tok/s':>13} {'ratio':>7} {'first-token ms':>15} "
              f"{'submit→seen ms':>15} {'updates':>8}")
        for rate in rates:
            model = f"bench/{rate:g}"
            measure(url, backends[model], model)  # loads the model; not counted
            result = measure(url, backends[model], model)
            print(f"{result['backend_rate']:14.1f} {result['client_rate']:13.1f} "
                  f"{result['ratio']:7.1%} {result['first_token_ms']:15.0f} "
                  f"{result['submit_to_first_ms']:15.0f} {result['updates']:8d}")
            ok = result["ratio"] >= 0.95 and result["first_token_ms"] < 200
            print(f"  goal (>= 95%, < 200 ms): {'met' if ok else 'NOT met'}")
    finally:
        demo.close()


if __name__ == "__main__":
    main()
