"""The llama.cpp backend: a GGUF written by `python -m app.quantize`, run on the CPU through
llama-cpp-python's bindings of llama.cpp's C API (`pip install -r requirements-llamacpp.txt`;
`--backend llamacpp --model DIR/model.gguf`).

It follows the protocol as the transformers backend does (agent/backends/hf.py is the
reference): a context's segments are tokenized one by one and their ids concatenated (never
the joined text re-tokenized); a turn ends at EOS (every id the checkpoint's tokenizer and
generation config name, Qwen2.5's 151643 and 151645 included), at the budget or when the
text holds `</search>`, never elsewhere; EOS is counted, never shown; greedy is the argmax
of the logits, as torch's. The turn's text is the bytes of its tokens decoded once (a
character split over tokens is never shown broken while streaming).

Tokenization: the added tokens (special or not) are matched in the text first, longest
first, as the Hugging Face tokenizer's added vocabulary does; the text between them gets
the tokenizer's NFC normalisation here (llama.cpp does not normalise) and llama.cpp's BPE
with the vocabulary, merges and pre-tokenizer the file carries. Which ids are added,
special or turn-ending comes from the file's `llds.tokenizer` record, not from llama.cpp's
token types, which it rewrites on load (`<|fim_prefix|>`, even Qwen's plain `</s>` 128247
become control tokens: parsed that way, `a </s> b` would not be the Hugging Face ids). The
chat template in the file is rendered with Jinja as transformers renders it. Parity over
the parity battery's 76,085 texts, on the nano and on Qwen2.5's vocabulary: identical ids.

One context holds `slots` sequences, each with a KV cache of its own (llama.cpp's
`n_seq_max`, not unified). A turn goes to the slot whose cache shares the longest prefix
with its context, cropped to that prefix: the next turn of a question feeds only what was
added (the observation, and the turn's last token), so on 2 cores a question's prompt
processing is its first prompt and its documents, once. Batched turns (`generate`, the
evaluator's `run_agent_batch`) put a row in each slot and decode all running rows with one
`llama_decode` a step; a row that ends leaves the step at once (no row waits for the
slowest, no padding); new questions share the cached instruction prefix of the questions
before them. The instruction itself (every prompt's ids up to the question: 139 tokens on
Qwen2.5's vocabulary, 5 on the nano's) is read once: its KV cache is saved as llama.cpp's
sequence state and restored into any slot that lacks it, a new slot or a reused one (a
context reopened with more slots reads it once more: a state fits only a context of as
many sequences). More rows than slots run as consecutive batches. Measured (benchmarks/llamacpp.py
`batching`, 2 idle cores, a turn of every question without cache, best of 2): one context
with a sequence per question against the same questions one at a time and against a
pool of one-thread contexts in threads: Qwen2.5-3B's shape at q4_k_m, 4 x 16 tokens:
1.26x and 1.22x; the nano agent, 8 x 32: 1.92x and 1.88x; Qwen2.5 x0.125, 8 x 32: 1.57x
and 1.58x. The pool is no faster and needs a context (KV cache) per thread, so batches
share one context.

Sampling (temperature, top-p, in transformers' order) is done here with NumPy; a seed makes
a call reproducible (a seeded call starts from an empty cache, since a cached prefix gives
logits a rounding error away from a fresh one). Cancel is checked between decodes, and a
stream closed early leaves the model free and its caches consistent.

CPU notes: OpenMP threads are set to sleep while they wait (`load_llama_cpp`, measured on
2 shared cores of a Sapphire Rapids VM); weights are not repacked at load
(`extra_buffer_types`, measured on an AMD EPYC); LLDS_THREADS sets the thread count.
"""

from __future__ import annotations

import codecs
import ctypes
import json
import os
import re
import sys
import threading
import time
import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agent import protocol
from agent.backends.base import ModelLoadError, Sampling, TurnOutput

# Two questions that share no first word: their prompts' shared ids are the instruction.
_PROBES = ("Who wrote it?", "7 and 8")
KV_TYPES = {"f16": 1, "q8_0": 8}  # the KV cache's ggml types (enum ggml_type)
DEFAULT_SLOTS = 8
DEFAULT_SLOT_CONTEXT = 6144  # tokens per sequence: the 4,096 window, a turn, room
# (a longer context reopens the slots longer)
KEY_TOKENIZER = "llds.tokenizer"  # the Hugging Face tokenizer's facts, from app.quantize


def find_gguf(model: str) -> Path:
    """The GGUF file `model` names: a .gguf file, or a directory holding model.gguf."""
    path = Path(model).expanduser()
    if path.is_dir():
        if (path / "model.gguf").is_file():
            return path / "model.gguf"
        found = sorted(path.glob("*.gguf"))
        if len(found) == 1:
            return found[0]
        hint = (f"convert it first: python -m app.quantize {model} --out DIR, then "
                "--model DIR/model.gguf" if (path / "config.json").is_file()
                else "pass --model DIR/model.gguf")
        raise ModelLoadError(f"{path} holds no single .gguf file for the llamacpp backend: "
                             f"{hint}.")
    if path.is_file():
        return path
    raise ModelLoadError(f"{model!r} is not a GGUF file: the llamacpp backend runs a file "
                         "written by `python -m app.quantize MODEL --out DIR` "
                         "(--model DIR/model.gguf).")


_OPENMP = {"passive": False}  # whether llama.cpp's OpenMP threads sleep while waiting


def default_threads() -> int:
    """LLDS_THREADS, else the cores this process may use; but when OpenMP's threads spin
    (see `load_llama_cpp`), only the cores other work leaves idle (the 1-minute load
    average), at least 1."""
    if os.environ.get("LLDS_THREADS"):
        return max(1, int(os.environ["LLDS_THREADS"]))
    cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
             else os.cpu_count() or 1)
    if _OPENMP["passive"]:
        return max(1, cores)
    try:
        busy = os.getloadavg()[0]
    except OSError:
        busy = 0.0
    return max(1, min(cores, int(cores - busy + 0.5)))


def extra_buffer_types() -> bool:
    """Whether llama.cpp may put weights in its extra CPU buffer types (weights repacked at
    load into layouts for AVX2/AVX-512, AMX tiles): off unless LLDS_LLAMA_EXTRA_BUFTS=1.
    Measured on 2 idle cores of an AMD EPYC (AVX-512, VNNI, no AMX), Qwen2.5-3B's shape at
    q4_k_m (`python -m benchmarks.llamacpp_knobs`): repacked, prompt processing ran at
    ~47 tok/s against ~75 without, decoding ~11.4 against ~9.5, and the process held 3.4 GB
    against 2.2 (the file's pages and a repacked copy): a question is faster and smaller
    without. On an AMX CPU (this project's CI machine, a Sapphire Rapids VM) llama-cpp-python
    0.3.36's AMX kernels died with SIGILL (`tilezero`) on q8_0 and q4_k_m models."""
    return os.environ.get("LLDS_LLAMA_EXTRA_BUFTS", "") == "1"


def load_llama_cpp():
    """`llama_cpp`, imported with OpenMP's threads set to sleep, not spin, while they wait
    (OMP_WAIT_POLICY=PASSIVE unless already set; read when the library loads). llama.cpp's
    threads meet at a barrier after every operation: on 2 cores shared with other busy
    processes, spinning threads decoded the nano agent at 623 ms a token with 2 threads
    against 1.6 ms with 1; passive, 2.1 ms. Where the policy could not be set (libgomp
    already loaded, by torch), `default_threads` takes fewer threads on a busy machine.
    ModelLoadError when llama-cpp-python is not installed."""
    if "llama_cpp" not in sys.modules:
        # OpenMP reads the policy once, when libgomp loads. torch ships a libgomp.so.1 of
        # its own that llama.cpp then shares: imported first, it fixed the policy already.
        try:
            maps = Path("/proc/self/maps").read_text()
        except OSError:
            maps = ""
        loaded = "libgomp" in maps
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        _OPENMP["passive"] = (not loaded and os.environ["OMP_WAIT_POLICY"].upper()
                              == "PASSIVE")
    try:
        import llama_cpp
    except ImportError as err:
        raise ModelLoadError("the llamacpp backend needs llama-cpp-python and gguf: pip "
                             "install -r requirements-llamacpp.txt") from err
    return llama_cpp


class ChatTemplate:
    """The `apply_chat_template` of a tokenizer, over the template a GGUF carries: rendered
    with Jinja as transformers renders it (sandboxed, trim_blocks, lstrip_blocks)."""

    def __init__(self, template: str | None, special: dict[str, str]):
        self.chat_template = template
        self.special = special
        self._compiled = None

    def apply_chat_template(self, messages, add_generation_prompt: bool = False,
                            tokenize: bool = False, **kwargs) -> str:
        if tokenize:
            raise ValueError("this template renders text only (tokenize=False)")
        if self._compiled is None:
            from datetime import datetime

            import jinja2
            from jinja2.ext import loopcontrols
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            def raise_exception(message):
                raise jinja2.exceptions.TemplateError(message)

            def tojson(value, ensure_ascii=False, indent=None, separators=None,
                       sort_keys=False):
                return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                                  separators=separators, sort_keys=sort_keys)

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=[loopcontrols])
            env.filters["tojson"] = tojson
            env.globals["raise_exception"] = raise_exception
            env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
            self._compiled = env.from_string(self.chat_template)
        values = {"tools": None, "documents": None, **self.special, **kwargs}
        return self._compiled.render(messages=messages,
                                     add_generation_prompt=add_generation_prompt, **values)


def byte_tokens() -> dict[int, str]:
    """Byte-level BPE's printable stand-in for each byte (GPT-2's table)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _byte_decoder() -> dict[str, int]:
    """`byte_tokens` reversed: the byte each stand-in character means."""
    return {c: b for b, c in byte_tokens().items()}


class _Model:
    """A loaded GGUF and one context of `slots` sequences (llama.cpp's C API)."""

    def __init__(self, path: Path, slots: int, slot_context: int, threads: int,
                 n_batch: int, n_ubatch: int | None = None, flash_attn: bool | None = None,
                 kv_type: str = "f16", mmap: bool = True):
        self.lib = llama_cpp = load_llama_cpp()
        quiet_logs()
        llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = 0
        params.use_extra_bufts = extra_buffer_types()
        params.use_mmap = mmap
        self.model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        if not self.model:
            raise ModelLoadError(f"llama.cpp could not load {path} (not a GGUF it reads?)")
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.threads, self.n_batch = threads, n_batch
        self.n_ubatch = min(n_ubatch or n_batch, n_batch)
        if kv_type not in KV_TYPES:
            raise ModelLoadError(f"the KV cache type is one of {', '.join(KV_TYPES)}, "
                                 f"not {kv_type!r}")
        self.flash_attn, self.kv_type = flash_attn, kv_type
        self.ctx = None
        self.batch = None
        self.open(slots, slot_context)

    def open(self, slots: int, slot_context: int) -> None:
        """(Re)create the context: `slots` sequences of `slot_context` tokens each."""
        lib = self.lib
        self.close_context()
        params = lib.llama_context_default_params()
        params.n_ctx = slots * slot_context
        params.n_batch, params.n_ubatch = self.n_batch, self.n_ubatch
        # llama.cpp: -1 lets it decide, 0 off, 1 on (a quantized V cache needs it on)
        params.flash_attn_type = -1 if self.flash_attn is None else int(self.flash_attn)
        params.type_k = params.type_v = KV_TYPES[self.kv_type]
        params.n_seq_max = slots
        params.n_threads = params.n_threads_batch = self.threads
        params.kv_unified = False
        params.no_perf = True
        self.ctx = lib.llama_init_from_model(self.model, params)
        if not self.ctx:
            raise ModelLoadError(f"llama.cpp could not create a context of {slots} x "
                                 f"{slot_context} tokens (memory?)")
        self.slots = slots
        self.slot_context = lib.llama_n_ctx_seq(self.ctx) if hasattr(
            lib, "llama_n_ctx_seq") else slot_context
        self.memory = lib.llama_get_memory(self.ctx)
        self.batch = lib.llama_batch_init(self.n_batch, 0, 1)

    def close_context(self) -> None:
        if self.batch is not None:
            self.lib.llama_batch_free(self.batch)
            self.batch = None
        if self.ctx:
            self.lib.llama_free(self.ctx)
            self.ctx = None

    def __del__(self):
        try:
            self.close_context()
            if getattr(self, "model", None):
                self.lib.llama_model_free(self.model)
                self.model = None
        except Exception:  # interpreter shutdown: the library may be gone already
            pass

    # tokens ---------------------------------------------------------------------------
    def tokenize(self, text: str) -> list[int]:
        """BPE ids of plain text (no special-token parsing: the caller splits those out)."""
        data = text.encode("utf-8")
        size = len(data) + 8
        while True:
            buffer = (self.lib.llama_token * size)()
            n = self.lib.llama_tokenize(self.vocab, data, len(data), buffer, size, False,
                                        False)
            if n >= 0:
                return list(buffer[:n])
            size = -n

    def attr(self, token: int) -> int:
        return self.lib.llama_vocab_get_attr(self.vocab, token)

    def text(self, token: int) -> str:
        """The token as the vocabulary stores it (byte-level form for BPE tokens)."""
        return (self.lib.llama_vocab_get_text(self.vocab, token) or b"").decode("utf-8")

    def meta(self, key: str) -> str | None:
        size = 1 << 16
        while True:
            buffer = ctypes.create_string_buffer(size)
            n = self.lib.llama_model_meta_val_str(self.model, key.encode(), buffer, size)
            if n < 0:
                return None
            if n < size:
                return buffer.raw[:n].decode("utf-8")
            size = n + 1

    # the KV cache and decoding ----------------------------------------------------------
    def forget(self, slot: int, start: int = 0) -> None:
        """Drop the slot's cached positions from `start` on."""
        self.lib.llama_memory_seq_rm(self.memory, slot, start, -1)

    def decode(self, entries: list[tuple[int, int, int, bool]]) -> None:
        """One llama_decode of (token, position, slot, wants logits) entries."""
        batch = self.batch
        for i, (token, pos, slot, logits) in enumerate(entries):
            batch.token[i] = token
            batch.pos[i] = pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = slot
            batch.logits[i] = logits
        batch.n_tokens = len(entries)
        code = self.lib.llama_decode(self.ctx, batch)
        if code != 0:
            raise RuntimeError(f"llama_decode failed ({code}): the context is full or the "
                               "batch invalid")

    def save_sequence(self, slot: int):
        """The slot's KV cache as llama.cpp's sequence state (a byte buffer)."""
        size = self.lib.llama_state_seq_get_size(self.ctx, slot)
        state = (ctypes.c_uint8 * size)()
        if self.lib.llama_state_seq_get_data(self.ctx, state, size, slot) != size:
            raise RuntimeError(f"llama.cpp could not save sequence {slot}")
        return state

    def restore_sequence(self, slot: int, state) -> bool:
        """The slot's KV cache replaced by a saved state; False if llama.cpp refused it."""
        self.forget(slot)
        return self.lib.llama_state_seq_set_data(self.ctx, state, len(state), slot) > 0

    def logits(self, index: int):
        import numpy as np

        pointer = self.lib.llama_get_logits_ith(self.ctx, index)
        return np.ctypeslib.as_array(pointer, shape=(self.n_vocab,))


_QUIET: list = []


def quiet_logs() -> None:
    """llama.cpp logs every step to stderr by default; keep its warnings and errors."""
    llama_cpp = load_llama_cpp()
    if _QUIET:
        return

    shown = [False]

    def log(level, text, data):
        # ggml.h: DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5 (goes on with the last line)
        shown[0] = level in (3, 4) or (level == 5 and shown[0])
        # Expected here: a slot longer than the training context (by design: the 4,096
        # window plus a turn), and llama.cpp re-typing `<|fim_prefix|>`-like tokens as
        # control tokens (the backend reads the tokenizer's own types from `llds.tokenizer`).
        if b"n_ctx_seq" in text or b"control-looking token" in text:
            shown[0] = False
        if shown[0]:
            os.write(2, text)

    _QUIET.append(llama_cpp.llama_log_callback(log))
    llama_cpp.llama_log_set(_QUIET[0], ctypes.c_void_p(0))


@dataclass
class _Row:
    """One sequence being generated: its slot, what it fed, what it generated."""

    slot: int
    ids: list[int]  # the context
    budget: int
    new: list[int] = field(default_factory=list)
    text: str = ""
    decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace"))
    shared: int = 0  # context tokens its slot already holds
    finish: str | None = None
    pending: int = 0  # index of the row's logits in the last decode
    logits: object = None  # the next token's logits (a NumPy copy)


class LlamaCppBackend:
    name = "llamacpp"

    def __init__(self, model: str, slots: int = DEFAULT_SLOTS,
                 slot_context: int = DEFAULT_SLOT_CONTEXT, threads: int | None = None,
                 n_batch: int = 512, reuse_cache: bool = True,
                 stop_strings: Sequence[str] = protocol.STOP_STRINGS,
                 n_ubatch: int | None = None, flash_attn: bool | None = None,
                 kv_type: str = "f16", mmap: bool = True):
        load_llama_cpp()
        self.path = find_gguf(model)
        self.model_id = model
        self.device = "cpu"
        self.threads = threads or default_threads()
        self._model = m = _Model(self.path, 1, slot_context, self.threads, n_batch,
                                 n_ubatch, flash_attn, kv_type, mmap)
        arch = m.meta("general.architecture")
        if arch != "qwen2":
            raise ModelLoadError(f"{self.path} is a {arch} model: the llamacpp backend runs "
                                 "Qwen2-family GGUFs written by app.quantize")
        self.max_slots = max(1, slots)
        self.slot_context = slot_context
        self.reuse_cache = reuse_cache
        self.stop_strings = tuple(stop_strings)
        facts = json.loads(m.meta(KEY_TOKENIZER) or "{}")
        if not facts:  # a GGUF from elsewhere: llama.cpp's own view of its vocabulary
            attrs = {t: m.attr(t) for t in range(m.n_vocab)}
            control, user = m.lib.LLAMA_TOKEN_ATTR_CONTROL, m.lib.LLAMA_TOKEN_ATTR_USER_DEFINED
            facts = {"normalizer": "",
                     "eos_ids": [t for t in attrs if m.lib.llama_vocab_is_eog(m.vocab, t)],
                     "added_ids": [t for t, a in attrs.items() if a & (control | user)],
                     "special_ids": [t for t, a in attrs.items() if a & control]}
        self.normalizer = facts["normalizer"]
        self.eos_ids = sorted(facts["eos_ids"])
        self.added = {m.text(t): t for t in facts["added_ids"]}
        self._added_ids = set(self.added.values())
        # Added tokens are matched in the text first, longest first (as the Hugging Face
        # tokenizer's added vocabulary does), and BPE runs on the text between them.
        self._added_re = re.compile("|".join(
            re.escape(t) for t in sorted(self.added, key=len, reverse=True) if t)) \
            if self.added else None
        tags = set(protocol.PROTOCOL_TAGS)
        self.control_ids = {t for t in facts["special_ids"] if m.text(t) not in tags}
        self._pieces: dict[int, bytes] = {}
        self._bytes = _byte_decoder()
        special = {}
        for name, key in (("eos_token", "tokenizer.ggml.eos_token_id"),
                          ("bos_token", "tokenizer.ggml.bos_token_id"),
                          ("pad_token", "tokenizer.ggml.padding_token_id"),
                          ("unk_token", "tokenizer.ggml.unknown_token_id")):
            value = m.meta(key)
            if value is not None and 0 <= int(value) < m.n_vocab:
                special[name] = self._piece(int(value)).decode("utf-8", "replace")
        self.tokenizer = ChatTemplate(m.meta("tokenizer.chat_template"), special)
        self.file_type = m.meta("general.file_type")
        self._slots: list[list[int]] = [[]]  # the tokens each slot's KV cache holds
        # The instruction every prompt starts with, read once: its ids and its KV cache,
        # saved (llama.cpp's sequence state) and restored into any slot that lacks it.
        self._prefix_ids: list[int] | None = None
        self._prefix_state: tuple[int, ctypes.Array] | None = None  # (slots, state)
        self._lock = threading.Lock()  # one generation at a time on this model
        # Where the time goes, summed over calls: context tokens fed (prompt processing)
        # and generated tokens fed back (decoding), with the seconds of their decodes.
        self.timings = {"prompt_tokens": 0, "prompt_s": 0.0, "decode_tokens": 0,
                        "decode_s": 0.0}

    # text -------------------------------------------------------------------------------
    def build_prompt(self, question: str) -> str:
        return protocol.build_prompt(question, self.tokenizer)

    def encode(self, text: str) -> list[int]:
        """Token ids of one piece of text, as the Hugging Face tokenizer gives them with
        add_special_tokens=False: added tokens (special or not) matched first, the text
        between them normalised (NFC for Qwen2) and BPE-tokenized by llama.cpp."""
        ids: list[int] = []
        start = 0
        for match in (self._added_re.finditer(text) if self._added_re else ()):
            ids += self._plain(text[start:match.start()])
            ids.append(self.added[match.group()])
            start = match.end()
        return ids + self._plain(text[start:])

    def _plain(self, text: str) -> list[int]:
        if self.normalizer == "NFC":
            text = unicodedata.normalize("NFC", text)
        return self._model.tokenize(text) if text else []

    def count_tokens(self, text: str) -> int:
        return len(self.encode(text))

    def truncate(self, text: str, max_tokens: int) -> str:
        ids = self.encode(text)
        if len(ids) <= max_tokens:
            return text
        return b"".join(self._piece(i) for i in ids[:max_tokens]).decode("utf-8", "replace")

    def context_ids(self, context: Sequence[str], keep_last: int | None = None) -> list[int]:
        """Segments tokenized one by one and concatenated, as Search-R1 builds rollouts;
        only the last `keep_last` tokens when given (its rolling window)."""
        ids = [i for segment in context for i in self.encode(segment)]
        return ids[-keep_last:] if keep_last else ids

    def decode(self, ids: Sequence[int]) -> str:
        """Generated ids as text: control tokens left out, the protocol's tags kept."""
        return b"".join(self._piece(i) for i in ids
                        if i not in self.control_ids).decode("utf-8", "replace")

    def _piece(self, token: int) -> bytes:
        """A token's bytes: an added token's text as is, a BPE token's byte-level form
        mapped back to bytes (not llama.cpp's view, which re-types some tokens)."""
        found = self._pieces.get(token)
        if found is None:
            text = self._model.text(token)
            if token in self._added_ids or any(c not in self._bytes for c in text):
                found = text.encode("utf-8")
            else:
                found = bytes(self._bytes[c] for c in text)
            self._pieces[token] = found
        return found

    def forget_cache(self) -> None:
        """Drop the KV caches kept between turns (after the weights change)."""
        with self._lock:
            for slot in range(len(self._slots)):
                self._model.forget(slot)
            self._slots = [[] for _ in self._slots]
            self._prefix_state = None

    # the instruction prefix ---------------------------------------------------------------
    def instruction_prefix(self) -> list[int]:
        """The ids every question's prompt starts with (the chat template and Search-R1's
        instruction, up to the question): those two unlike prompts share. A question's
        first word may merge with the text before it, so the shared ids stop before it."""
        if self._prefix_ids is None:
            first, second = (self.context_ids([self.build_prompt(q)]) for q in _PROBES)
            n = 0
            for a, b in zip(first, second, strict=False):
                if a != b:
                    break
                n += 1
            self._prefix_ids = first[:n]
        return self._prefix_ids

    def _with_prefix(self, rows: list[_Row]) -> None:
        """Give each row that starts with the instruction prefix, and whose slot lacks it,
        the prefix's saved KV cache (computed the first time, in that row's slot)."""
        prefix = self.instruction_prefix()
        size = len(prefix)
        for row in rows:
            if size < 2 or row.shared >= size or len(row.ids) <= size \
                    or row.ids[:size] != prefix:
                continue
            # A saved state fits only a context of as many sequences as the one it came
            # from (llama.cpp: "n_stream mismatch"): a reopened context reads it again.
            if self._prefix_state is None or self._prefix_state[0] != self._model.slots \
                    or not self._model.restore_sequence(row.slot, self._prefix_state[1]):
                self._model.forget(row.slot)
                self._slots[row.slot] = []
                self._prefill([_Row(row.slot, prefix, 0)], [0], None)
                self._prefix_state = (self._model.slots, self._model.save_sequence(row.slot))
            self._slots[row.slot] = list(prefix)
            row.shared = size

    # the slots ----------------------------------------------------------------------------
    def _ensure_slots(self, n: int) -> None:
        if n <= self._model.slots:
            return
        self._model.open(n, self.slot_context)
        self._slots = [[] for _ in range(n)]

    def _assign(self, rows: list[list[int]], reuse: bool = True) -> list[tuple[int, int]]:
        """(slot, shared prefix) for each row: the free slot whose cache shares the longest
        prefix with it, cropped to that prefix (at least one token is left to feed)."""
        free = list(range(self._model.slots))
        out = []
        for ids in rows:
            best, best_n = free[0], -1
            for slot in free:
                cached = self._slots[slot] if reuse else []
                n = 0
                for a, b in zip(cached, ids, strict=False):
                    if a != b:
                        break
                    n += 1
                if n > best_n:
                    best, best_n = slot, n
            free.remove(best)
            shared = min(best_n, len(ids) - 1)
            self._model.forget(best, shared)
            self._slots[best] = self._slots[best][:shared]
            out.append((best, shared))
        return out

    # generation ---------------------------------------------------------------------------
    def _prefill(self, rows: list[_Row], starts: list[int],
                 cancel: threading.Event | None) -> bool:
        """Feed each row's context from its cached prefix on, `n_batch` tokens per decode,
        logits for each row's last token; False if cancelled on the way."""
        model = self._model
        queue = [(r, pos) for r, start in zip(rows, starts, strict=True)
                 for pos in range(start, len(r.ids))]
        for begin in range(0, len(queue), model.n_batch):
            if cancel is not None and cancel.is_set():
                return False
            chunk = queue[begin:begin + model.n_batch]
            entries = []
            for i, (row, pos) in enumerate(chunk):
                last = pos == len(row.ids) - 1
                if last:
                    row.pending = i
                entries.append((row.ids[pos], pos, row.slot, last))
            started = time.perf_counter()
            model.decode(entries)
            self.timings["prompt_s"] += time.perf_counter() - started
            self.timings["prompt_tokens"] += len(entries)
            for row, pos in chunk:
                self._slots[row.slot].append(row.ids[pos])
            for row in {id(r): r for r, pos in chunk if pos == len(r.ids) - 1}.values():
                row.logits = model.logits(row.pending).copy()
        return True

    def _choose(self, logits, sampling: Sampling, rng) -> int:
        import numpy as np

        if sampling.greedy:
            return int(np.argmax(logits))
        scores = logits.astype(np.float64) / max(sampling.temperature, 1e-5)
        probs = np.exp(scores - scores.max())
        probs /= probs.sum()
        if sampling.top_p < 1.0:
            order = np.argsort(-probs, kind="stable")
            cumulative = np.cumsum(probs[order])
            keep = order[:int(np.searchsorted(cumulative, sampling.top_p) + 1)]
            kept = np.zeros_like(probs)
            kept[keep] = probs[keep]
            probs = kept / kept.sum()
        return int(rng.choice(len(probs), p=probs))

    def _accept(self, row: _Row, token: int) -> str:
        """Take a generated token: update the row's text and say what it adds (a delta)."""
        row.new.append(token)
        if token in self.eos_ids:
            row.finish = "eos"
            return row.decoder.decode(b"", final=True)
        delta = "" if token in self.control_ids else row.decoder.decode(self._piece(token))
        row.text += delta
        if protocol.find_stop(row.text, self.stop_strings) >= 0:
            row.finish = "stop"
        elif len(row.new) >= row.budget:
            row.finish = "length"
        if row.finish:
            tail = row.decoder.decode(b"", final=True)
            row.text += tail
            delta += tail
        return delta

    def _rows(self, contexts: list[list[int]], budgets: Sequence[int],
              sampling: Sampling | None = None) -> list[_Row]:
        """A row in a slot for each context (at most `slots`), its cache cropped to the
        prefix it shares with the context. Seeded sampling starts from an empty cache: a
        cached prefix gives logits a rounding error away from a fresh one, which moves
        where a seeded draw lands; from scratch, the same call draws the same tokens."""
        reuse = self.reuse_cache and (sampling is None or sampling.greedy
                                      or sampling.seed is None)
        need = max(len(ids) + budget for ids, budget in zip(contexts, budgets, strict=True))
        if need > self._model.slot_context:  # longer slots (the caches start afresh)
            self.slot_context = -(-need // 1024) * 1024
            self._model.open(self._model.slots, self.slot_context)
            self._slots = [[] for _ in range(self._model.slots)]
        rows = [_Row(slot, ids, budget, shared=shared) for (slot, shared), ids, budget
                in zip(self._assign(contexts, reuse), contexts, budgets, strict=True)]
        if reuse:
            self._with_prefix(rows)
        return rows

    def _run(self, rows: list[_Row], sampling: Sampling, rng,
             cancel: threading.Event | None = None) -> Iterator[tuple[_Row, str]]:
        """Generate one turn for each row, yielding (row, text delta) as tokens come; each
        row ends at EOS, a stop string or its budget (`row.finish`). The caller holds the
        lock."""
        model = self._model
        if not self._prefill(rows, [r.shared for r in rows], cancel):
            for row in rows:
                row.finish = "cancelled"
            return
        for row in rows:
            if row.budget <= 0:
                row.finish = "length"
        running = [r for r in rows if r.finish is None]
        while running:
            if cancel is not None and cancel.is_set():
                for row in running:
                    row.finish = "cancelled"
                    tail = row.decoder.decode(b"", final=True)
                    row.text += tail
                    if tail:
                        yield row, tail
                return
            entries = []
            for row in running:
                token = self._choose(row.logits, sampling, rng)
                delta = self._accept(row, token)
                if delta:
                    yield row, delta
                if row.finish is None:
                    row.pending = len(entries)
                    entries.append((token, len(row.ids) + len(row.new) - 1, row.slot, True))
            running = [r for r in running if r.finish is None]
            if entries:
                started = time.perf_counter()
                model.decode(entries)
                self.timings["decode_s"] += time.perf_counter() - started
                self.timings["decode_tokens"] += len(entries)
                for row in running:
                    self._slots[row.slot].append(row.new[-1])
                    row.logits = model.logits(row.pending).copy()

    def _output(self, row: _Row) -> TurnOutput:
        if row.finish == "eos":
            return TurnOutput(row.text, len(row.new), "eos")
        return TurnOutput(row.text, len(row.new), row.finish or "length")

    def stream(self, context: Sequence[str], max_new_tokens: int, sampling: Sampling,
               cancel: threading.Event | None = None,
               keep_last: int | None = None) -> Iterator[str | TurnOutput]:
        import numpy as np

        with self._lock:
            ids = self.context_ids(context, keep_last)
            [row] = self._rows([ids], [max_new_tokens], sampling)
            for _, delta in self._run([row], sampling, np.random.default_rng(sampling.seed),
                                      cancel):
                yield delta
            yield self._output(row)

    def generate(self, contexts: Sequence[Sequence[str]], max_new_tokens: Sequence[int],
                 sampling: Sampling,
                 keep_last: Sequence[int | None] | None = None) -> list[TurnOutput]:
        import numpy as np

        keep_last = keep_last or [None] * len(contexts)
        ids = [self.context_ids(c, k) for c, k in zip(contexts, keep_last, strict=True)]
        rng = np.random.default_rng(sampling.seed)  # seeded once per call, as hf.py does
        outputs: list[TurnOutput] = []
        with self._lock:
            self._ensure_slots(min(len(ids), self.max_slots))
            width = self._model.slots
            for begin in range(0, len(ids), width):
                rows = self._rows(ids[begin:begin + width],
                                  list(max_new_tokens[begin:begin + width]), sampling)
                for _ in self._run(rows, sampling, rng):
                    pass
                outputs.extend(self._output(r) for r in rows)
        return outputs
