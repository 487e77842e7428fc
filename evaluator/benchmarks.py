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

import itertools
import json
import random
import re
import warnings
from collections.abc import Iterable, Iterator, Mapping
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
    # Why the record cannot be asked (its question is not a string, or is over
    # MAX_QUESTION_CHARS), or None. Such a question never reaches the model: the runner
    # records it as an error with this message, so the rest of the file still runs and the
    # run says what to fix.
    problem: str | None = None


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

# One line of a JSON-lines file holds one record: an id, a question, its answers and some
# metadata. FlashRAG's largest records are tens of KB; 1 MiB leaves room for a question at
# MAX_QUESTION_CHARS in any script with its metadata, and keeps a line, its text and its
# parsed form a few MB at most. A longer line is bad input (DataError, exit 2): read past in
# bounded pieces to measure it, never held whole (a 200 MB line took 6 GB before), it is
# not parsed, so it is not known to be one record (an 80 MB line is more likely a whole
# set written as one JSON list) and nothing of it can be asked or recorded.
MAX_RECORD_BYTES = 2**20
# A question goes to the model whole, and the agent refuses a prompt over its 2,048-token
# window (AgentSettings.max_prompt_tokens) only after tokenizing all of it (3.5 GB for a
# 20 MB question). 32,768 characters is several times that window for ordinary text and
# far past any benchmark question (the seven's longest run to a few hundred characters);
# a longer question is an error for that record, never tokenized.
MAX_QUESTION_CHARS = 32_768
_KEPT_CHARS = 200  # of an over-long question, kept in its error record to find it by
_SCAN_BYTES = 2**20  # an over-long line is read past in pieces of this size


def _kilo(size: int) -> str:
    return f"{size / 2**20:,.1f} MB" if size >= 2**20 else f"{size / 1024:,.0f} KB"


def _clipped(text: str) -> str:
    """The start of an over-long question, marked as cut, for its error record."""
    return f"{text[:_KEPT_CHARS]}... [{len(text):,} characters in all]"


@dataclass(frozen=True)
class OversizedRecord:
    """A line of a JSON-lines file over MAX_RECORD_BYTES, as read: its size and the bytes at
    its two ends (where an id and the line's shape are found), the rest skipped unread into
    memory."""

    size: int
    head: bytes
    tail: bytes

    _ID = re.compile(rb'"id"\s*:\s*("(?:[^"\\\n]|\\.){0,200}"|-?\d{1,30})')

    def record_id(self) -> str | None:
        """The record's "id" when it shows at the line's start or end (FlashRAG writes it
        first); None when it does not, and the record is named by its position."""
        for part in (self.head, self.tail):
            if (match := self._ID.search(part)) is not None:
                try:
                    return str(json.loads(match.group(1)))
                except (json.JSONDecodeError, UnicodeDecodeError):
                    continue
        return None

    def error(self, where: str) -> DataError:
        """The refusal of the whole file: which line, what is wrong, what to do."""
        qid = self.record_id()
        named = f" (record id {qid!r})" if qid is not None else ""
        # A set written as one JSON list lands on one line: say so, the fix differs.
        shape = (" It starts with '[', as if the whole set were one JSON list on one line; "
                 "write one record a line (a .jsonl file)."
                 if self.head.lstrip().startswith(b"[") else
                 " Shorten or remove that record (a record holds one question, its answers "
                 "and metadata).")
        return DataError(
            f"{where}: a line of {_kilo(self.size)}{named}, over the limit of "
            f"{_kilo(MAX_RECORD_BYTES)} for one line of a benchmark file; nothing was "
            f"asked.{shape} Then run the same command again.")


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
    text, problem = question_text(record["question"], where)
    return Question(
        id=str(record.get("id") if record.get("id") is not None else f"{dataset}_{index}"),
        dataset=dataset,
        question=text,
        golden_answers=_answers(golden, where),
        metadata=metadata if isinstance(metadata, dict) else {"metadata": metadata},
        problem=problem,
    )


_KINDS = {list: "a list", tuple: "a list", dict: "an object (a struct)", bool: "true/false",
          int: "a number", float: "a number", bytes: "binary data"}


def question_text(value: Any, where: str) -> tuple[str, str | None]:
    """(the question text, None), or (a short preview, why it is not asked) for a question
    that is not a string or is over MAX_QUESTION_CHARS. Not str() of whatever is there: a
    parquet list column's ['who', 'wrote', 'hamlet'] was asked as its Python repr."""
    if isinstance(value, str):
        return _checked_question(value, where)
    kind = _KINDS.get(type(value), f"a {type(value).__name__}")
    words = value if isinstance(value, list | tuple) and value and all(
        isinstance(word, str) for word in value) else ["who wrote hamlet?"]
    return _preview(value, _KEPT_CHARS), (
        f"{where}: the question is {kind} ({_preview(value)}), not a string; it was not "
        f"asked. Write the question as one string (e.g. \"question\": "
        f"{json.dumps(' '.join(words)[:80])}), then run the same command again: the other "
        "questions are kept and this one runs then.")


def _checked_question(text: str, where: str) -> tuple[str, str | None]:
    """(the question text, None), or for one over MAX_QUESTION_CHARS (its start, why it is
    not asked): the record stays in the run as an error instead of reaching the model."""
    if len(text) <= MAX_QUESTION_CHARS:
        return text, None
    return _clipped(text), (
        f"{where}: the question is {len(text):,} characters, over the limit of "
        f"{MAX_QUESTION_CHARS:,} (the agent's prompt window is 2,048 tokens; a benchmark "
        "question is a sentence or two); it was not asked. Shorten that question or remove "
        "the record, then run the same command again: the other questions are kept and "
        "this one runs then.")


# A .json file is parsed whole when it is one JSON document (a list, or {"data": [...]}):
# json.loads holds several times the text, so past this size only JSON lines are read.
MAX_JSON_DOCUMENT_BYTES = 64 * 2**20


def read_data_file(path: Path) -> list[tuple[str, Any]]:
    """Every (where, record) pair of a benchmark file (`iter_data_file`)."""
    return list(iter_data_file(path))


def iter_data_file(path: Path) -> Iterator[tuple[str, Any]]:
    """(where, record) pairs of a .jsonl, .json (a list, {"data": [...]}, or JSON lines) or
    .parquet file, read as they are asked for (a reader that stops early never reads the
    rest of the file); `where` names the record in messages (`path:line` or `path record
    N`). A line over MAX_RECORD_BYTES is a DataError that names it."""
    path = Path(path)
    if path.suffix == ".parquet":
        guard = _ParquetGuard(path, DATA_COLUMNS, ParquetLimits())
        if "question" not in guard.columns:
            raise DataError(f"{path}: no 'question' column (columns: "
                            f"{', '.join(guard.handle.schema_arrow.names)}); every record "
                            "needs one.")
        guard.check()
        rows = (r for b in guard.batches() for r in b.to_pylist())
        yield from ((f"{path} record {i}", r) for i, r in enumerate(rows))
        return
    if path.suffix == ".json":
        document = _json_document(path)
        if document is not None:
            yield from document
            return
    yield from _json_lines(path)


def _json_document(path: Path) -> list[tuple[str, Any]] | None:
    """The records of a .json file that is one JSON document, or None when it is JSON lines
    (FlashRAG ships JSON lines under .json names too)."""
    size = path.stat().st_size
    if size > MAX_JSON_DOCUMENT_BYTES:
        with path.open("rb") as handle:
            start = handle.read(4096).lstrip()
        if start.startswith(b"["):
            raise DataError(
                f"{path}: a JSON document of {_kilo(size)}, over the limit of "
                f"{_kilo(MAX_JSON_DOCUMENT_BYTES)} for one read whole; write it as JSON lines "
                "(one record a line, a .jsonl file), which are read a line at a time.")
        return None
    data = path.read_bytes()
    try:
        parsed = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None  # JSON lines, or bad text that the line reader names by line
    if isinstance(parsed, dict) and isinstance(parsed.get("data"), list):
        parsed = parsed["data"]
    if isinstance(parsed, list):
        return [(f"{path} record {i}", r) for i, r in enumerate(parsed)]
    if isinstance(parsed, dict):
        return [(f"{path} record 0", parsed)]
    return None


def _json_lines(path: Path) -> Iterator[tuple[str, Any]]:
    """(where, record) for each non-blank line of a JSON-lines file, read a line at a time:
    a line over MAX_RECORD_BYTES is measured in bounded pieces, never held whole, and
    refused (`OversizedRecord.error`)."""
    offset = 0
    with path.open("rb") as handle:
        for number in itertools.count(1):
            line = handle.readline(MAX_RECORD_BYTES + 1)
            if not line:
                return
            where = f"{path}:{number}"
            if len(line) > MAX_RECORD_BYTES and not line.endswith(b"\n"):
                head, size, tail = line[:4096], len(line), line[-4096:]
                while not line.endswith(b"\n"):  # the rest of it, a bounded piece at a time
                    line = handle.readline(_SCAN_BYTES)
                    if not line:
                        break
                    size += len(line)
                    tail = (tail + line)[-4096:]
                raise OversizedRecord(size=size - tail.endswith(b"\n"), head=head,
                                      tail=tail).error(where)
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as error:
                raise DataError(
                    f"{where}: not UTF-8 text (byte {line[error.start]:#04x} at offset "
                    f"{offset + error.start}); save the file as UTF-8 and try again.") from None
            offset += len(line)
            if text.strip():
                try:
                    yield where, json.loads(text)
                except json.JSONDecodeError as error:
                    raise DataError(f"{where}: not valid JSON ({error}); fix or remove that "
                                    "line.") from error


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
    rows refer to it. Every limit is checked before anything large is materialised."""

    rows: int = 1_000_000  # the largest Search-R1 file (the merged test set) has ~51k
    columns: int = 1_000
    decoded_bytes: int = 512 * 2**20
    batch_rows: int = 1024  # rows decoded at a time once the file is known to fit


# Bytes one value of a parquet physical type takes once decoded by arrow (a text value: its
# offset, its characters aside): a column chunk of N values costs at least N times this,
# however well its pages compress (a million empty strings RLE-encode to a few bytes).
_VALUE_WIDTH = {"BOOLEAN": 1, "INT32": 4, "FLOAT": 4, "INT64": 8, "DOUBLE": 8, "INT96": 8,
                "BYTE_ARRAY": 4}
# Encodings under which one stored text value can stand for many decoded ones: a dictionary
# (a value stored once, any number of rows refer to it). DELTA_BYTE_ARRAY amplifies too, and
# is refused (`_ParquetGuard.check`). Everything else decodes to about its page size.
_AMPLIFYING = frozenset({"PLAIN_DICTIONARY", "RLE_DICTIONARY"})
# Column chunks read from the file in pieces of 1 MiB, not pre-buffered whole: what is held
# while decoding follows the pages, not the chunk's compressed size.
_READ_OPTIONS = {"pre_buffer": False, "buffer_size": 2**20}
# Logical types arrow reads as string/binary, so as a dictionary when asked to.
_TEXT_LOGICAL = frozenset({"STRING", "NONE", "JSON", "ENUM", "BSON"})


def _leaf_indices(meta: Any, name: str) -> list[int]:
    """Parquet leaf columns under the top-level column `name` (`a`, `a.list.element`)."""
    return [i for i in range(meta.num_columns)
            if (path := meta.schema.column(i).path) == name or path.startswith(f"{name}.")]


def _value_width(meta: Any, index: int) -> int:
    column = meta.schema.column(index)
    if column.physical_type == "FIXED_LEN_BYTE_ARRAY":
        return max(int(column.length or 0), 1)
    return _VALUE_WIDTH.get(column.physical_type, 8)


def _is_text_leaf(meta: Any, index: int) -> bool:
    column = meta.schema.column(index)
    return column.physical_type == "BYTE_ARRAY" and column.logical_type.type in _TEXT_LOGICAL


def _amplifies(chunk: Any) -> bool:
    """Whether a text column chunk may decode to more than its pages hold."""
    return chunk.physical_type == "BYTE_ARRAY" and (
        chunk.has_dictionary_page or bool(_AMPLIFYING.intersection(chunk.encodings)))


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


def _has_dictionary(data_type: Any) -> bool:
    return _plain_type(data_type) != data_type


class _ParquetGuard:
    """One parquet file read under `ParquetLimits`, in three steps, each bounded by the
    one before it:

    1. the metadata alone (nothing decoded): rows, columns, the pages' uncompressed size
       and each leaf's value count times its width. These bound what step 2 holds.
    2. exact decoded sizes where a stored value may stand for many (`_AMPLIFYING`; text
       stored as DELTA_BYTE_ARRAY cannot be measured this way and is refused): that
       row group's column read as dictionaries (the dictionary, at most its pages, and one
       index per value), counted row by row and dropped. Other chunks decode to about
       their pages, so the metadata's figure is kept for them.
    3. the projected columns decoded plainly `batch_rows` rows at a time, each batch's
       bytes counted as it comes (strings, offsets and numbers alike): the file is never
       held as one table, and the count stops the read past the budget even if a file
       lied in step 1.

    Text is never read as dictionaries beyond step 2: arrow gives each batch of such a
    read the dictionary accumulated so far, so holding the batches held the text
    quadratically (a 0.5 MB file of 38 MB of text peaked at 2.4 GB)."""

    def __init__(self, path: Path, wanted: Iterable[str], limits: ParquetLimits) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.path, self.limits = Path(path), limits
        wanted = set(wanted)
        try:
            self.handle = pq.ParquetFile(self.path, **_READ_OPTIONS)
            self.meta = self.handle.metadata
            arrow = self.handle.schema_arrow
        except (pa.ArrowException, OSError) as error:
            raise DataError(f"{path}: not a parquet file ({error}); pass a .parquet written "
                            "by pandas or pyarrow, or a .jsonl file.") from None
        self.columns = [name for name in arrow.names if name in wanted]
        self.schema = pa.schema([arrow.field(name) for name in self.columns])
        self.plain = pa.schema([f.with_type(_plain_type(f.type)) for f in self.schema])

    def too_big(self, counted: int) -> DataError:
        limit = f"{self.limits.decoded_bytes / 2**20:.0f} MB"
        return DataError(
            f"{self.path}: the columns {', '.join(self.columns)} expand to over {limit} in "
            f"memory (the limit for a benchmark file; {counted / 2**20:,.0f} MB counted when "
            f"the reader stopped, from a file of {self.path.stat().st_size / 2**20:.2f} MB "
            "compressed); split the file or shorten its records.")

    def damaged(self, error: Exception) -> DataError:
        return DataError(f"{self.path}: the parquet file is damaged ({error}); write it again.")

    def check(self) -> None:
        """Steps 1 and 2: DataError unless the projected columns fit the budget."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        meta, limits = self.meta, self.limits
        width = len(self.handle.schema_arrow.names)
        if meta.num_rows > limits.rows or width > limits.columns:
            raise DataError(
                f"{self.path}: {meta.num_rows:,} rows x {width:,} "
                f"columns, over the limit of {limits.rows:,} rows and {limits.columns:,} "
                "columns for a benchmark file; split the file or keep only the questions you "
                "want to score.")
        leaves = {name: _leaf_indices(meta, name) for name in self.columns}
        # Per (row group, column): the pages' uncompressed size or the values' count times
        # their width, whichever is more. What it decodes to, unless it amplifies (then
        # it is at least that, and measured below).
        estimate: dict[tuple[int, str], int] = {}
        measure: list[tuple[int, str]] = []
        for group in range(meta.num_row_groups):
            row_group = meta.row_group(group)
            for name, indices in leaves.items():
                chunks = [row_group.column(i) for i in indices]
                estimate[group, name] = max(
                    sum(c.total_uncompressed_size for c in chunks),
                    sum(c.num_values * _value_width(meta, i)
                        for c, i in zip(chunks, indices, strict=True)))
                if any("DELTA_BYTE_ARRAY" in c.encodings for c in chunks):
                    # each value may repeat any prefix of the one before, so a few bytes can
                    # stand for gigabytes, and arrow cannot read it as a dictionary to count
                    raise DataError(
                        f"{self.path}: the column {name} stores text as DELTA_BYTE_ARRAY, "
                        "whose decoded size cannot be measured before it is decoded; write "
                        "the file again with pandas or pyarrow's default settings, or as a "
                        ".jsonl file.")
                if any(_amplifies(c) for c in chunks):
                    measure.append((group, name))
        counted = sum(estimate.values())
        if counted > limits.decoded_bytes:  # refused from the metadata: nothing was read
            raise self.too_big(counted)
        text = [meta.schema.column(i).path for indices in leaves.values() for i in indices
                if _is_text_leaf(meta, i)]
        pool = pa.default_memory_pool()
        try:
            as_dictionary = pq.ParquetFile(self.path, read_dictionary=text,
                                           **_READ_OPTIONS) if measure else None
            for group, name in measure:
                column = as_dictionary.read_row_group(group, columns=[name],
                                                      use_threads=False).column(0)
                counted += decoded_nbytes(column) - estimate[group, name]
                # Freed, and handed back to the OS, before the next chunk is read: arrow's
                # allocator otherwise keeps ~35 MB of freed blocks a read.
                del column
                pool.release_unused()
                if counted > limits.decoded_bytes:
                    raise self.too_big(counted)
        except (pa.ArrowException, OSError) as error:
            raise self.damaged(error) from None
        finally:
            pool.release_unused()

    def batches(self) -> Iterator[Any]:
        """Step 3 (after `check`): plain record batches, counted as they are decoded."""
        import pyarrow as pa

        if not self.columns:
            return
        # A column stored as an arrow dictionary comes back as one whatever is asked, its
        # dictionary rebuilt for every batch: one batch per row group builds it once.
        rows = self.limits.batch_rows
        if any(_has_dictionary(f.type) for f in self.schema):
            rows = max([rows] + [self.meta.row_group(g).num_rows
                                 for g in range(self.meta.num_row_groups)])
        counted = 0
        try:
            for batch in self.handle.iter_batches(batch_size=rows, columns=self.columns,
                                                  use_threads=False):
                if not batch.schema.equals(self.plain, check_metadata=False):
                    batch = batch.cast(self.plain)
                counted += batch.nbytes
                if counted > self.limits.decoded_bytes:
                    raise self.too_big(counted)
                yield batch
        except (pa.ArrowException, OSError) as error:
            raise self.damaged(error) from None


def iter_parquet_records(path: Path, wanted: Iterable[str],
                         limits: ParquetLimits = ParquetLimits()) -> Iterator[dict[str, Any]]:
    """The `wanted` columns of a parquet file, one plain dict per row, or a DataError that
    names the file and the limit it breaks (raised before the first row when the metadata
    or the measured sizes break it). Rows are decoded a batch at a time and turned into
    Python values at once, so the arrow side holds one batch, never the file."""
    guard = _ParquetGuard(path, wanted, limits)
    guard.check()
    for batch in guard.batches():
        yield from batch.to_pylist()


def read_parquet_guarded(path: Path, wanted: Iterable[str],
                         limits: ParquetLimits = ParquetLimits()) -> Any:
    """The `wanted` columns of a parquet file as a pandas DataFrame, or a DataError that
    names the file and the limit it breaks (the checks of `iter_parquet_records`)."""
    import pyarrow as pa

    guard = _ParquetGuard(path, wanted, limits)
    guard.check()
    return pa.Table.from_batches(list(guard.batches()), schema=guard.plain).to_pandas()


# ---------------------------------------------------------------------------- sources


def local_candidates(data_dir: Path, name: str) -> list[Path]:
    """Files that may hold `name` under data_dir, best first (split preference, suffix)."""
    data_dir = Path(data_dir)
    paths = [data_dir / name / f"{split}{suffix}" for split in SPLIT_PREFERENCE
             for suffix in FILE_SUFFIXES]
    paths += [data_dir / f"{name}{suffix}" for suffix in FILE_SUFFIXES]
    return paths


def find_local(data_dir: Path, name: str) -> tuple[Path, str | None]:
    """The file of `name` in a FlashRAG-style directory and its split (None when the file
    is not named by one), or a DataError that says where to put it."""
    for path in local_candidates(data_dir, name):
        if path.is_file():
            return path, path.stem if path.parent.name == name else None
    raise DataError(f"No file for {name!r} in {data_dir}. {where_to_put_files(name)}")


def local_questions(path: Path, name: str) -> Iterator[Question]:
    """The questions of a benchmark file, read as they are asked for; a DataError at the
    first when the file holds no record."""
    records = iter_data_file(path)
    first = next(records, None)
    if first is None:
        raise DataError(f"{path} holds no records (the file is empty or has only blank "
                        "lines); write the questions into it, one JSON object per line with "
                        "id, question and golden_answers.")
    for i, (where, record) in enumerate(itertools.chain([first], records)):
        yield question_from_record(record, name, i, where)


def load_local(data_dir: Path, name: str) -> tuple[list[Question], str | None, Path]:
    """Questions from a FlashRAG-style directory: (questions, split found or None, path)."""
    path, split = find_local(data_dir, name)
    return list(local_questions(path, name)), split, path


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
    text, problem = question_text(question.strip() if isinstance(question, str) else question,
                                  f"merged record {index} ({dataset})")
    return Question(
        id=str(qid if qid is not None else f"{dataset}_{local_index}"),
        dataset=dataset,
        question=text,
        golden_answers=_answers(golden, f"merged record {index} ({dataset})"),
        metadata=record.get("metadata") if isinstance(record.get("metadata"), dict) else {},
        problem=problem,
    )


def load_merged(path: Path, name: str) -> list[Question]:
    """One benchmark's questions out of Search-R1's merged test.parquet (by data_source)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"Merged parquet {path} does not exist.")
    guard = _ParquetGuard(path, MERGED_COLUMNS, ParquetLimits())
    if "data_source" not in guard.columns:
        raise DataError(f"{path} has no data_source column; is it Search-R1's test.parquet?")
    guard.check()
    rows, present = [], set()
    for batch in guard.batches():  # the other sets' rows are dropped a batch at a time
        for record in batch.to_pylist():
            present.add(str(record.get("data_source")))
            if record.get("data_source") == name:
                rows.append(record)
    if not rows:
        raise DataError(f"{path} has no {name!r} rows (data sources: "
                        f"{', '.join(sorted(present))}).")
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


def _left_out(question: Question, seen: set[str]) -> str | None:
    """Why `question` is not scored ("unanswerable" or "repeated"), or None, when it is
    and its id is added to `seen`: a record without golden answers would score 0 whatever
    the model says, and a repeated id would be taken for a finished question on resume."""
    # a record with a problem (a question that is not asked) stays, to be recorded as an
    # error that says what to fix, rather than vanish into a note
    if not question.golden_answers and question.problem is None:
        return "unanswerable"
    if question.id in seen:
        return "repeated"
    seen.add(question.id)
    return None


def scorable(name: str, questions: list[Question]) -> tuple[list[Question], list[str]]:
    """The questions that can be scored once each (`_left_out`), and a note for each kind
    left out."""
    seen: set[str] = set()
    kept, unanswerable, repeated = [], [], []
    for question in questions:
        why = _left_out(question, seen)
        if why is None:
            kept.append(question)
        else:
            (unanswerable if why == "unanswerable" else repeated).append(question.id)
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


def read_for(questions: Iterable[Question], limit: int | None,
             sample: int | None) -> tuple[list[Question], bool]:
    """(the questions `select` picks from, whether the source was read to its end). A
    sample is drawn from the whole set, so it reads everything; a limit reads up to its
    limit-th scorable question and stops, so `--limit 3` on a million-record file parses
    three records, not a million (233 MB of JSON lines: 20 s and a 1.9 GB peak before, a
    millisecond after), and a bad record past the limit is never read."""
    if limit is None or sample is not None:
        return list(questions), True
    if limit <= 0:
        return [], False
    taken: list[Question] = []
    seen: set[str] = set()
    kept = 0
    for question in questions:
        taken.append(question)
        if _left_out(question, seen) is None:
            kept += 1
            if kept == limit:  # returned before the next record is read
                return taken, False
    return taken, True


def check_size(name: str, count: int | None, split: str | None) -> list[str]:
    """Warnings when the full set is not the split and size the published numbers used
    (`count`: None when it is not known, the file read only up to a --limit)."""
    bench = BENCHMARKS.get(name)
    if bench is None:
        return [f"{name!r} is not one of the seven Search-R1 benchmarks; no size to check."]
    notes = []
    if split is not None and split != bench.split:
        notes.append(f"{name}: loaded the {split!r} split; Search-R1 uses {bench.split!r}.")
    if count is not None and count != bench.size:
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
    """Load and select one benchmark; returns the questions and the warnings as text. A
    local file is read only as far as `limit` needs (`read_for`)."""
    if data_dir is None and merged_parquet is None and name in LOCAL_BENCHMARKS:
        path, _ = find_local(LOCAL_BENCHMARKS[name], name)
        questions, _ = read_for(local_questions(path, name), limit, sample)
        questions, dropped = scorable(name, questions)
        return select(questions, limit=limit, sample=sample, seed=seed), dropped
    if name not in BENCHMARKS and data_dir is None and merged_parquet is None:
        raise DataError(
            f"Unknown benchmark {name!r}; known: {', '.join(BENCHMARK_NAMES)}, "
            f"{', '.join(LOCAL_BENCHMARKS)} "
            f"(other sets load from --data-dir or --merged-parquet)."
        )
    split: str | None
    source: Iterable[Question]
    if merged_parquet is not None:
        source = load_merged(Path(merged_parquet), name)
        split = None  # the merged file does not record it; Search-R1 built it by the rule
    elif data_dir is not None:
        path, split = find_local(Path(data_dir), name)
        source = local_questions(path, name)
    else:
        split = BENCHMARKS[name].split
        source = load_hub(name, split)
    questions, whole = read_for(source, limit, sample)
    notes = check_size(name, len(questions) if whole else None, split)
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
