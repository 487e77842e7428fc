"""`python -m app.quantize MODEL --out DIR [--type q4_k_m|q8_0|q4_0|iq4_nl|f16|f32]`: a Qwen2-family
checkpoint as one GGUF file, DIR/model.gguf, for the llama.cpp backend
(`--backend llamacpp --model DIR/model.gguf`).

MODEL is a hub id (fetched, or read from the cache, through `huggingface_hub`) or a local
directory saved with `save_pretrained` (config.json, safetensors or .bin weights, tokenizer
files). The file holds the weights, the tokenizer (vocabulary, merges, token types, special
ids) and the chat template, so the backend needs nothing else.

The GGUF is written here with the `gguf` package's GGUFWriter, tensor names from its
Qwen2 tables; tensors are streamed one at a time, so converting a 3B model needs no more
memory than its largest tensor. `f16` keeps 1-D tensors (norms, biases) in f32 and stores
the rest in f16; `f32` keeps everything in f32 (the closest to torch, for parity checks);
`q8_0`, `q4_k_m`, `q4_0` and `iq4_nl` are made from the f16 file by llama.cpp's own quantizer
(`llama_cpp.llama_model_quantize`), and the f16 file is then removed (`--keep-f16`).

The tokenizer must be one llama.cpp can reproduce: byte-level BPE whose pre-tokenization
rules are those of a pre-tokenizer llama.cpp implements. The rules are read from the
tokenizer as transformers loads it (transformers 5 gives every Qwen2 checkpoint Qwen2's
split regex, whatever its tokenizer.json holds) and named here (that regex is llama.cpp's
`qwen2`; the nano agent's tokenizer, which llama.cpp's own converter cannot name, splits by
it too), never guessed from a hash of sample encodings. Its normaliser (NFC for
Qwen2) is recorded in the file (`llds.tokenizer`, with the turn-ending ids and the added
tokens): llama.cpp does not normalise, so the backend applies it before tokenizing. Anything
else is refused with the reason.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ARCHITECTURES = ("Qwen2ForCausalLM",)  # what this converter writes (llama.cpp's `qwen2`)
TYPES = ("f16", "q8_0", "q4_k_m", "q4_0", "iq4_nl", "f32")
# llama.cpp's `enum llama_ftype` values of the quantized types.
LLAMA_FTYPES = {"q4_0": 2, "q8_0": 7, "q4_k_m": 15, "iq4_nl": 25}
# Pre-tokenization rules llama.cpp implements, by the Split regex of tokenizer.json.
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZERS = {QWEN2_SPLIT: "qwen2"}
# Metadata of ours (llama.cpp ignores keys it does not know): the Hugging Face tokenizer's
# facts llama.cpp's vocabulary does not keep, as one JSON string (llama.cpp's C API reads
# strings, not arrays): its normaliser, the ids that end a turn, and which ids are added
# tokens (matched in text before BPE) and which of those are special (left out of
# generated text). llama.cpp re-types some tokens on load (`<|fim_prefix|>`, even Qwen's
# plain `</s>`, become control tokens), so the backend reads these instead.
KEY_TOKENIZER = "llds.tokenizer"
KEY_SOURCE = "llds.source"
WEIGHT_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model"]


class ConversionError(ValueError):
    """A checkpoint this converter cannot write faithfully; the message says why."""


@dataclass
class Written:
    path: Path
    type: str
    size: int
    seconds: float
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (f"wrote {self.path} ({self.type}, {self.size / 1e6:,.1f} MB) in "
                f"{self.seconds:.1f} s")


# ---------------------------------------------------------------------------- the source

Progress = Callable[[str], None]  # told what a conversion is doing, a line at a time


def _silent(line: str) -> None:
    pass




def locate(model: str, progress: Progress = _silent) -> Path:
    """The directory holding `model`: a local directory as is, a hub id through
    huggingface_hub (the cache, else a download of the config, weights and tokenizer).
    A shipped model's short name (nano) wins over a directory of that name here."""
    from agent.models import lookup

    info = lookup(model)
    path = info.local if info is not None and info.local is not None else Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConversionError(f"{path} has no config.json: point MODEL at a directory "
                                  "saved with save_pretrained.")
        return path
    from agent.backends.base import ModelLoadError
    from agent.models import check_loadable, resolve

    try:
        model = resolve(model)  # a shipped model's short name (nano)
        if Path(model).is_dir():
            return Path(model)
        check_loadable(model)  # fails fast, saying what to do, when offline and uncached
        from huggingface_hub import snapshot_download

        progress(f"fetching {model} (the Hugging Face cache, else a download from the Hub)")
        return Path(snapshot_download(model, allow_patterns=WEIGHT_PATTERNS))
    except ModelLoadError as err:  # its advice (a local copy instead of the hub id) fits here
        raise ConversionError(str(err)) from err


def read_config(directory: Path) -> dict:
    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    architectures = config.get("architectures") or [config.get("model_type", "?")]
    if not set(architectures) & set(ARCHITECTURES):
        raise ConversionError(
            f"cannot convert {directory}: its architecture is {', '.join(architectures)} "
            f"(model_type {config.get('model_type')!r}); app.quantize converts the Qwen2 "
            f"family only ({', '.join(ARCHITECTURES)}: Qwen2.5, the LLDS and Search-R1 "
            "checkpoints, the nano agent).")
    if config.get("use_sliding_window"):
        raise ConversionError("cannot convert a Qwen2 checkpoint with use_sliding_window on: "
                              "llama.cpp's qwen2 attends to the whole context.")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ("default", None):
        raise ConversionError(f"cannot convert RoPE scaling {kind!r}: this converter writes "
                              "plain RoPE (rope_theta) only.")
    return config


def rope_theta(config: dict) -> float:
    rope = config.get("rope_parameters") or {}
    return float(rope.get("rope_theta", config.get("rope_theta", 10000.0)))


def weight_files(directory: Path) -> list[Path]:
    found = sorted(directory.glob("*.safetensors")) or sorted(directory.glob("*.bin"))
    if not found:
        raise ConversionError(f"{directory} has no *.safetensors or *.bin weights.")
    return found


def tensors(directory: Path) -> Iterator[tuple[str, tuple[int, ...], object]]:
    """(HF name, shape, a function returning the tensor as float32 numpy), one at a time."""
    for path in weight_files(directory):
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            handle = safe_open(str(path), framework="pt")  # open while loaders live
            for name in handle.keys():
                shape = tuple(handle.get_slice(name).get_shape())
                yield name, shape, (lambda h=handle, n=name: _numpy(h.get_tensor(n)))
        else:
            import torch

            state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
            for name, tensor in state.items():
                yield name, tuple(tensor.shape), (lambda t=tensor: _numpy(t))


def _numpy(tensor):
    import torch

    return tensor.to(torch.float32).numpy()


# ------------------------------------------------------------------------- the tokenizer


@dataclass
class Vocabulary:
    tokens: list[str]
    types: list[int]
    merges: list[str]
    pre: str
    normalizer: str  # "" or "NFC"
    eos_ids: list[int]
    eos: int | None
    pad: int | None
    bos: int | None
    chat_template: str | None
    notes: list[str]


def pre_tokenizer_name(spec: dict) -> str:
    """llama.cpp's name for the pre-tokenization rules of tokenizer.json's pre_tokenizer."""
    steps = spec.get("pretokenizers", [spec]) if spec.get("type") == "Sequence" else [spec]
    split = [s for s in steps if s.get("type") == "Split"]
    level = [s for s in steps if s.get("type") == "ByteLevel"]
    if (len(steps) == 2 and len(split) == 1 and len(level) == 1 and steps[1] is level[0]
            and split[0].get("behavior") == "Isolated" and not split[0].get("invert")
            and not level[0].get("use_regex") and not level[0].get("add_prefix_space")):
        regex = split[0].get("pattern", {}).get("Regex")
        if regex in PRE_TOKENIZERS:
            return PRE_TOKENIZERS[regex]
    raise ConversionError(
        "cannot convert the tokenizer: its pre-tokenization rules "
        f"({json.dumps(spec)[:300]}) are not ones this converter can name for llama.cpp "
        f"(it knows Qwen2's split regex, llama.cpp's `qwen2`), so llama.cpp would split "
        "text differently from the Hugging Face tokenizer.")


def normalizer_name(spec: dict | None) -> str:
    if spec is None:
        return ""
    if spec.get("type") == "NFC":
        return "NFC"
    if spec.get("type") == "Sequence" and all(n.get("type") == "NFC"
                                              for n in spec.get("normalizers", [])):
        return "NFC" if spec.get("normalizers") else ""
    raise ConversionError(f"cannot convert the tokenizer: its normalizer {json.dumps(spec)} "
                          "is not NFC or none.")


def read_vocabulary(directory: Path, config: dict) -> Vocabulary:
    import gguf
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ConversionError("cannot convert: the tokenizer has no fast (tokenizer.json) form.")
    spec = json.loads(backend.to_str())
    model = spec["model"]
    if model.get("type") != "BPE" or model.get("byte_fallback"):
        raise ConversionError(f"cannot convert a {model.get('type')} tokenizer: llama.cpp's "
                              "gpt2-style vocabulary is byte-level BPE.")
    if (spec.get("decoder") or {}).get("type") != "ByteLevel":
        raise ConversionError("cannot convert the tokenizer: its decoder is not ByteLevel.")
    if model.get("ignore_merges"):
        raise ConversionError("cannot convert a BPE tokenizer with ignore_merges on: "
                              "llama.cpp's qwen2 pre-tokenizer applies the merges.")
    pre = pre_tokenizer_name(spec["pre_tokenizer"])
    normalizer = normalizer_name(spec.get("normalizer"))
    notes = []
    size = int(config["vocab_size"])
    vocab = tokenizer.get_vocab()
    if max(vocab.values()) >= size:
        raise ConversionError(f"the tokenizer has ids up to {max(vocab.values())}, the model "
                              f"only {size} embedding rows.")
    tokens = [f"[PAD{i}]" for i in range(size)]
    types = [gguf.TokenType.UNUSED] * size
    for text, i in vocab.items():
        tokens[i], types[i] = text, gguf.TokenType.NORMAL
    for added in spec.get("added_tokens", []):
        i = added["id"]
        tokens[i] = added["content"]
        types[i] = gguf.TokenType.CONTROL if added["special"] else gguf.TokenType.USER_DEFINED
        if added.get("lstrip") or added.get("rstrip") or added.get("single_word"):
            notes.append(f"added token {added['content']!r} strips spaces or matches single "
                         "words in Hugging Face; llama.cpp may split around it differently")
    padded = size - len(vocab)
    if padded:
        notes.append(f"{padded} embedding rows past the tokenizer's {len(vocab)} tokens "
                     "written as unused [PAD] tokens")
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    eos_ids = _eos_ids(directory, tokenizer, config)
    template = tokenizer.chat_template
    if isinstance(template, dict):
        template = template.get("default")
    return Vocabulary(tokens, [int(t) for t in types], merges, pre, normalizer, eos_ids,
                      tokenizer.eos_token_id, tokenizer.pad_token_id,
                      tokenizer.bos_token_id if tokenizer.bos_token_id is not None
                      else config.get("bos_token_id"), template, notes)


def _eos_ids(directory: Path, tokenizer, config: dict) -> list[int]:
    """The ids that end a turn, as the transformers backend takes them: the tokenizer's
    EOS, generation_config's, and Qwen2.5's `<|im_end|>` / `<|endoftext|>` when present."""
    ids: set[int] = set()
    sources = [tokenizer.eos_token_id, config.get("eos_token_id")]
    generation = directory / "generation_config.json"
    if generation.is_file():
        sources.append(json.loads(generation.read_text(encoding="utf-8")).get("eos_token_id"))
    for source in sources:
        if isinstance(source, int):
            ids.add(source)
        elif source:
            ids.update(int(i) for i in source)
    vocab = tokenizer.get_vocab()
    ids.update(vocab[t] for t in ("<|im_end|>", "<|endoftext|>") if t in vocab)
    return sorted(ids)


# ---------------------------------------------------------------------------- the writer


def write_gguf(directory: Path, out: Path, kind: str = "f16", source: str = "",
               progress: Progress = _silent) -> list[str]:
    """The checkpoint in `directory` as a GGUF at `out`, in f16 or f32; returns notes.
    `progress` hears of every tensor written."""
    import gguf
    import numpy as np

    if kind not in ("f16", "f32"):
        raise ValueError(f"write_gguf writes f16 or f32, not {kind!r}")
    config = read_config(directory)
    vocab = read_vocabulary(directory, config)
    layers = int(config["num_hidden_layers"])
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2, layers)
    arch = gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.QWEN2]
    tied = bool(config.get("tie_word_embeddings"))

    plan = []  # (gguf name, shape, loader, numpy dtype)
    for hf_name, shape, load in tensors(directory):
        if hf_name.endswith("rotary_emb.inv_freq") or (tied and hf_name == "lm_head.weight"):
            continue
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ConversionError(f"cannot convert tensor {hf_name!r}: no Qwen2 GGUF name.")
        dtype = np.float16 if kind == "f16" and len(shape) > 1 else np.float32
        plan.append((name, shape, load, dtype))
    expected = {"token_embd.weight", "output_norm.weight", *(
        f"blk.{i}.{part}" for i in range(layers) for part in (
            "attn_norm.weight", "attn_q.weight", "attn_q.bias", "attn_k.weight", "attn_k.bias",
            "attn_v.weight", "attn_v.bias", "attn_output.weight", "ffn_norm.weight",
            "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"))}
    if not tied:
        expected.add("output.weight")
    missing = expected - {p[0] for p in plan}
    if missing:
        raise ConversionError(f"the checkpoint lacks {len(missing)} tensor(s) a Qwen2 GGUF "
                              f"needs, e.g. {sorted(missing)[:3]}")
    plan.sort(key=lambda p: _order(p[0]))

    heads = int(config["num_attention_heads"])
    hidden = int(config["hidden_size"])
    out.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(out), arch)
    writer.add_name(source or directory.name)
    writer.add_context_length(int(config.get("max_position_embeddings", 32768)))
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(int(config["intermediate_size"]))
    writer.add_head_count(heads)
    writer.add_head_count_kv(int(config.get("num_key_value_heads", heads)))
    head_dim = config.get("head_dim") or hidden // heads
    if head_dim != hidden // heads:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
        writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(rope_theta(config))
    writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-6)))
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if kind == "f16"
                         else gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    writer.add_token_merges(vocab.merges)
    if vocab.eos is not None:
        writer.add_eos_token_id(vocab.eos)
    if vocab.pad is not None:
        writer.add_pad_token_id(vocab.pad)
    if vocab.bos is not None:
        writer.add_bos_token_id(int(vocab.bos))
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)
    if vocab.chat_template:
        writer.add_chat_template(vocab.chat_template)
    writer.add_string(KEY_TOKENIZER, json.dumps({
        "normalizer": vocab.normalizer, "eos_ids": vocab.eos_ids,
        "added_ids": [i for i, t in enumerate(vocab.types)
                      if t in (gguf.TokenType.CONTROL, gguf.TokenType.USER_DEFINED)],
        "special_ids": [i for i, t in enumerate(vocab.types) if t == gguf.TokenType.CONTROL]}))
    writer.add_string(KEY_SOURCE, source or str(directory))

    for name, shape, _, dtype in plan:
        count = 1
        for n in shape:
            count *= n
        writer.add_tensor_info(name, shape, np.dtype(dtype), count * np.dtype(dtype).itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for number, (_, shape, load, dtype) in enumerate(plan, 1):
        progress(f"writing the {kind} GGUF: tensor {number} of {len(plan)}")
        array = np.ascontiguousarray(load().astype(dtype, copy=False))
        assert array.shape == shape
        writer.write_tensor_data(array)
        del array
    writer.close()
    return vocab.notes


def _order(name: str) -> tuple:
    """Embeddings, blocks in order, then the head (the order llama.cpp's own files use)."""
    if name.startswith("blk."):
        parts = name.split(".", 2)
        return (1, int(parts[1]), parts[2])
    return (0 if name.startswith("token_embd") else 2, 0, name)


# ---------------------------------------------------------------------------- quantizing


def quantize_gguf(source: Path, out: Path, kind: str, threads: int | None = None) -> None:
    """`source` (an f16 GGUF) quantized to `kind` at `out` by llama.cpp's quantizer."""
    from agent.backends.llamacpp import load_llama_cpp, quiet_logs

    llama_cpp = load_llama_cpp()
    quiet_logs()  # llama.cpp's warnings and errors only, not a line per tensor
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = LLAMA_FTYPES[kind]
    params.nthread = threads or os.cpu_count() or 1
    code = llama_cpp.llama_model_quantize(str(source).encode(), str(out).encode(),
                                          ctypes.byref(params))
    if code != 0:
        raise RuntimeError(f"llama_model_quantize failed ({code}) on {source}")


def convert(model: str, out_dir: str | Path, kind: str = "q4_k_m", keep_f16: bool = False,
            threads: int | None = None, progress: Progress = _silent) -> Written:
    """MODEL (hub id or directory) as `out_dir/model.gguf` of type `kind`; `progress`
    hears what it is doing (fetching, each tensor written, quantizing)."""
    if kind not in TYPES:
        raise ConversionError(f"--type is one of {', '.join(TYPES)}, not {kind!r}")
    start = time.perf_counter()
    directory = locate(model, progress)
    out_dir = Path(out_dir)
    target = out_dir / "model.gguf"
    intermediate = out_dir / "model-f16.gguf"
    try:
        if kind in ("f16", "f32"):
            notes = write_gguf(directory, target, kind, model, progress)
        else:
            notes = write_gguf(directory, intermediate, "f16", model, progress)
            progress(f"quantizing to {kind} with llama.cpp")
            quantize_gguf(intermediate, target, kind, threads)
            if keep_f16:
                notes.append(f"kept the f16 file {intermediate}")
    except BaseException:
        target.unlink(missing_ok=True)  # never leave a half-written model.gguf
        raise
    finally:
        if not keep_f16:
            intermediate.unlink(missing_ok=True)
    return Written(target, kind, target.stat().st_size, time.perf_counter() - start, notes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.quantize", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="hub id, local directory, or a shipped model (nano)")
    parser.add_argument("--out", required=True, help="directory for model.gguf")
    parser.add_argument("--type", choices=TYPES, default="q4_k_m",
                        help="q4_k_m (default), q8_0, q4_0, iq4_nl, f16 or f32")
    parser.add_argument("--keep-f16", action="store_true",
                        help="keep the f16 GGUF a quantized type is made from")
    parser.add_argument("--threads", type=int, default=None, help="quantizer threads")
    args = parser.parse_args(argv)
    from agent.backends.base import ModelLoadError

    try:
        written = convert(args.model, args.out, args.type, args.keep_f16, args.threads)
    except (ConversionError, ModelLoadError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except ImportError as err:
        print(f"error: {err.name or err} is not installed: "
              "pip install -r requirements-llamacpp.txt", file=sys.stderr)
        return 2
    for note in written.notes:
        print(f"note: {note}")
    print(written.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
