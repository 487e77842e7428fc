"""What the UI needs besides widgets: a pool of lazily loaded models, run cancellation,
and a pump that moves an agent's events from a worker thread to a Gradio generator.

No gradio import here: the browser-free tests drive these functions directly.
"""

from __future__ import annotations

import contextvars
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from agent.backends.base import Backend, ModelLoadError
from agent.loop import AgentSettings, run_agent
from app.ui.render import ModelStatus

MAX_QUESTION_CHARS = 2000
BackendFactory = Callable[[str], Backend]
BACKENDS = ("transformers", "openai")


# Settings and input checks --------------------------------------------------------------
def validate_question(question: str | None) -> str | None:
    """Why the question can't be asked (a message for the user), or None when it can."""
    text = (question or "").strip()
    if not text:
        return "Please type a question first."
    if len(text) > MAX_QUESTION_CHARS:
        return (f"That question is {len(text):,} characters long; the limit is "
                f"{MAX_QUESTION_CHARS:,}. Please shorten it.")
    return None


def settings_from_controls(greedy: bool, temperature: float, top_p: float, max_turns: int,
                           topk: int, max_new_tokens: int) -> AgentSettings:
    """The Ask tab's controls as agent settings (sliders hand over floats)."""
    return AgentSettings(max_turns=int(max_turns), topk=int(topk),
                         max_new_tokens=int(max_new_tokens), greedy=bool(greedy),
                         temperature=max(float(temperature), 1e-3), top_p=float(top_p))


def settings_summary(settings: AgentSettings) -> dict:
    sampling = ("greedy" if settings.greedy
                else f"temperature {settings.temperature:g}, top-p {settings.top_p:g}")
    return {"decoding": sampling, "max_turns": settings.max_turns, "topk": settings.topk,
            "max_new_tokens": settings.max_new_tokens}


# Backends and retrievers ----------------------------------------------------------------
def make_backend_factory(kind: str = "transformers", device: str = "auto",
                         base_url: str | None = None) -> BackendFactory:
    """A function model-id -> loaded backend, for `--backend`."""
    if kind == "transformers":
        def load(model: str) -> Backend:
            from agent.backends.hf import TransformersBackend

            return TransformersBackend(model, device=device)

        return load
    if kind == "openai":
        def connect(model: str) -> Backend:
            from agent.backends.openai_compat import OpenAIBackend

            return OpenAIBackend(model, base_url=base_url or "http://127.0.0.1:8001/v1")

        return connect
    raise ValueError(f"Unknown backend {kind!r}: choose one of {', '.join(BACKENDS)}.")


def warm_up(retriever) -> threading.Thread:
    """Open an in-process engine in the background, so the first question doesn't wait."""
    def work() -> None:
        try:
            _ = retriever.engine
        except Exception:  # noqa: BLE001 - the first search reports it to the user
            pass

    thread = threading.Thread(target=work, name="retriever-warm-up", daemon=True)
    if hasattr(retriever, "engine"):
        thread.start()
    return thread


def on_gpu(fn: Callable) -> Callable:
    """`spaces.GPU(fn)` on Hugging Face ZeroGPU hardware; `fn` itself everywhere else."""
    try:
        import spaces  # type: ignore[import-not-found]
    except ImportError:
        return fn
    return spaces.GPU(duration=int(os.environ.get("LLDS_GPU_SECONDS", "120")))(fn)


# The model pool -------------------------------------------------------------------------
@dataclass
class _Slot:
    load_lock: threading.Lock
    busy: threading.Semaphore
    backend: Backend | None = None
    state: str = "not loaded"  # not loaded, loading, ready, failed
    detail: str = ""
    last_used: float = 0.0


class ModelPool:
    """Backends by model id, loaded on first use, each behind its own locks.

    `per_model` runs may use one model at once (1: a run holds the model for all its
    turns, so its KV cache stays valid); `max_loaded` models stay in memory, the least
    recently used idle one is dropped to make room.
    """

    def __init__(self, factory: BackendFactory, per_model: int = 1, max_loaded: int = 2):
        self.factory = factory
        self.per_model = per_model
        self.max_loaded = max_loaded
        self._slots: dict[str, _Slot] = {}
        self._lock = threading.Lock()

    def _slot(self, model: str) -> _Slot:
        with self._lock:
            if model not in self._slots:
                self._slots[model] = _Slot(threading.Lock(), threading.Semaphore(self.per_model))
            return self._slots[model]

    def status(self, model: str) -> tuple[str, str]:
        slot = self._slots.get(model)
        return (slot.state, slot.detail) if slot else ("not loaded", "")

    def is_loaded(self, model: str) -> bool:
        slot = self._slots.get(model)
        return slot is not None and slot.backend is not None

    def get(self, model: str) -> Backend:
        """The loaded backend (loading it now if needed); raises ModelLoadError."""
        model = model.strip()
        slot = self._slot(model)
        with slot.load_lock:
            if slot.backend is not None:
                slot.last_used = time.monotonic()
                return slot.backend
            slot.state, slot.detail = "loading", ""
            self._evict(keep=model)
            try:
                backend = self.factory(model)
            except ModelLoadError as err:
                slot.state, slot.detail = "failed", str(err)
                raise
            except Exception as err:  # any loader failure is a message, not a crash
                slot.state, slot.detail = "failed", f"{type(err).__name__}: {err}"
                raise ModelLoadError(slot.detail) from err
            slot.backend, slot.state, slot.detail = backend, "ready", ""
            slot.last_used = time.monotonic()
            return backend

    def _evict(self, keep: str) -> None:
        with self._lock:
            loaded = [(s.last_used, m) for m, s in self._slots.items()
                      if s.backend is not None and m != keep]
        for _, model in sorted(loaded)[:max(0, len(loaded) - self.max_loaded + 1)]:
            slot = self._slots[model]
            if slot.busy.acquire(blocking=False):  # only idle models are dropped
                try:
                    slot.backend, slot.state = None, "not loaded"
                finally:
                    slot.busy.release()

    def hold(self, model: str, cancel: threading.Event | None = None,
             timeout: float | None = None) -> bool:
        """Take one of the model's run slots, giving up when `cancel` is set."""
        slot = self._slot(model.strip())
        deadline = None if timeout is None else time.monotonic() + timeout
        while not slot.busy.acquire(timeout=0.1):
            if (cancel is not None and cancel.is_set()) or (
                    deadline is not None and time.monotonic() > deadline):
                return False
        return True

    def release(self, model: str) -> None:
        self._slot(model.strip()).busy.release()


def status_markdown(pool: ModelPool, model: str) -> str:
    from agent.models import label

    state, detail = pool.status(model.strip())
    name = label(model.strip())
    if state == "ready":
        return f"**{name}**: loaded."
    if state == "loading":
        return f"**{name}**: loading…"
    if state == "failed":
        return f"**{name}**: could not be loaded. {detail}"
    return f"**{name}**: loads on first question."


def run_model(pool: ModelPool, model: str, question: str, retriever, settings: AgentSettings,
              cancel: threading.Event) -> Iterator:
    """Load (with status events), wait for the model to be free, then run the agent."""
    model = model.strip()
    if not pool.is_loaded(model):
        yield ModelStatus(model, "loading", "The first question loads the model; this can "
                          "take a while for a big checkpoint.")
        started = time.perf_counter()
        try:
            pool.get(model)
        except ModelLoadError as err:
            yield ModelStatus(model, "failed", str(err), time.perf_counter() - started)
            return
        seconds = time.perf_counter() - started
        yield ModelStatus(model, "ready", f"Loaded in {seconds:.1f} s.", seconds)
    waited = False
    if not pool.hold(model, cancel, timeout=0.0):
        waited = True
        yield ModelStatus(model, "waiting", "Another run is using this model; yours starts "
                          "when it ends.")
        if not pool.hold(model, cancel):
            return
    try:
        if waited:
            yield ModelStatus(model, "ready", "The model is free: your run starts.")
        backend = pool.get(model)
        yield from agent_stream(question, backend, retriever, settings, cancel)
    except ModelLoadError as err:
        yield ModelStatus(model, "failed", str(err))
    finally:
        pool.release(model)


@on_gpu
def agent_stream(question: str, backend: Backend, retriever, settings: AgentSettings,
                 cancel: threading.Event) -> Iterator:
    """The agent loop; on ZeroGPU this is the part that holds the GPU."""
    yield from run_agent(question, backend, retriever, settings, cancel)


# Runs and their Stop buttons ------------------------------------------------------------
class RunRegistry:
    """The cancel event of each browser session's current run, by (session, slot)."""

    def __init__(self):
        self._runs: dict[tuple[str, str], tuple[threading.Event, threading.Event]] = {}
        self._lock = threading.Lock()

    def start(self, session: str, slot: str) -> tuple[threading.Event, threading.Event]:
        """(cancel, done) for a new run; a run still going in the same slot is cancelled."""
        with self._lock:
            old = self._runs.get((session, slot))
            if old is not None:
                old[0].set()
            events = (threading.Event(), threading.Event())
            self._runs[(session, slot)] = events
            return events

    def finish(self, session: str, slot: str, events: tuple) -> None:
        events[1].set()
        with self._lock:
            if self._runs.get((session, slot)) == events:
                del self._runs[(session, slot)]

    def stop(self, session: str, slots: tuple[str, ...], wait: float = 0.0) -> int:
        """Cancel the session's runs in `slots`; wait up to `wait` s for them to end."""
        with self._lock:
            found = [self._runs[(session, s)] for s in slots if (session, s) in self._runs]
        for cancel, _ in found:
            cancel.set()
        deadline = time.monotonic() + wait
        for _, done in found:
            done.wait(max(0.0, deadline - time.monotonic()))
        return len(found)


_END = object()


def pump(streams: Mapping[str, Iterator], cancel: threading.Event | None = None,
         min_interval: float = 0.02) -> Iterator[list[tuple[str, object]]]:
    """Run each stream in a worker thread; yield batches of (name, item) as they come.

    A batch holds everything that arrived since the last one, so a UI slower than the model
    falls behind by at most one render, never by a growing backlog. When the consumer stops
    early (a closed generator, Gradio's cancel), `cancel` is set so the workers end too.
    """
    inbox: queue.Queue = queue.Queue()

    def work(name: str, stream: Iterator) -> None:
        try:
            for item in stream:
                inbox.put((name, item))
        except BaseException as err:  # noqa: BLE001 - handed to the consumer
            inbox.put((name, err))
        finally:
            inbox.put((name, _END))

    threads = []
    for name, stream in streams.items():
        context = contextvars.copy_context()  # request context, for spaces.GPU
        thread = threading.Thread(target=context.run, args=(work, name, stream), daemon=True,
                                  name=f"agent-{name}")
        thread.start()
        threads.append(thread)
    open_streams = len(threads)
    last = 0.0
    try:
        while open_streams:
            batch = [inbox.get()]
            wait = min_interval - (time.perf_counter() - last)
            if wait > 0:
                time.sleep(wait)
            while True:
                try:
                    batch.append(inbox.get_nowait())
                except queue.Empty:
                    break
            items, error = [], None
            for name, item in batch:
                if item is _END:
                    open_streams -= 1
                elif isinstance(item, BaseException):
                    error = error or item
                else:
                    items.append((name, item))
            if items:
                last = time.perf_counter()
                yield items
            if error is not None:
                raise error
    finally:
        if open_streams and cancel is not None:
            cancel.set()
