"""The model pool: backends loaded on first use, one run per model at a time, and the
model-status events a run shows while it waits for its model.

No gradio import here: the browser-free tests drive these functions directly.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from agent.backends.base import Backend, ModelLoadError
from agent.loop import AgentSettings, run_agent
from agent.models import label, model_ref
from app.capacity import Capacity, Loaded
from app.gguf_cache import cached, reporting, runtime_problem
from app.ui.serving import DEFAULT_MAX_BATCH, ModelServer, Place, ticket_events

BackendFactory = Callable[[str], Backend]
# One model load at a time in this process: transformers' loader sets process-wide state
# while it builds a model (weights first made on the "meta" device, its lazy imports), and
# two loads in two threads leave each other's models without weights ("Cannot copy out of
# meta tensor") and can leave the loader broken for every later load.
LOAD_LOCK = threading.Lock()


@dataclass(frozen=True)
class ModelStatus:
    """A UI-side event: where loading (or waiting for) a model stands."""

    model: str
    state: str  # loading, ready, waiting, failed
    detail: str = ""
    seconds: float = 0.0


WARM_UP_QUERY = "warm up"


def _warm_retriever(retriever) -> None:
    try:
        retriever.search([WARM_UP_QUERY], 1)  # opens the engine and runs its first search
    except Exception:  # the first real search reports it to the user
        pass


def warm_up(retriever) -> threading.Thread:
    """Open an in-process engine and run one search in the background, so the first
    question doesn't wait for the index (or, for Lucene, the JVM) to start."""
    thread = threading.Thread(target=_warm_retriever, args=(retriever,),
                              name="retriever-warm-up", daemon=True)
    if hasattr(retriever, "engine"):
        thread.start()
    return thread


def warm_up_model(pool: ModelPool, model: str, retriever,
                  question: str | None) -> threading.Thread:
    """In the background: warm the retriever, load `model` into the pool and run the agent
    once on `question` (None: load only), so a visitor's first question is as fast as
    later ones. A visitor
    who asks meanwhile waits for the model as for any other run (the page says so); a
    failed load is left for that visitor's question to report (the pool keeps no
    failures)."""
    def work() -> None:
        # The run slot first: a question asked meanwhile waits for the warm model instead
        # of being the cold first run itself.
        pool.hold(model)
        try:
            try:
                backend = pool.get(model)  # first: the page says "loading" from the start
            except ModelLoadError:  # the visitor's question reports it
                backend = None
            if hasattr(retriever, "engine"):
                _warm_retriever(retriever)
            if backend is not None and question is not None:
                for _ in run_agent(question, backend, retriever, AgentSettings()):
                    pass
        except Exception:  # a warm-up failure must not take the studio down
            pass
        finally:
            pool.release(model)

    thread = threading.Thread(target=work, name="model-warm-up", daemon=True)
    thread.start()
    return thread


def on_gpu(fn: Callable) -> Callable:
    """`spaces.GPU(fn)` on Hugging Face ZeroGPU hardware; `fn` itself everywhere else."""
    try:
        import spaces  # type: ignore[import-not-found]
    except ImportError:
        return fn
    return spaces.GPU(duration=int(os.environ.get("LLDS_GPU_SECONDS", "120")))(fn)


@dataclass
class _Slot:
    load_lock: threading.Lock
    busy: threading.Semaphore
    backend: Backend | None = None
    state: str = "not loaded"  # not loaded, loading, ready, failed, unloaded (made room)
    detail: str = ""
    last_used: float = 0.0
    memory: int = 0  # bytes the loaded model takes, by estimate (0: not measured)


class ModelPool:
    """Backends by model id, loaded on first use, each behind its own locks.

    `per_model` runs may use one model at once: the visitors' questions to a model are one
    run (its `server`, which batches them, `max_batch` at once), an Evaluate run another;
    `max_loaded` models stay in memory, the least
    recently used idle one is dropped to make room. With a `capacity`, each load is checked
    against the memory and disk free at that moment, and least recently used idle models
    are dropped until the new one fits; one that can't fit is refused with the reason.
    """

    def __init__(self, factory: BackendFactory, per_model: int = 1, max_loaded: int = 2,
                 check: Callable[[str], str | None] | None = None,
                 capacity: Capacity | None = None, max_batch: int = DEFAULT_MAX_BATCH):
        self.factory = factory
        # Why a model may not be loaded here (the studio's access policy), or None.
        self.check = check
        self.capacity = capacity
        self.per_model = per_model
        self.max_loaded = max_loaded
        self._slots: dict[str, _Slot] = {}
        self._servers: dict[str, ModelServer] = {}
        self._lock = threading.Lock()
        self.max_batch = max_batch

    def server(self, model: str, retriever) -> ModelServer:
        """The model's line and batched runs (made on first use)."""
        model = model_ref(model)
        with self._lock:
            if model not in self._servers:
                self._servers[model] = ModelServer(
                    lambda: self.get(model), retriever, lambda: self.hold(model),
                    lambda: self.release(model), self.max_batch)
            return self._servers[model]

    def _slot(self, model: str) -> _Slot:
        with self._lock:
            if model not in self._slots:
                self._slots[model] = _Slot(threading.Lock(), threading.Semaphore(self.per_model))
            return self._slots[model]

    def refuse_if_not_allowed(self, model: str) -> None:
        """ModelLoadError when the access policy refuses `model` (before any slot exists, so
        a visitor can't fill the pool with names)."""
        if not model:
            raise ModelLoadError("No model named: pick one from the list.")
        problem = self.check(model) if self.check is not None else None
        if problem:
            raise ModelLoadError(problem)

    def status(self, model: str) -> tuple[str, str]:
        slot = self._slots.get(model)
        return (slot.state, slot.detail) if slot else ("not loaded", "")

    def is_loaded(self, model: str) -> bool:
        slot = self._slots.get(model)
        return slot is not None and slot.backend is not None

    def get(self, model: str) -> Backend:
        """The loaded backend (loading it now if needed); raises ModelLoadError. Loads run
        one at a time in the process (`LOAD_LOCK`); a failed load is not kept: the next
        call tries again."""
        model = model_ref(model)  # the name read once here; every step below reads its fields
        self.refuse_if_not_allowed(model)
        slot = self._slot(model)
        with slot.load_lock:
            if slot.backend is not None:
                slot.last_used = time.monotonic()
                return slot.backend
            slot.state, slot.detail = "loading", ""
            self._evict(keep=model)
            try:
                with LOAD_LOCK:  # one load at a time: the room it measures stays its own
                    slot.memory = self._make_room(model)
                    with reporting(lambda line: setattr(slot, "detail", line)):
                        backend = self.factory(model)  # a GGUF's conversion says how far
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
                    slot.backend, slot.state = None, "unloaded"
                finally:
                    slot.busy.release()

    def held(self) -> int:
        """Bytes the loaded models take, by estimate."""
        with self._lock:
            return sum(s.memory for s in self._slots.values() if s.backend is not None)

    def _loaded(self, model: str) -> list[tuple[float, str]]:
        """(last used, model) of the other loaded models, least recently used first."""
        with self._lock:
            return sorted((s.last_used, m) for m, s in self._slots.items()
                          if s.backend is not None and m != model)

    def hardware_problem(self, model: str) -> str | None:
        """Why `model` can't be loaded on this machine even with every other model dropped,
        or None (also without a capacity to check, or for a model already loaded). A GGUF
        needs llama.cpp, capacity or not."""
        if self.is_loaded(model):
            return None
        if model_ref(model).runs_on_llamacpp and runtime_problem():
            return f"run by llama.cpp, which {runtime_problem()}"
        if self.capacity is None:
            return None
        loaded = [Loaded(m, self._slots[m].memory) for _, m in self._loaded(model)]
        return self.capacity.ask(model, loaded).reason

    def _make_room(self, model: str) -> int:
        """Check, now, that `model` fits; drop the least recently used idle models whose room
        it needs. Its memory estimate (0 when unchecked or of unknown size); ModelLoadError
        with the reason when it can't fit."""
        if self.capacity is None:
            return 0
        loaded = self._loaded(model)
        taken = []  # the idle models' run slots, held so none starts while we decide
        try:
            for _, other in loaded:
                if self._slots[other].busy.acquire(blocking=False):
                    taken.append(other)
            fit = self.capacity.ask(model, [Loaded(m, self._slots[m].memory, m in taken)
                                            for _, m in loaded])
            if not fit.fits:
                in_use = (f" ({fit.busy} other model{'s' if fit.busy > 1 else ''} in use "
                          "now, which can't be unloaded)" if fit.busy else "")
                raise ModelLoadError(f"{label(model)} does not fit on this machine: "
                                     f"{fit.reason}{in_use}. Pick a smaller model.")
            for other in fit.evict:
                slot = self._slots[other]
                slot.backend, slot.state, slot.memory = None, "unloaded", 0
            if fit.evict:
                release_memory()
        finally:
            for other in taken:
                self._slots[other].busy.release()
        return fit.memory

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


def release_memory() -> None:
    """Return a dropped model's memory now: collect it, and empty torch's CUDA cache."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def status_markdown(pool: ModelPool, model: str) -> str:
    state, detail = pool.status(model.strip())
    name = label(model.strip())
    if state == "ready":
        return f"**{name}**: loaded."
    if state == "loading":
        return f"**{name}**: loading… {detail}".rstrip()
    if state == "failed":
        return f"**{name}**: could not be loaded. {detail}"
    if state == "unloaded":  # dropped to make room for another (Compare's two, say)
        return f"**{name}**: unloaded to make room for another model; loads again on its " \
               "next question."
    return f"**{name}**: loads on first question."


def run_model(pool: ModelPool, model: str, question: str, retriever, settings: AgentSettings,
              cancel: threading.Event) -> Iterator:
    """Load (with status events), wait for the model to be free, then run the agent."""
    model = model.strip()
    try:
        pool.refuse_if_not_allowed(model)
    except ModelLoadError as err:
        yield ModelStatus(model, "failed", str(err))
        return
    if not pool.is_loaded(model):
        started = time.perf_counter()
        try:
            yield from _loading(pool, model)
        except ModelLoadError as err:
            yield ModelStatus(model, "failed", str(err), time.perf_counter() - started)
            return
        seconds = time.perf_counter() - started
        yield ModelStatus(model, "ready", f"Loaded in {seconds:.1f} s.", seconds)
    if zero_gpu():  # a ZeroGPU Space: the GPU is lent to one request's own thread
        yield from _run_alone(pool, model, question, retriever, settings, cancel)
        return
    server = pool.server(model, retriever)
    waited = False
    for item in ticket_events(server, server.submit(question, settings, cancel)):
        if isinstance(item, Place):
            waited = True
            yield ModelStatus(model, "waiting", f"Waiting for this model: {item.words()}")
        elif isinstance(item, ModelLoadError):
            yield ModelStatus(model, "failed", str(item))
        else:
            if waited:
                waited = False
                yield ModelStatus(model, "ready", "Your question's turn: it runs now.")
            yield item


def _run_alone(pool: ModelPool, model: str, question: str, retriever,
               settings: AgentSettings, cancel: threading.Event) -> Iterator:
    """One run holding the model for all its turns (no batching)."""
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


def zero_gpu() -> bool:
    """On Hugging Face ZeroGPU hardware (its `spaces` package is installed)."""
    import importlib.util

    return importlib.util.find_spec("spaces") is not None


def first_load_note(model: str) -> str:
    if model_ref(model).gguf_type is not None and cached(model) is None:
        return ("The first use converts this checkpoint to a GGUF for llama.cpp (fetching "
                "it first if it is not here): minutes for a 3B model. Progress shows here.")
    return "The first question loads the model; this can take a while for a big checkpoint."


def _loading(pool: ModelPool, model: str, every: float = 1.0) -> Iterator[ModelStatus]:
    """Load `model` in a thread, saying every `every` seconds what the load is doing (a
    GGUF's conversion reports each step); ModelLoadError as `pool.get` raises it."""
    failure: list[BaseException] = []

    def load() -> None:
        try:
            pool.get(model)
        except BaseException as err:  # handed to the caller's thread
            failure.append(err)

    yield ModelStatus(model, "loading", first_load_note(model))
    worker = threading.Thread(target=load, name="model-load", daemon=True)
    worker.start()
    shown = ""
    while worker.is_alive():
        worker.join(every)
        state, detail = pool.status(model)
        if state == "loading" and detail and detail != shown:
            shown = detail
            yield ModelStatus(model, "loading", f"{first_load_note(model)} Now: {detail}.")
    if failure:
        raise failure[0]


@on_gpu
def agent_stream(question: str, backend: Backend, retriever, settings: AgentSettings,
                 cancel: threading.Event) -> Iterator:
    """The agent loop; on ZeroGPU this is the part that holds the GPU."""
    yield from run_agent(question, backend, retriever, settings, cancel)
