"""The seven Search-R1 QA benchmarks as data, and loaders for the places they live.

Three sources, in the order a user is likely to have them:
  1. the FlashRAG packaging on the Hugging Face Hub (`RUC-NLPIR/FlashRAG_datasets`);
  2. a local directory of FlashRAG-style files (`--data-dir`);
  3. Search-R1's merged `test.parquet` (the file its own evaluation script reads).
Sets shipped in the repository (`LOCAL_BENCHMARKS`) load offline from `assets/`.
Heavy libraries (datasets, pandas) are imported only by the loader that needs them.
The loaders share the record normalisation, the split preference, the size checks and the
parquet memory guard, which is why they live in one module.
"""

from __future__ import annotations

import json
import random
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HUB_DATASET = "RUC-NLPIR/FlashRAG_datasets"
# Search-R1 takes each benchmark's test split, else dev, else train.
SPLIT_PREFERENCE = ("test", "dev", "train")
FILE_SUFFIXES = (".jsonl", ".json", ".parquet")


@dataclass(frozen=True)
class Benchmark:
    name: str
    split: str
    size: int  # the full split as FlashRAG packages it
    in_domain: bool  # NQ and HotpotQA train were the training data


BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in (
        Benchmark("nq", "test", 3610, True),
        Benchmark("triviaqa", "test", 11313, False),
        Benchmark("popqa", "test", 14267, False),
        Benchmark("hotpotqa", "dev", 7405, True),
        Benchmark("2wikimultihopqa", "dev", 12576, False),
        Benchmark("musique", "dev", 2417, False),
        Benchmark("bamboogle", "test", 125, False),
    )
}
BENCHMARK_NAMES = tuple(BENCHMARKS)
# Sets shipped in the repository (offline, no --data-dir): the nano agent's held-out
# questions on the embedded corpus. Not part of --all, which means the paper's seven.
LOCAL_BENCHMARKS: dict[str, Path] = {
    "vitalqa": Path(__file__).resolve().parent.parent / "assets",
    "naturalqa": Path(__file__).resolve().parent.parent / "assets",
}
IN_DOMAIN = tuple(b.name for b in BENCHMARKS.values() if b.in_domain)
OUT_OF_DOMAIN = tuple(b.name for b in BENCHMARKS.values() if not b.in_domain)


@dataclass
class Question:
    id: str
    dataset: str
    question: str
    golden_answers: list[str]
    metadata: dict[str, Any] = field(default_factory=dict)


class DataError(Exception):
    """A benchmark could not be loaded; the message says what to do about it."""


class DataWarning(UserWarning):
    """A benchmark loaded but is not what the published protocol used (size, split)."""


def where_to_put_files(name: str) -> str:
    split = BENCHMARKS[name].split if name in BENCHMARKS else "test"
    return (
        f"Put the FlashRAG file at DIR/{name}/{split}.jsonl (or DIR/{name}.jsonl; .json and "
        f".parquet also work; records with id, question, golden_answers) and pass "
        f"--data-dir DIR, or pass --merged-parquet PATH to Search-R1's merged test.parquet. "
        f"The sets shipped with the studio need neither: --datasets {','.join(LOCAL_BENCHMARKS)}."
    )


# ---------------------------------------------------------------------------- records


def _plain(value: Any) -> Any:
    """numpy arrays / scalars from parquet into plain Python lists and values."""
    if hasattr(value, "tolist"):
        value = value.tolist()  # an object array's items (dicts) still need converting
        if not isinstance(value, list):
            return value
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _preview(value: Any, width: int = 60) -> str:
    """A short repr for an error message: enough to find the record, never the whole of it."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def _answers(value: Any, where: str = "a record") -> list[str]:
    """Golden answers as strings: a string or a list of strings. Anything else in the list
    (a number, null, a nested list) is refused: turned into text it would score against
    "None" or "1" rather than the answer meant."""
    value = _plain(value)
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list | tuple):
        for position, answer in enumerate(value):
            if not isinstance(answer, str):
                kind = "null" if answer is None else type(answer).__name__
                raise DataError(
                    f"{where}: golden_answers[{position}] is {kind} ({_preview(answer)}), not "
                    "a string; write every golden answer as a string (e.g. "
                    f"\"golden_answers\": {json.dumps([str(answer)[:40]])}) and remove "
                    "the ones that are not answers.")
        return list(value)
    raise DataError(
        f"{where}: golden_answers is a {type(value).__name__} ({_preview(value)}), not a list "
        f"of strings; write it as a list, e.g. \"golden_answers\": [\"{value}\"].")


def question_from_record(record: Any, dataset: str, index: int,
                         where: str | None = None) -> Question:
    """A FlashRAG record (`id`, `question`, `golden_answers`, `metadata`) as a Question.

    `where` names the record in errors (`path:line`, or `path record N`)."""
    where = where or f"{dataset} record {index}"
    if not isinstance(record, Mapping):
        raise DataError(
            f"{where}: a record must be a JSON object with id, question and golden_answers; "
            f"this one is a {type(record).__name__} ({_preview(record)}). Fix or remove it.")
    golden = record.get("golden_answers")
    if golden is None:  # some hand-made files say answers/answer
        golden = record.get("answers", record.get("answer"))
    if record.get("question") is None:
        raise DataError(f"{where}: no 'question' field (fields: {', '.join(map(str, record))}); "
                        "every record needs one.")
    metadata = _plain(record.get("metadata")) or {}
    return Question(
        id=str(record.get("id") if record.get("id") is not None else f"{dataset}_{index}"),
        dataset=dataset,
        question=str(record["question"]),
        golden_answers=_answers(golden, where),
        metadata=metadata if isinstance(metadata, dict) else {"metadata": metadata},
    )


def read_data_file(path: Path) -> list[tuple[str, Any]]:
    """(where, record) pairs of a .jsonl, .json (a list, {"data": [...]}, or JSON lines) or
    .parquet file; `where` names the record in messages (`path:line` or `path record N`)."""
    path = Path(path)
    if path.suffix == ".parquet":
        frame = read_parquet_guarded(path, DATA_COLUMNS)
        return [(f"{path} record {i}", _plain(r))
                for i, r in enumerate(frame.to_dict("records"))]
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise DataError(f"{path}:{line}: not UTF-8 text (byte {data[error.start]:#04x} at offset "
                        f"{error.start}); save the file as UTF-8 and try again.") from None
    if path.suffix == ".json":
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError:
            parsed = None  # FlashRAG ships JSON lines under .json names too
        if isinstance(parsed, dict) and isinstance(parsed.get("data"), list):
            parsed = parsed["data"]
        if isinstance(parsed, list):
            return [(f"{path} record {i}", r) for i, r in enumerate(parsed)]
        if isinstance(parsed, dict):
            return [(f"{path} record 0", parsed)]
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                records.append((f"{path}:{number}", json.loads(line)))
            except json.JSONDecodeError as error:
                raise DataError(f"{path}:{number}: not valid JSON ({error}); fix or remove "
                                "that line.") from error
    return records


# ---------------------------------------------------------------------------- parquet guard

# Columns a question can come from (a FlashRAG file or Search-R1's merged parquet); nothing
# else in a parquet file is read, so a wide file does not cost memory for columns unused.
DATA_COLUMNS = ("id", "question", "golden_answers", "answers", "answer", "metadata")
MERGED_COLUMNS = ("id", "data_source", "question", "prompt", "reward_model", "golden_answers",
                  "extra_info", "metadata")


@dataclass(frozen=True)
class ParquetLimits:
    """What a parquet file may expand to in memory. The file size says nothing: repeated
    values compress to almost nothing, and a dictionary stores a value once however many
    rows refer to it. Both limits are checked before anything large is materialised."""

    rows: int = 1_000_000  # the largest Search-R1 file (the merged test set) has ~51k
    columns: int = 1_000
    decoded_bytes: int = 512 * 2**20


def _text_leaves(data_type: Any, prefix: str) -> list[str]:
    """Paths of the string/binary leaves under a column, in parquet's naming (`a.list.element`)
    as `read_dictionary` takes them: those are read as dictionaries, never decoded row by row."""
    import pyarrow as pa

    if pa.types.is_string(data_type) or pa.types.is_binary(data_type) or \
            pa.types.is_large_string(data_type) or pa.types.is_large_binary(data_type):
        return [prefix]
    if pa.types.is_dictionary(data_type):
        return _text_leaves(data_type.value_type, prefix)
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        return _text_leaves(data_type.value_type, f"{prefix}.list.element")
    if pa.types.is_struct(data_type):
        return [leaf for child in data_type for leaf in _text_leaves(child.type,
                                                                     f"{prefix}.{child.name}")]
    return []


def decoded_nbytes(array: Any) -> int:
    """Bytes `array` takes once every row is materialised: a dictionary's values counted once
    per row that refers to them (arrow's own `nbytes` counts them once in all)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(array, pa.ChunkedArray):
        return sum(decoded_nbytes(chunk) for chunk in array.chunks)
    if isinstance(array, pa.DictionaryArray):
        values = array.dictionary
        if not len(values):
            return array.indices.nbytes
        if pa.types.is_string(values.type) or pa.types.is_binary(values.type) or \
                pa.types.is_large_string(values.type) or pa.types.is_large_binary(values.type):
            offset = 8 if "large" in str(values.type) else 4
            sizes = pc.add(pc.binary_length(values).cast(pa.int64()).fill_null(0), offset)
        else:  # numbers and nested values: their mean size per value
            sizes = pa.array([-(-decoded_nbytes(values) // len(values))] * len(values),
                             pa.int64())
        per_row = pc.take(sizes, array.indices.fill_null(0))
        return int(pc.sum(per_row).as_py() or 0) + array.indices.nbytes
    if isinstance(array, pa.ListArray | pa.LargeListArray):
        return array.offsets.nbytes + decoded_nbytes(array.flatten())
    if isinstance(array, pa.StructArray):
        return sum(decoded_nbytes(array.field(i)) for i in range(array.type.num_fields))
    return array.nbytes


def _plain_type(data_type: Any) -> Any:
    """`data_type` with every dictionary replaced by its value type."""
    import pyarrow as pa

    if pa.types.is_dictionary(data_type):
        return _plain_type(data_type.value_type)
    if pa.types.is_list(data_type):
        return pa.list_(_plain_type(data_type.value_type))
    if pa.types.is_large_list(data_type):
        return pa.large_list(_plain_type(data_type.value_type))
    if pa.types.is_struct(data_type):
        return pa.struct([child.with_type(_plain_type(child.type)) for child in data_type])
    return data_type


def read_parquet_guarded(path: Path, wanted: Iterable[str],
                         limits: ParquetLimits = ParquetLimits()) -> Any:
    """The `wanted` columns of a parquet file as a pandas DataFrame, or a DataError that
    names the file and the limit it breaks.

    Checked in order, each before the next costs memory: rows and columns (the metadata);
    the pages' uncompressed size (the metadata: bounds plainly encoded values); then, reading
    text as dictionaries in small batches, the decoded size of every row (a running total)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    wanted = set(wanted)
    try:
        schema = pq.read_schema(path)
        meta = pq.read_metadata(path)
    except (pa.ArrowException, OSError) as error:
        raise DataError(f"{path}: not a parquet file ({error}); pass a .parquet written by "
                        "pandas or pyarrow, or a .jsonl file.") from None
    if meta.num_rows > limits.rows or len(schema.names) > limits.columns:
        raise DataError(
            f"{path}: {meta.num_rows:,} rows x {len(schema.names):,} columns, over the limit of "
            f"{limits.rows:,} rows and {limits.columns:,} columns for a benchmark file; split "
            "the file or keep only the questions you want to score.")
    columns = [name for name in schema.names if name in wanted]
    limit_text = f"{limits.decoded_bytes / 2**20:.0f} MB"

    def too_big() -> DataError:
        return DataError(
            f"{path}: the columns {', '.join(columns)} expand to over {limit_text} in memory "
            f"(the limit for a benchmark file; the file is {path.stat().st_size / 2**20:.2f} MB "
            "compressed); split the file or shorten its records.")

    pages = sum(meta.row_group(g).column(c).total_uncompressed_size
                for g in range(meta.num_row_groups) for c in range(meta.num_columns)
                if meta.row_group(g).column(c).path_in_schema.split(".")[0] in wanted)
    if pages > limits.decoded_bytes:
        raise too_big()
    text = [leaf for name in columns for leaf in _text_leaves(schema.field(name).type, name)]
    batches, decoded = [], 0
    try:
        handle = pq.ParquetFile(path, read_dictionary=text)
        for batch in handle.iter_batches(batch_size=1024, columns=columns):
            decoded += sum(decoded_nbytes(column) for column in batch.columns)
            if decoded > limits.decoded_bytes:
                raise too_big()
            batches.append(batch)
        schema = pa.schema([handle.schema_arrow.field(name) for name in columns])
        table = pa.Table.from_batches(batches, schema=schema)
        plain = pa.schema([field.with_type(_plain_type(field.type)) for field in table.schema])
        table = table.cast(plain)
    except (pa.ArrowException, OSError) as error:
        raise DataError(f"{path}: the parquet file is damaged ({error}); write it again.") from None
    return table.to_pandas()


# ---------------------------------------------------------------------------- sources


def local_candidates(data_dir: Path, name: str) -> list[Path]:
    """Files that may hold `name` under data_dir, best first (split preference, suffix)."""
    data_dir = Path(data_dir)
    paths = [data_dir / name / f"{split}{suffix}" for split in SPLIT_PREFERENCE
             for suffix in FILE_SUFFIXES]
    paths += [data_dir / f"{name}{suffix}" for suffix in FILE_SUFFIXES]
    return paths


def load_local(data_dir: Path, name: str) -> tuple[list[Question], str | None, Path]:
    """Questions from a FlashRAG-style directory: (questions, split found or None, path)."""
    for path in local_candidates(data_dir, name):
        if path.is_file():
            split = path.stem if path.parent.name == name else None
            records = read_data_file(path)
            if not records:
                raise DataError(f"{path} holds no records (the file is empty or has only "
                                "blank lines); write the questions into it, one JSON object "
                                "per line with id, question and golden_answers.")
            questions = [question_from_record(r, name, i, where)
                         for i, (where, r) in enumerate(records)]
            return questions, split, path
    raise DataError(f"No file for {name!r} in {data_dir}. {where_to_put_files(name)}")


def local_benchmark_file(name: str) -> Path:
    """The file a set shipped in the repository (`LOCAL_BENCHMARKS`) is loaded from."""
    if name not in LOCAL_BENCHMARKS:
        raise DataError(f"{name!r} is not a set shipped in the repository "
                        f"({', '.join(LOCAL_BENCHMARKS)}).")
    for path in local_candidates(LOCAL_BENCHMARKS[name], name):
        if path.is_file():
            return path
    raise DataError(f"The shipped {name!r} file is missing under {LOCAL_BENCHMARKS[name]}; "
                    "restore it from the repository (git checkout assets).")


def load_hub(name: str, split: str) -> list[Question]:
    """Questions from the FlashRAG packaging on the Hub (or the local datasets cache)."""
    import os

    import datasets

    from agent.models import hub_reachable

    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    if not offline and not hub_reachable():  # seconds, not half a minute of retries
        raise DataError(
            f"Could not load {name!r} ({split}) from the Hugging Face Hub ({HUB_DATASET}): "
            "the Hub cannot be reached (if the dataset is in your local cache, set "
            f"HF_HUB_OFFLINE=1 to use it). {where_to_put_files(name)}")
    try:
        rows = datasets.load_dataset(HUB_DATASET, name, split=split)
    except (ConnectionError, OSError) as error:
        raise DataError(
            f"Could not load {name!r} ({split}) from the Hugging Face Hub ({HUB_DATASET}): "
            f"the Hub is unreachable and the dataset is not cached ({error}). "
            f"{where_to_put_files(name)}"
        ) from error
    except Exception as error:  # a missing config or split, a bad cache: say which
        raise DataError(
            f"Could not load {name!r} ({split}) from {HUB_DATASET}: {error}. "
            f"{where_to_put_files(name)}"
        ) from error
    return [question_from_record(r, name, i) for i, r in enumerate(rows)]


def question_from_prompt(prompt: Any) -> str | None:
    """The question text of a Search-R1 prompt: what follows its last "Question: "."""
    prompt = _plain(prompt)
    if isinstance(prompt, list):  # chat messages: the user turn holds the instruction
        prompt = "\n".join(str(m.get("content", "")) for m in prompt if isinstance(m, dict))
    if not isinstance(prompt, str) or "Question: " not in prompt:
        return None
    # a chat-templated string carries the template's end-of-turn marker after the question
    return prompt.rsplit("Question: ", 1)[1].split("<|im_end|>", 1)[0].strip()


def merged_question(record: Mapping[str, Any], index: int) -> Question:
    """A record of Search-R1's merged test.parquet as a Question."""
    record = _plain(record)
    dataset = str(record.get("data_source"))
    question = record.get("question") or question_from_prompt(record.get("prompt"))
    if not question:
        raise DataError(f"merged record {index} ({dataset}) has no question or prompt")
    target = ((record.get("reward_model") or {}).get("ground_truth") or {}).get("target")
    golden = target if target is not None else record.get("golden_answers")
    extra = record.get("extra_info") or {}
    local_index = extra.get("index", index) if isinstance(extra, dict) else index
    qid = record.get("id")
    return Question(
        id=str(qid if qid is not None else f"{dataset}_{local_index}"),
        dataset=dataset,
        question=str(question).strip(),
        golden_answers=_answers(golden, f"merged record {index} ({dataset})"),
        metadata=record.get("metadata") if isinstance(record.get("metadata"), dict) else {},
    )


def load_merged(path: Path, name: str) -> list[Question]:
    """One benchmark's questions out of Search-R1's merged test.parquet (by data_source)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"Merged parquet {path} does not exist.")
    frame = read_parquet_guarded(path, MERGED_COLUMNS)
    if "data_source" not in frame.columns:
        raise DataError(f"{path} has no data_source column; is it Search-R1's test.parquet?")
    rows = frame[frame["data_source"] == name].to_dict("records")
    if not rows:
        present = sorted(str(s) for s in frame["data_source"].unique())
        raise DataError(f"{path} has no {name!r} rows (data sources: {', '.join(present)}).")
    return [merged_question(r, i) for i, r in enumerate(rows)]


# ---------------------------------------------------------------------------- selection


def select(
    questions: list[Question], limit: int | None = None, sample: int | None = None, seed: int = 0
) -> list[Question]:
    """First `limit` questions (FlashRAG's protocol uses 1000), or a seeded random sample.

    A sample is the first `sample` positions of a seeded shuffle, so a larger sample of one
    seed holds every question of a smaller one (a run grows without re-asking); it keeps
    the file order so runs over the same seed line up question by question.
    """
    if limit is not None and sample is not None:
        raise DataError("Give either a limit or a sample, not both.")
    if limit is not None:
        return questions[: max(limit, 0)]
    if sample is not None:
        if sample >= len(questions):
            return list(questions)
        order = list(range(len(questions)))
        random.Random(seed).shuffle(order)
        chosen = sorted(order[: max(sample, 0)])
        return [questions[i] for i in chosen]
    return list(questions)


def scorable(name: str, questions: list[Question]) -> tuple[list[Question], list[str]]:
    """The questions that can be scored once each, and a note for each kind left out: a
    record without golden answers would score 0 whatever the model says, and a repeated id
    would be taken for a finished question on resume."""
    seen: set[str] = set()
    kept, unanswerable, repeated = [], [], []
    for question in questions:
        if not question.golden_answers:
            unanswerable.append(question.id)
        elif question.id in seen:
            repeated.append(question.id)
        else:
            seen.add(question.id)
            kept.append(question)
    notes = []
    if unanswerable:
        notes.append(f"{name}: {len(unanswerable)} record(s) have no golden answers (e.g. id "
                     f"{unanswerable[0]!r}) and are not scored; add golden_answers to score "
                     "them.")
    if repeated:
        notes.append(f"{name}: {len(repeated)} record(s) repeat an id already seen (e.g. "
                     f"{repeated[0]!r}); only the first record of each id is scored. Give "
                     "each record an id of its own.")
    return kept, notes


def check_size(name: str, count: int, split: str | None) -> list[str]:
    """Warnings when the full set is not the split and size the published numbers used."""
    bench = BENCHMARKS.get(name)
    if bench is None:
        return [f"{name!r} is not one of the seven Search-R1 benchmarks; no size to check."]
    notes = []
    if split is not None and split != bench.split:
        notes.append(f"{name}: loaded the {split!r} split; Search-R1 uses {bench.split!r}.")
    if count != bench.size:
        notes.append(
            f"{name}: the full set has {count:,} questions, expected {bench.size:,} "
            f"({bench.split}); numbers will not be comparable with published ones."
        )
    return notes


def load_with_warnings(
    name: str,
    data_dir: str | Path | None = None,
    merged_parquet: str | Path | None = None,
    limit: int | None = None,
    sample: int | None = None,
    seed: int = 0,
) -> tuple[list[Question], list[str]]:
    """Load and select one benchmark; returns the questions and the warnings as text."""
    if data_dir is None and merged_parquet is None and name in LOCAL_BENCHMARKS:
        questions, _, _ = load_local(LOCAL_BENCHMARKS[name], name)
        questions, dropped = scorable(name, questions)
        return select(questions, limit=limit, sample=sample, seed=seed), dropped
    if name not in BENCHMARKS and data_dir is None and merged_parquet is None:
        raise DataError(
            f"Unknown benchmark {name!r}; known: {', '.join(BENCHMARK_NAMES)}, "
            f"{', '.join(LOCAL_BENCHMARKS)} "
            f"(other sets load from --data-dir or --merged-parquet)."
        )
    split: str | None
    if merged_parquet is not None:
        questions = load_merged(Path(merged_parquet), name)
        split = None  # the merged file does not record it; Search-R1 built it by the rule
    elif data_dir is not None:
        questions, split, _ = load_local(Path(data_dir), name)
    else:
        split = BENCHMARKS[name].split
        questions = load_hub(name, split)
    notes = check_size(name, len(questions), split)
    questions, dropped = scorable(name, questions)
    return select(questions, limit=limit, sample=sample, seed=seed), notes + dropped


def load_benchmark(name: str, *args: Any, **kwargs: Any) -> list[Question]:
    """`load_with_warnings` (same arguments), reporting its notes as DataWarning."""
    questions, notes = load_with_warnings(name, *args, **kwargs)
    for note in notes:
        warnings.warn(note, DataWarning, stacklevel=2)
    return questions


def resolve_names(names: Iterable[str] | None) -> list[str]:
    """Benchmark names in canonical order; None or "all" means all seven."""
    if names is None:
        return list(BENCHMARK_NAMES)
    names = list(dict.fromkeys(n.strip() for n in names if n.strip()))
    if not names or "all" in names:
        return list(BENCHMARK_NAMES)
    known = [n for n in BENCHMARK_NAMES if n in names]
    return known + [n for n in names if n not in BENCHMARKS]
