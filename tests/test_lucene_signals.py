"""The in-process JVM leaves SIGINT and SIGTERM to Python.

A JVM that owns them answers either by calling exit() from one of its own threads while
Python's main thread keeps running: torch's static objects are destroyed under it
(SIGSEGV in torch's argument parser, "unknown parameter type"), or the exit handlers wait
for the GIL that the main thread holds while it waits on the JVM (a hang).
"""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.conftest import ROOT

CHILD = """
import signal
import time

# Python's own dispositions, whatever the test process left to inherit (a disposition set to
# "ignore" survives exec: the child would then never see the signal at all).
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGTERM, signal.SIG_DFL)
from retriever.pyserini_compat import java_max_heap_mb, load_lucene

load_lucene()
java_max_heap_mb()  # a call into the running JVM
try:
    print("ready", flush=True)  # inside the try: the signal may come as soon as it is out
    time.sleep(120)
except KeyboardInterrupt:
    print("keyboard interrupt", flush=True)
print("still running", flush=True)
time.sleep(120)
"""


def _wait_for(proc: subprocess.Popen, lines: queue.Queue, text: str, seconds: float) -> None:
    """Until the child prints `text`; fails if it ends or stays silent for `seconds`."""
    deadline = time.monotonic() + seconds
    seen: list[str] = []
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            pytest.fail(f"the child did not print {text!r} within {seconds} s (rc "
                        f"{proc.poll()}); it printed: {''.join(seen)[-2000:]}")
        if line is None:
            pytest.fail(f"the child ended (rc {proc.wait()}) before printing {text!r}; it "
                        f"printed: {''.join(seen)[-2000:]}")
        if text in line:
            return
        seen.append(line)


@pytest.mark.slow
def test_sigint_and_sigterm_reach_python_after_the_jvm_starts():
    pytest.importorskip("pyserini")
    proc = subprocess.Popen([sys.executable, "-c", CHILD], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue = queue.Queue()

    def read() -> None:
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    try:
        _wait_for(proc, lines, "ready", 120)
        proc.send_signal(signal.SIGINT)
        # Python's own handler: KeyboardInterrupt in the main thread, the process goes on.
        _wait_for(proc, lines, "still running", 20)
        proc.send_signal(signal.SIGTERM)
        # SIGTERM's default action: the kernel ends the process, no exit handlers run.
        assert proc.wait(timeout=20) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


THREADS = """
import os
import signal
from retriever.pyserini_compat import load_lucene

load_lucene()
open_to = []
for tid in os.listdir("/proc/self/task"):
    with open(f"/proc/self/task/{tid}/status") as status:
        fields = dict(line.split(":", 1) for line in status if ":" in line)
    blocked = int(fields["SigBlk"].split()[0], 16)
    if not blocked & (1 << (signal.SIGINT - 1)) or not blocked & (1 << (signal.SIGTERM - 1)):
        open_to.append(tid)
print(len(os.listdir("/proc/self/task")), open_to == [str(os.getpid())])
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_only_the_main_thread_takes_sigint_and_sigterm_once_the_jvm_runs():
    """The kernel gives a process's signal to any thread that does not block it: a JVM
    thread that took Ctrl-C left the main thread asleep through it (a flaky hang). Every
    JVM thread is started with the shutdown signals blocked; the main thread has them."""
    pytest.importorskip("pyserini")
    done = subprocess.run([sys.executable, "-c", THREADS], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    threads, only_main = done.stdout.split()[-2:]
    assert int(threads) > 5 and only_main == "True"  # the JVM's threads exist, all blocking
