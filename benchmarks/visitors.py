"""Many visitors at once against the studio, through its HTTP API, batched serving against
one question at a time in the same run.

    python -m benchmarks.visitors [--visitors 1,4,10,20] [--soak-minutes 10]
                                  [--model nano] [--questions assets/naturalqa/test.jsonl]
                                  [--turns 4] [--turn-tokens 500]
                                  [--client http|gradio_client]

For each way of serving (`--max-batch 16`, the default, and `--max-batch 1`, one question
of a model at a time as before batching) it starts `python app.py` offline on a loopback
port and:
1. asks the first 20 questions one at a time: the one-visitor latency, and each question's
   trajectory alone (the reference every later answer is checked against);
2. for each count in --visitors, that many visitors at once, each its own question, all
   asking at the same moment: p50 / p95 / max seconds from the ask to the final answer,
   errors, how many trajectories equal their question's alone (each visitor got their own
   answer), the app's peak RSS and CPU seconds, and the visitors' own CPU seconds;
3. with --soak-minutes (batched serving only), 4 visitors asking again and again for that
   long: the longest wait before a question started (its latency less its run time, from
   the stats line) against the longest run;
4. (batched serving, after the studio has stopped) the same rounds without HTTP or Gradio:
   the studio's ModelServer in this process, so the report says what the model itself needs
   (`--no-model-alone` skips it).
Goal: 20 visitors' p95 within 3x one visitor's p50, and in the soak no wait longer than twice
the longest run. Prints the CPU the figures came from.

A visitor (`--client`): `http` (the default) asks through Gradio's REST API
(`POST /gradio_api/call/ask`, then its event stream read to the end), as a browser or curl
does, reading only the final answer; `gradio_client` through a `gradio_client.Client`, which
parses every streamed update in Python. Both run on this machine beside the studio, so what
they spend is taken from it: a gradio_client per visitor costs far more (printed as the
visitors' CPU seconds), which real visitors spend on their own machines.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from agent.testing import ROOT, free_port, start_process, stop_process
from benchmarks.cpu import describe

# Ask's settings after the question and the model: greedy, temperature, top-p, turns, k,
# tokens a turn, the repetition stop; turns and tokens from --turns and --turn-tokens.
ASK = (True, 0.7, 1.0, 4, 3, 500, True)


RUN_SECONDS = re.compile(r"· ([\d.]+) s ·")


def settings(turns: int, turn_tokens: int) -> tuple:
    return (*ASK[:3], turns, ASK[4], turn_tokens, ASK[6])


class Studio:
    """`python app.py` on a loopback port, and its peak RSS while a round runs."""

    def __init__(self, model: str, max_batch: int):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.process = start_process(["app.py", "--port", str(self.port), "--model", model,
                                      "--max-batch", str(max_batch)], self.url, timeout=300,
                                     env={"HF_HUB_OFFLINE": "1"})
        self.peak = 0
        self._watching = False

    def rss(self) -> int:
        import psutil

        return psutil.Process(self.process.pid).memory_info().rss

    def watch(self) -> None:
        self.peak, self._watching = self.rss(), True

        def sample():
            while self._watching:
                self.peak = max(self.peak, self.rss())
                time.sleep(0.2)

        threading.Thread(target=sample, daemon=True).start()

    def unwatch(self) -> int:
        self._watching = False
        return self.peak

    def cpu_seconds(self) -> float:
        import psutil

        times = psutil.Process(self.process.pid).cpu_times()
        return times.user + times.system

    def close(self) -> None:
        stop_process(self.process)


def ask(url: str, question: str, model: str, how: tuple = ASK,
        client: str = "http") -> tuple[float, str, float | None, str | None]:
    """(seconds to the final answer, trajectory, run seconds from the stats line, error)."""
    return _asker(client, url)(question, model, how)


def _asker(client: str, url: str):
    """A visitor whose page is open: connected before it asks, as a browser that has loaded
    the page; the returned function asks one question and waits for the final answer."""
    if client == "gradio_client":
        from gradio_client import Client

        gradio = Client(url, verbose=False)

        def outputs(question: str, model: str, how: tuple) -> list:
            return list(gradio.predict(question, model, *how, api_name="/ask"))
    else:
        import httpx

        http = httpx.Client(base_url=url.rstrip("/"), timeout=600)

        def outputs(question: str, model: str, how: tuple) -> list:
            event = http.post("/gradio_api/call/ask",
                              json={"data": [question, model, *how]}).json()["event_id"]
            kind, data = None, None
            with http.stream("GET", f"/gradio_api/call/ask/{event}") as stream:
                for line in stream.iter_lines():
                    if line.startswith("event: "):
                        kind = line[len("event: "):]
                    elif line.startswith("data: ") and kind in ("complete", "error"):
                        data = line[len("data: "):]
            if kind != "complete":
                raise RuntimeError(f"the API answered {kind}: {data}")
            return json.loads(data)

    def one(question: str, model: str, how: tuple) -> tuple[float, str, float | None,
                                                             str | None]:
        started = time.perf_counter()
        try:
            _, stats, raw, *_ = outputs(question, model, how)
        except Exception as err:  # counted, not raised: an error is one of the figures
            return time.perf_counter() - started, "", None, f"{type(err).__name__}: {err}"
        seconds = time.perf_counter() - started
        if "failed to load" in (stats or ""):  # the studio's answer is the reason, not a run
            return seconds, "", None, f"the model failed to load: {stats}"
        found = RUN_SECONDS.search(stats or "")
        return seconds, raw or "", float(found.group(1)) if found else None, None

    return one


def at_once(url: str, questions: list[str], model: str, how: tuple,
            client: str) -> tuple[list[tuple], float]:
    """Every question asked by its own visitor at the same moment (pages opened first);
    (each visitor's `ask` result, the visitors' CPU seconds)."""
    askers = [_asker(client, url) for _ in questions]
    start = threading.Barrier(len(questions))
    cpu = time.process_time()

    def visitor(k: int) -> tuple:
        start.wait()
        return askers[k](questions[k], model, how)

    with ThreadPoolExecutor(len(questions)) as pool:
        results = list(pool.map(visitor, range(len(questions))))
    return results, time.process_time() - cpu


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def serve(mode: str, max_batch: int, args, questions: list[str]) -> dict:
    studio = Studio(args.model, max_batch)
    how = settings(args.turns, args.turn_tokens)
    try:
        ask(studio.url, questions[0], args.model, how, args.client)  # loaded and warm
        alone, latencies = {}, []
        studio.watch()
        cpu = studio.cpu_seconds()
        for question in questions[:max(args.visitors)]:
            seconds, trajectory, _, error = ask(studio.url, question, args.model, how,
                                                args.client)
            alone[question] = trajectory if error is None else None
            latencies.append(seconds)
        rounds = {1: summary(latencies, [alone[q] is not None for q in alone], [],
                             studio.unwatch(), studio.cpu_seconds() - cpu, None)}
        for count in [c for c in args.visitors if c > 1]:
            studio.watch()
            cpu = studio.cpu_seconds()
            results, visitors_cpu = at_once(studio.url, questions[:count], args.model, how,
                                            args.client)
            own = [trajectory == alone.get(q) and trajectory != ""
                   for q, (_, trajectory, _, _) in zip(questions, results, strict=False)]
            rounds[count] = summary([r[0] for r in results], own,
                                    [r[3] for r in results if r[3]], studio.unwatch(),
                                    studio.cpu_seconds() - cpu, visitors_cpu)
        soak = (run_soak(studio.url, args, questions) if args.soak_minutes and max_batch > 1
                else None)  # the soak: the studio as it serves (batched)
    finally:
        studio.close()
    alone = (model_alone(args, questions, max_batch) if max_batch > 1 and args.model_alone
             else None)  # after the studio has gone: one copy of the model at a time
    return {"mode": mode, "rounds": rounds, "soak": soak, "model_alone": alone}


def model_alone(args, questions: list[str], max_batch: int) -> dict:
    """The same rounds without HTTP or Gradio: the studio's `ModelServer` in this process
    (the model loaded as `python app.py` loads it), one question alone (the median of
    five), then every count in --visitors at once: what the model itself needs."""
    from agent.config import backend_options, make_retriever
    from agent.events import Finished
    from app.__main__ import parse_args
    from app.gguf_cache import studio_loader
    from app.ui.controls import settings_from_controls
    from app.ui.serving import ModelServer

    studio_args = parse_args(["--model", args.model])
    backend = studio_loader(backend_options(studio_args).load)(args.model)
    server = ModelServer(lambda: backend, make_retriever(studio_args), lambda: None,
                         lambda: None, max_batch)
    how = settings_from_controls(*settings(args.turns, args.turn_tokens))

    def answered(question: str) -> float:
        started = time.perf_counter()
        ticket = server.submit(question, how, threading.Event())
        while not isinstance(ticket.events.get(), Finished):
            pass
        return time.perf_counter() - started

    answered(questions[0])  # warm
    figures = {1: statistics.median(answered(q) for q in questions[:5])}
    for count in [c for c in args.visitors if c > 1]:
        with ThreadPoolExecutor(count) as pool:
            figures[count] = percentile(list(pool.map(answered, questions[:count])), 0.95)
    return figures


def summary(latencies: list[float], own: list[bool], errors: list[str], peak: int,
            studio_cpu: float, visitors_cpu: float | None) -> dict:
    return {"p50": statistics.median(latencies), "p95": percentile(latencies, 0.95),
            "max": max(latencies), "errors": len(errors), "own": sum(own),
            "asked": len(latencies), "peak_rss_gb": peak / 1e9, "studio_cpu_s": studio_cpu,
            "visitors_cpu_s": visitors_cpu, "first_error": errors[0] if errors else None}


def run_soak(url: str, args, questions: list[str]) -> dict:
    """4 visitors asking in turn for --soak-minutes: waits against runs."""
    deadline = time.monotonic() + 60 * args.soak_minutes
    waits, runs, errors = [], [], 0
    how = settings(args.turns, args.turn_tokens)
    lock = threading.Lock()

    def visitor(k: int) -> None:
        nonlocal errors
        n = k
        asker = _asker(args.client, url)
        while time.monotonic() < deadline:
            seconds, _, run, error = asker(questions[n % len(questions)], args.model, how)
            n += 4
            with lock:
                if error or run is None:
                    errors += 1
                else:
                    runs.append(run)
                    waits.append(max(0.0, seconds - run))

    threads = [threading.Thread(target=visitor, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"questions": len(runs), "errors": errors, "longest_wait": max(waits, default=0.0),
            "longest_run": max(runs, default=0.0), "wait_p95": percentile(waits, 0.95)
            if waits else 0.0}


def print_report(results: list[dict], args) -> None:
    print(f"{describe()}; model {args.model}; visitors {args.visitors}; at most "
          f"{args.turns} turns of {args.turn_tokens} tokens")
    print(f"visitors ask through {args.client}; CPU seconds: the studio's, and the "
          "visitors' own (on this machine too) in a round")
    print("| serving | visitors | p50 s | p95 s | max s | errors | own answer | peak RSS | "
          "studio CPU s | visitors' CPU s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for result in results:
        for count, r in result["rounds"].items():
            theirs = "" if r["visitors_cpu_s"] is None else f"{r['visitors_cpu_s']:.1f}"
            print(f"| {result['mode']} | {count} | {r['p50']:.2f} | {r['p95']:.2f} | "
                  f"{r['max']:.2f} | {r['errors']} | {r['own']}/{r['asked']} | "
                  f"{r['peak_rss_gb']:.2f} GB | {r['studio_cpu_s']:.1f} | {theirs} |")
    by_mode = {r["mode"]: r["rounds"] for r in results}
    top = max(args.visitors)
    for mode, rounds in by_mode.items():
        ratio = rounds[top]["p95"] / rounds[1]["p50"]
        print(f"{mode}: {top} visitors' p95 is {ratio:.1f}x one visitor's p50 "
              f"(goal <= 3x: {'met' if ratio <= 3 else 'not met'})")
    alone = next((r for r in results if r.get("model_alone")), None)
    if alone:
        floor, one = alone["model_alone"], alone["rounds"][1]["p50"]
        print(f"the model alone (batched in one process, no HTTP or Gradio): one question "
              f"{floor[1]:.2f} s, {top} at once p95 {floor[top]:.2f} s "
              f"({floor[top] / floor[1]:.1f}x), already {floor[top] / one:.1f}x the "
              f"studio's one visitor: what serving cannot go below on this CPU")
    if {"batched", "one at a time"} <= set(by_mode):
        print(f"one at a time / batched, p95 at {top} visitors: "
              f"{by_mode['one at a time'][top]['p95'] / by_mode['batched'][top]['p95']:.2f}x")
    for result in results:
        soak = result["soak"]
        if soak:
            ok = soak["longest_wait"] <= 2 * soak["longest_run"]
            print(f"{result['mode']} soak ({args.soak_minutes} min, 4 visitors): "
                  f"{soak['questions']} answered, {soak['errors']} errors, longest wait "
                  f"{soak['longest_wait']:.1f} s, wait p95 {soak['wait_p95']:.1f} s, longest run "
                  f"{soak['longest_run']:.1f} s (goal wait <= 2x run: "
                  f"{'met' if ok else 'not met'})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.visitors",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--visitors", default="1,4,10,20",
                        type=lambda s: sorted({int(x) for x in s.split(",")} | {1}))
    parser.add_argument("--soak-minutes", type=float, default=0.0)
    parser.add_argument("--model", default="nano")
    parser.add_argument("--questions", type=Path,
                        default=ROOT / "assets" / "naturalqa" / "test.jsonl")
    parser.add_argument("--modes", default="batched,one at a time")
    parser.add_argument("--client", choices=("http", "gradio_client"), default="http",
                        help="how a visitor asks: Gradio's REST API read to its final "
                             "answer (default), or a gradio_client.Client")
    parser.add_argument("--turns", type=int, default=ASK[3], help="Ask's turn limit")
    parser.add_argument("--turn-tokens", type=int, default=ASK[5],
                        help="Ask's tokens a turn (random-weight models never end a turn)")
    parser.add_argument("--no-model-alone", dest="model_alone", action="store_false",
                        help="skip the batched rounds without HTTP or Gradio (in this "
                             "process) that show what the model itself needs")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    lines = args.questions.read_text(encoding="utf-8").splitlines()
    questions = list(dict.fromkeys(json.loads(line)["question"] for line in lines if line))
    if len(questions) < max(args.visitors):
        parser.error(f"{args.questions} has {len(questions)} questions; --visitors asks for "
                     f"{max(args.visitors)}")
    modes = {"batched": 16, "one at a time": 1}
    results = [serve(mode, modes[mode], args, questions)
               for mode in args.modes.split(",") if mode in modes]
    print_report(results, args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
