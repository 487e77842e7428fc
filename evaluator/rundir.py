"""The run directory `runs/NAME/`: the one module that reads or writes one.

- `settings.json`: what the numbers depend on (`run_settings`, built here for the CLI and
  the Evaluate tab alike). A stored run with other settings is refused, never mixed,
  except that a run grows: a larger `--limit` or `--sample` (same seed), or the full
  split, selects a superset of its questions, so the run continues (`selection_change`).
  A smaller selection is refused: a run never shrinks. Its `provenance` lists where the
  numbers come from, one entry per session whose environment differed from the last
  (`with_provenance`). It carries `RUN_MARKER`: only a directory whose settings.json has
  it is one of ours.
- `<dataset>.jsonl`: one `Record` per finished question, appended as it finishes. A kill
  can cut the last line: `repair_tail` drops it before appending, `read_jsonl` skips it.
  A damaged line elsewhere is skipped too (`damaged_lines` names it) and left in place.
  Resuming skips the ids already there, except those that ended in an error.
- `summary.json`, `summary.csv`, `summary.md`: written whole by `save_summary` (each via a
  temporary file and a rename, so a reader never sees half a file); stale once more results
  come in, so `prepare_run_dir` removes them.
- `.evaluator.lock`: locked (`hold_run_dir`) by the one process writing the run. Only a
  plain file holding a pid is taken as ours; a link or anything else under that name is
  refused, never followed or emptied.

Only these files are ever removed, only from a marked run directory, and only under names
this module makes (`<dataset>.jsonl` for a plain dataset name, the summaries):
`check_run_dir` validates without touching anything and says what a start would remove;
`apply_run_dir` then does it. Anything else is refused. The record, the files and these
rules are one contract, which is why they live in one module.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import stat
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from agent.events import Finished
from agent.loop import AgentSettings
from evaluator.benchmarks import BENCHMARK_NAMES, BENCHMARKS, Question
from evaluator.metrics import score_prediction

# Settings that change the numbers: a stored run with other values is not resumed. The
# selection (`limit`, `sample`) may grow instead (`selection_change`).
COMPARED = ("model", "backend", "retriever", "max_turns", "topk", "max_new_tokens",
            "max_obs_tokens", "greedy", "temperature", "top_p", "seed", "stop_on_eos",
            "on_context_full")
# How `evaluator.benchmarks.select` draws `--sample N`: the first N of a seeded shuffle, so a
# larger sample of one seed holds every question of a smaller one. Stored with a sample.
SAMPLE_RULE = "seeded shuffle, first N"
SUMMARY_FILES = ("summary.json", "summary.csv", "summary.md")
# In every settings.json this module writes; a directory without it is not ours to change.
RUN_MARKER = ("written_by", "evaluator")
LOCK_FILE = ".evaluator.lock"
# A dataset name becomes a file name in the run directory: no separators, no leading dot.
_DATASET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class RunDirError(ValueError):
    """The output directory cannot take this run; the message says why and what to do."""


class RunMismatch(RunDirError):
    """The output directory holds a run made with other settings."""


class RunDirBusy(RunDirError):
    """Another process holds the run directory's lock."""


# ---------------------------------------------------------------------------- records


@dataclass(frozen=True)
class Record:
    """One answered question, as the runner writes it: one JSON line of `<dataset>.jsonl`."""

    id: str
    dataset: str
    question: str
    golden_answers: list[str]
    prediction: str | None  # what was scored (`prediction_of`); None: no answer
    metrics: dict[str, float]  # em, sub_em, f1, retrieval_recall, computed once, here
    answered: bool
    failure: str | None  # why the agent broke down (None: it answered)
    searches: int
    turns: int
    invalid_actions: int
    new_tokens: int
    seconds: float
    stop_reason: str
    response: str = ""
    trajectory: str = ""
    retrieved: list[str] = field(default_factory=list)
    error: str | None = None
    context_cuts: int = 0  # turns generated from a left-cut context (Finished.context_cuts)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "") -> Record:
        """A record read back; a line that lacks a field says which and where."""
        names = {f.name for f in fields(cls)}
        required = [f.name for f in fields(cls)
                    if f.default is MISSING and f.default_factory is MISSING]
        missing = [name for name in required if name not in data]
        if missing:
            raise ValueError(f"{where or 'a record'}: not a result record of this evaluator "
                             f"(no {', '.join(missing)}); re-run the questions to rewrite it.")
        return cls(**{**{k: v for k, v in data.items() if k in names}, "id": str(data["id"])})


def prediction_of(finished: Finished) -> str | None:
    """The answer a run is scored on: the agent's own (`Finished.answer`, computed once from
    the model's turns by `agent.protocol.answer_of`), never re-derived from the text."""
    return finished.answer


def failure_reason(finished: Finished) -> str | None:
    if finished.stop_reason == "answer":
        return None
    if finished.stop_reason in ("context_full", "error"):
        return finished.stop_reason
    if finished.invalid_actions and not finished.searches:
        return "invalid_action"
    if finished.stop_reason == "max_turns":
        return "max_turns"
    return "no_answer"


def make_record(question: Question, finished: Finished) -> Record:
    """The record of a finished question: prediction and metrics computed here, once."""
    prediction = prediction_of(finished)
    return Record(
        id=question.id, dataset=question.dataset, question=question.question,
        golden_answers=list(question.golden_answers), prediction=prediction,
        metrics=score_prediction(prediction, question.golden_answers, finished.retrieved),
        answered=prediction is not None, failure=failure_reason(finished),
        searches=finished.searches, turns=finished.turns,
        invalid_actions=finished.invalid_actions, new_tokens=finished.new_tokens,
        seconds=round(finished.seconds, 3), stop_reason=finished.stop_reason,
        response=finished.response, trajectory=finished.trajectory,
        retrieved=list(finished.retrieved), error=finished.error,
        context_cuts=finished.context_cuts)


# ---------------------------------------------------------------------------- files


def _scan_jsonl(path: str | Path) -> tuple[list[dict[str, Any]], list[int]]:
    """(the JSON objects of a JSON-lines file, the numbers of its damaged lines). A damaged
    last line is a kill mid-write, not damage; it is skipped without being counted."""
    lines = Path(path).read_bytes().split(b"\n")
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    objects: list[dict[str, Any]] = []
    damaged: list[int] = []
    for index, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            value = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            value = None
        if isinstance(value, dict):
            objects.append(value)
        elif index != last:
            damaged.append(index + 1)
    return objects, damaged


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The objects of a JSON-lines file; lines that are not whole JSON objects (a killed
    run's last line, a damaged one) are skipped."""
    return _scan_jsonl(path)[0]


def damaged_lines(path: str | Path) -> list[int]:
    """Line numbers of `path` that are not whole JSON objects, a cut last line aside."""
    return _scan_jsonl(path)[1] if Path(path).is_file() else []


def read_results(path: str | Path) -> list[Record]:
    """The records of one `<dataset>.jsonl`, in file order."""
    return [Record.from_dict(obj, f"{path}:{number}")
            for number, obj in enumerate(read_jsonl(path), start=1)]


def repair_tail(path: Path) -> None:
    """Drop a half-written last line (a kill mid-write) so appends start on a fresh line."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    data = path.read_bytes()
    if not data.endswith(b"\n"):
        path.write_bytes(data[: data.rfind(b"\n") + 1])


def finished_ids(path: Path) -> set[str]:
    """Ids with a result; a question that ended in an error (a retriever outage, say) is
    not finished and runs again on resume (reports keep each id's last record)."""
    repair_tail(path)
    if not path.is_file():
        return set()
    return {str(r["id"]) for r in read_jsonl(path) if r.get("stop_reason") != "error"}


def append_record(out, record: Record) -> None:
    """One line per record, flushed: on disk before the next question, so a kill loses
    nothing that finished."""
    out.write(json.dumps(record.to_dict(), ensure_ascii=False) + "\n")
    out.flush()


def _write_atomic(path: Path, text: str) -> None:
    """Write a file whole: a temporary file, synced, renamed over the old one, so a kill
    leaves either the old file or the new one, never half of either."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with temporary.open("w", encoding="utf-8") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)


# ---------------------------------------------------------------------------- settings


def run_settings(model: str, backend: str, retriever: str, settings: AgentSettings, *,
                 seed: int, limit: int | None, sample: int | None,
                 datasets: list[str],
                 expected: Mapping[str, int] | None = None) -> dict[str, Any]:
    """settings.json for a run: every setting in COMPARED, the datasets and, when known, how
    many questions each has under the selection (`expected`: a run is complete at that)."""
    stored = {"model": model, "backend": backend, "retriever": retriever,
              "max_turns": settings.max_turns, "topk": settings.topk,
              "max_new_tokens": settings.max_new_tokens,
              "max_obs_tokens": settings.max_obs_tokens, "greedy": settings.greedy,
              "temperature": settings.temperature, "top_p": settings.top_p, "seed": seed,
              "limit": limit, "sample": sample,
              "sample_rule": SAMPLE_RULE if sample is not None else None,
              "stop_on_eos": settings.stop_on_eos,
              "on_context_full": settings.on_context_full, "datasets": list(datasets)}
    if expected is not None:
        stored["expected"] = dict(expected)
    return stored


def read_settings(run_dir: str | Path) -> dict[str, Any]:
    """The run's settings.json, or {} when it is missing (an interrupted or hand-made run);
    RunDirError when it is there but not a JSON object."""
    path = Path(run_dir) / "settings.json"
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RunDirError(
            f"{path} is not a JSON settings file ({error}), so {path.parent} is not a run "
            "directory of this evaluator. Nothing was changed: move that file away, or pass "
            "another --output.") from None
    if not isinstance(data, dict):
        raise RunDirError(f"{path} holds a JSON {type(data).__name__}, not a run's settings; "
                          f"{path.parent} is not a run directory of this evaluator. Nothing "
                          "was changed: pass another --output.")
    return data


@dataclass(frozen=True)
class RunDirPlan:
    """What starting a run in `run_dir` will do: the settings.json to write and the files
    of an earlier run to remove (only ever files this evaluator wrote)."""

    run_dir: Path
    settings: dict[str, Any]
    remove: tuple[Path, ...] = ()


def _listing(paths: list[Path], limit: int = 5) -> str:
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in paths)
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more"
                                       if len(names) > limit else "")


def check_run_dir(run_dir: str | Path, settings: dict[str, Any],
                  overwrite: bool = False) -> RunDirPlan:
    """Validate `run_dir` for a run with `settings` without touching it (RunDirError).

    A missing or empty directory takes a new run; a run directory with the same settings is
    resumed (its stale summaries go), or grown when the selection is a superset of its own
    (`selection_change`); with other settings it is refused unless `overwrite`,
    which removes that run's settings, `<dataset>.jsonl` files and summaries, nothing else.
    Anything else (a file, a directory of other things) is refused.
    """
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"--output {run_dir} is a file, not a directory; pass a directory "
                          "(it is created when missing).")
    for name in settings.get("datasets", []):
        if not _is_dataset_name(name):
            raise RunDirError(
                f"{name!r} is not a dataset name this evaluator can store (it names the "
                f"results file {name}.jsonl in {run_dir}): use letters, digits, '.', '_' and "
                "'-' only, starting with a letter or digit.")
    stored_path = run_dir / "settings.json"
    if not stored_path.exists():
        present = [p for p in run_dir.iterdir() if p.name != LOCK_FILE] \
            if run_dir.is_dir() else []
        if present:
            raise RunDirError(
                f"{run_dir} is not a run directory of this evaluator (no settings.json) and "
                f"is not empty ({_listing(present)}). Nothing was changed: pass a new or empty "
                "directory as --output.")
        return RunDirPlan(run_dir, settings)
    stored = read_settings(run_dir)
    key, value = RUN_MARKER
    if stored.get(key) != value or not isinstance(stored.get("datasets", []), list):
        raise RunDirError(
            f"{stored_path} was not written by this evaluator (it lacks \"{key}\": "
            f"\"{value}\"), so {run_dir} is not a run directory of this evaluator. Nothing "
            "was changed, and --overwrite does not apply to it: pass a new or empty "
            "directory as --output.")
    stored_names = [n for n in stored.get("datasets", []) if _is_dataset_name(n)]
    ours = [run_dir / f"{n}.jsonl" for n in stored_names]
    ours += [run_dir / n for n in SUMMARY_FILES]
    ours = [p for p in ours if p.is_file()]
    if overwrite:
        return RunDirPlan(run_dir, settings, tuple(ours))
    if stored.get("sample") is not None and stored.get("sample_rule") != SAMPLE_RULE:
        raise RunMismatch(
            f"{run_dir} holds a --sample run drawn by an earlier rule, so this version would "
            "draw other questions for it. Use another --output, or --overwrite to discard "
            "that run's results.")
    grows = selection_change(stored, settings, run_dir) == "grow"
    diffs = [f"{k}: stored {stored.get(k)!r}, now {settings.get(k)!r}"
             for k in COMPARED if stored.get(k) != settings.get(k)]
    if diffs:
        raise RunMismatch(
            f"{run_dir} holds a run with other settings ({'; '.join(diffs)}). Use another "
            "--output, or --overwrite to discard that run's results (its settings.json, "
            "<dataset>.jsonl files and summaries; nothing else in the directory).")
    if grows:
        left_out = [n for n in stored_names if n not in settings.get("datasets", [])]
        if left_out:
            raise RunMismatch(
                f"{run_dir} would grow from {describe_selection(stored)} to "
                f"{describe_selection(settings)}, but a run grows as a whole and this command "
                f"leaves out {', '.join(left_out)}: name every dataset of the run "
                f"(--datasets {','.join(dict.fromkeys([*stored_names, *settings['datasets']]))}).")
    foreign = [run_dir / f"{n}.jsonl" for n in settings.get("datasets", [])
               if n not in stored_names and (run_dir / f"{n}.jsonl").exists()]
    if foreign:
        raise RunDirError(
            f"{run_dir} holds {_listing(foreign)}, which this run did not write; results would "
            "be appended to it. Nothing was changed: move it away or pass another --output.")
    merged = {**settings,
              "datasets": list(dict.fromkeys([*stored_names, *settings.get("datasets", [])]))}
    if "expected" in stored or "expected" in settings:
        merged["expected"] = {**stored.get("expected", {}), **settings.get("expected", {})}
    if isinstance(stored.get("provenance"), list):
        merged["provenance"] = stored["provenance"]
    stale = tuple(p for p in ours if p.name in SUMMARY_FILES)  # once more results come in
    return RunDirPlan(run_dir, merged, stale)


def _selection(settings: Mapping[str, Any]) -> tuple[str, int | None]:
    if settings.get("limit") is not None:
        return "limit", int(settings["limit"])
    if settings.get("sample") is not None:
        return "sample", int(settings["sample"])
    return "all", None


def describe_selection(settings: Mapping[str, Any]) -> str:
    kind, count = _selection(settings)
    if kind == "limit":
        return f"the first {count} questions per dataset (--limit {count})"
    if kind == "sample":
        return (f"a sample of {count} questions per dataset, seed {settings.get('seed')} "
                f"(--sample {count})")
    return "every question of each dataset (no --limit or --sample)"


def selection_change(stored: Mapping[str, Any], new: Mapping[str, Any],
                     run_dir: str | Path = "RUN") -> str | None:
    """None when `new` selects the same questions as `stored`; "grow" when it selects a
    superset (a larger limit, a larger sample of the same seed, or the full split), so the
    run continues; RunMismatch when it would select fewer or other questions."""
    before, after = _selection(stored), _selection(new)
    if before == after:
        return None
    if after[0] == "all" or (before[0] == after[0] and after[1] > before[1]):  # type: ignore
        return "grow"
    if after[0] == before[0] or before[0] == "all":
        raise RunMismatch(
            f"{run_dir} holds {describe_selection(stored)}; {describe_selection(new)} would "
            "select fewer, and a run never shrinks. Report on it as it is (python -m "
            f"evaluator report {run_dir}), raise the value to grow it, or use another "
            "--output.")
    raise RunMismatch(
        f"{run_dir} holds {describe_selection(stored)}; {describe_selection(new)} is another "
        "selection rule and would pick other questions. Keep the run's rule (a larger "
        "value grows it), or use another --output (--overwrite discards the run).")


def with_provenance(plan: RunDirPlan, entry: Mapping[str, Any]) -> RunDirPlan:
    """The plan with this session's provenance: appended to the run's list unless it is the
    same as the last entry apart from the date (a plain resume adds nothing)."""
    history = [p for p in plan.settings.get("provenance", []) if isinstance(p, dict)]
    undated = {k: v for k, v in entry.items() if k != "date"}
    if not history or {k: v for k, v in history[-1].items() if k != "date"} != undated:
        history.append(dict(entry))
    return replace(plan, settings={**plan.settings, "provenance": history})


def _is_dataset_name(name: Any) -> bool:
    return isinstance(name, str) and _DATASET_NAME.fullmatch(name) is not None


def apply_run_dir(plan: RunDirPlan) -> None:
    """Carry out a checked plan: remove the earlier run's files, write settings.json whole
    (with the marker that makes the directory ours)."""
    for path in plan.remove:
        path.unlink(missing_ok=True)
    plan.run_dir.mkdir(parents=True, exist_ok=True)
    key, value = RUN_MARKER
    _write_atomic(plan.run_dir / "settings.json",
                  json.dumps({**plan.settings, key: value}, indent=2) + "\n")


# What the lock file holds once this module has written it: a pid and a newline (or nothing,
# if a holder was killed between creating and writing it). Anything else is not ours.
_LOCK_TEXT = re.compile(rb"\d{0,20}\n?")


def _open_lock(path: Path) -> int:
    """A descriptor on the lock file at `path`, created when missing; RunDirError, with
    nothing changed, when the name holds anything but the plain file this module makes.

    O_NOFOLLOW: a symbolic link at that name is refused, never followed, so the file it
    points to is neither locked nor truncated. No O_TRUNC: a file is emptied only once it
    is known to be ours, and locked. O_NONBLOCK: a FIFO there cannot hang the open."""
    def not_ours(reason: str) -> RunDirError:
        return RunDirError(f"{path} {reason}, so it is not the lock file this evaluator makes; "
                           "nothing was changed. Move it away, or pass another --output.")

    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        descriptor = os.open(path, flags, 0o644)
    except OSError as error:
        if error.errno == errno.ELOOP or path.is_symlink():
            raise RunDirError(
                f"{path} is a symbolic link, not the lock file this evaluator makes; it was "
                "not followed and nothing was changed (the link and what it points to are "
                "as they were). Remove the link, or pass another --output.") from None
        if error.errno == errno.EISDIR:
            raise not_ours("is not a regular file (a directory)") from None
        raise RunDirError(f"cannot create {path} ({error.strerror or error}); pass an "
                          "--output directory you can write to.") from None
    try:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):
            raise not_ours("is not a regular file")
        if status.st_nlink != 1:  # a hard link: the same bytes live under another name
            raise not_ours(f"has {status.st_nlink} names (a hard link to another file)")
        if not _LOCK_TEXT.fullmatch(os.pread(descriptor, 64, 0)):
            raise not_ours("holds something other than the pid this evaluator writes")
        return descriptor
    except BaseException:
        os.close(descriptor)
        raise


@contextmanager
def hold_run_dir(run_dir: str | Path) -> Iterator[None]:
    """Hold `run_dir`'s lock (an exclusive `flock` on LOCK_FILE, created with the directory
    when missing) for the body; RunDirBusy naming the holder's pid when another process has
    it, RunDirError when that name holds something this module did not make (a link, a
    directory, another file), which is left as it is. The OS drops the lock when its holder
    exits, however it exits; the file stays."""
    run_dir = Path(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise RunDirError(f"cannot create {run_dir / LOCK_FILE} ({error.strerror or error}); "
                          "pass an --output directory you can write to.") from None
    descriptor = _open_lock(run_dir / LOCK_FILE)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(descriptor, 32, 0).decode("ascii", "replace").strip()
            raise RunDirBusy(
                f"another evaluator (pid {holder or 'unknown'}) is writing to {run_dir}; "
                "nothing was changed. Wait for it to finish (or stop it), or pass another "
                "--output.") from None
        os.ftruncate(descriptor, 0)  # ours (checked on this descriptor) and locked by us
        os.pwrite(descriptor, f"{os.getpid()}\n".encode("ascii"), 0)
        yield
    finally:
        os.close(descriptor)


def prepare_run_dir(run_dir: Path, settings: dict[str, Any], overwrite: bool = False) -> None:
    """Check, then create, resume or reset `run_dir` (`check_run_dir` says what is refused)."""
    apply_run_dir(check_run_dir(run_dir, settings, overwrite))


# ---------------------------------------------------------------------------- a stored run


@dataclass
class StoredRun:
    """A run directory read back: its settings and its records per dataset."""

    path: Path
    settings: dict[str, Any]
    records: dict[str, list[Record]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.path.name


def dataset_order(name: str) -> tuple[int, str]:
    return (BENCHMARK_NAMES.index(name) if name in BENCHMARKS else len(BENCHMARK_NAMES), name)


def load_run(run_dir: str | Path) -> StoredRun:
    """A run's settings and its records per dataset, in benchmark order.

    Any `*.jsonl` named after a benchmark counts, and any other whose records carry
    golden answers (a custom set); a resumed run may repeat an id, the last one wins.
    """
    path = Path(run_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"No run directory {path}")
    run = StoredRun(path=path, settings=read_settings(path))
    for file in sorted(path.glob("*.jsonl"), key=lambda f: dataset_order(f.stem)):
        objects = read_jsonl(file)
        if not objects:
            continue  # a dataset the runner has only just opened
        if file.stem not in BENCHMARKS and "golden_answers" not in objects[0]:
            continue
        by_id: dict[str, Record] = {}
        for number, obj in enumerate(objects, start=1):
            record = Record.from_dict(obj, f"{file}:{number}")
            by_id[record.id] = record
        run.records[file.stem] = list(by_id.values())
    return run


def save_summary(run_dir: str | Path, summary: Mapping[str, Any], markdown: str,
                 csv_text: str) -> None:
    """summary.json, summary.csv and summary.md, each written whole."""
    run_dir = Path(run_dir)
    _write_atomic(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    _write_atomic(run_dir / "summary.csv", csv_text)
    _write_atomic(run_dir / "summary.md", markdown)
