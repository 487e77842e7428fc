"""The llama.cpp backend and the GGUF converter, on models the tests build or the repository
ships: the nano agent (assets/nano-agent, its own vocabulary) and tiny Qwen2 models on
Qwen2.5's real vocabulary (random weights, and a `scripted` one that walks fixed token
paths, as tests/test_qwen_vocab.py builds them). Each runs against the transformers
backend on the same checkpoint. benchmarks/llamacpp.py measures the same on the whole
vitalqa set and on Qwen2.5-3B's shape.

Skipped where llama-cpp-python or gguf is not installed
(`pip install -r requirements-llamacpp.txt`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import unicodedata
from pathlib import Path
from types import SimpleNamespace

import pytest

llama_cpp = pytest.importorskip(
    "llama_cpp", reason="llama-cpp-python is not installed: pip install -r "
    "requirements-llamacpp.txt")
pytest.importorskip("gguf", reason="gguf is not installed: pip install -r "
                    "requirements-llamacpp.txt")

from agent import protocol  # noqa: E402
from agent.backends.base import ModelLoadError, Sampling, TurnOutput  # noqa: E402
from agent.backends.hf import TransformersBackend  # noqa: E402
from agent.backends.llamacpp import LlamaCppBackend  # noqa: E402
from agent.config import BACKENDS, BackendOptions  # noqa: E402
from agent.events import Finished, TextDelta  # noqa: E402
from agent.loop import AgentSettings, run_agent, run_agent_batch  # noqa: E402
from app.quantize import (  # noqa: E402
    ConversionError,
    convert,
    main,
    normalizer_name,
    pre_tokenizer_name,
)
from benchmarks.llamacpp import (  # noqa: E402
    EXTRA_TEXTS,
    greedy_ids_llama,
    greedy_ids_torch,
    same_steps,
)

# Converts and runs models: outside the fast loop (`pytest -m "not slow"`).
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
NANO = ROOT / "assets" / "nano-agent"


@pytest.fixture(scope="module")
def nano(tmp_path_factory) -> SimpleNamespace:
    out = tmp_path_factory.mktemp("nano-gguf")
    written = convert(str(NANO), out / "f16", "f16")
    return SimpleNamespace(gguf=written.path, written=written,
                           llama=LlamaCppBackend(str(written.path)),
                           hf=TransformersBackend(str(NANO), device="cpu"))


@pytest.fixture(scope="module")
def qwen(tmp_path_factory) -> SimpleNamespace:
    """Qwen2.5's tokenizer under a random tiny Qwen2 (f32 and f16 GGUFs) and a scripted one."""
    from agent.testing import build_qwen_tokenizer, build_random, build_scripted
    from tests.test_qwen_vocab import _paths

    root = tmp_path_factory.mktemp("qwen-gguf")
    tokenizer = build_qwen_tokenizer(root / "tokenizer", "qwen2.5")
    random_dir = build_random(root / "random", tokenizer, hidden_size=64)
    scripted_dir = build_scripted(root / "scripted", tokenizer, _paths(tokenizer, False))
    return SimpleNamespace(
        hf=TransformersBackend(str(random_dir), device="cpu"),
        f32=LlamaCppBackend(str(convert(str(random_dir), root / "f32", "f32").path)),
        f16=LlamaCppBackend(str(convert(str(random_dir), root / "f16", "f16").path)),
        scripted=LlamaCppBackend(str(convert(str(scripted_dir), root / "s", "f16").path)),
        scripted_hf=TransformersBackend(str(scripted_dir), device="cpu"))


# ---------------------------------------------------------------------------- conversion


def test_conversion_writes_weights_tokenizer_and_chat_template(nano, tmp_path, capsys):
    assert nano.gguf.name == "model.gguf" and nano.written.size == nano.gguf.stat().st_size
    model = nano.llama._model
    assert model.meta("general.architecture") == "qwen2"
    assert model.meta("tokenizer.ggml.pre") == "qwen2"  # the nano tokenizer splits as Qwen2
    assert model.meta("tokenizer.chat_template") == nano.hf.tokenizer.chat_template
    facts = json.loads(model.meta("llds.tokenizer"))
    assert facts["normalizer"] == "NFC" and facts["eos_ids"] == nano.hf.eos_ids
    assert model.n_vocab == len(nano.hf.tokenizer)
    # The CLI, quantizing: says what it wrote, its size and the time it took.
    assert main([str(NANO), "--out", str(tmp_path), "--type", "q8_0"]) == 0
    said = capsys.readouterr().out
    assert f"wrote {tmp_path / 'model.gguf'} (q8_0, " in said and " MB) in " in said
    assert not (tmp_path / "model-f16.gguf").exists()  # the intermediate is removed
    assert 0 < (tmp_path / "model.gguf").stat().st_size < 0.6 * nano.written.size
    *_, out = LlamaCppBackend(str(tmp_path)).stream(  # a directory holding model.gguf
        [nano.hf.build_prompt("who wrote hamlet")], 30, Sampling())
    assert out.finish == "stop" and out.text.endswith("</search>")


def test_unsupported_architecture_is_refused_with_the_reason(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(
        {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    with pytest.raises(ConversionError, match="LlamaForCausalLM.*Qwen2 family"):
        convert(str(tmp_path), tmp_path / "out", "f16")
    assert main([str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "Qwen2 family" in capsys.readouterr().err
    assert not (tmp_path / "out" / "model.gguf").exists()


def test_a_tokenizer_llama_cpp_would_split_differently_is_refused():
    """The rules come from the loaded tokenizer (transformers 5 gives every Qwen2 checkpoint
    Qwen2's split, whatever its tokenizer.json says); others have no llama.cpp name here."""
    spec = json.loads((NANO / "tokenizer.json").read_text())
    assert pre_tokenizer_name(spec["pre_tokenizer"]) == "qwen2"
    assert normalizer_name(spec["normalizer"]) == "NFC"
    gpt2 = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
            "use_regex": True}
    other = json.loads(json.dumps(spec["pre_tokenizer"]))
    other["pretokenizers"][0]["pattern"]["Regex"] = r"\w+|\s+|[^\w\s]+"
    for rules in (gpt2, other):
        with pytest.raises(ConversionError, match="pre-tokenization rules"):
            pre_tokenizer_name(rules)
    with pytest.raises(ConversionError, match="normalizer"):
        normalizer_name({"type": "NFKC"})


def test_the_backend_is_chosen_by_name_and_wants_a_gguf(nano, tmp_path):
    assert "llamacpp" in BACKENDS
    backend = BackendOptions(kind="llamacpp").load(str(nano.gguf))
    assert backend.name == "llamacpp"
    with pytest.raises(ModelLoadError, match="python -m app.quantize"):
        BackendOptions(kind="llamacpp").load("nano")  # a checkpoint, not converted yet
    run = subprocess.run([sys.executable, "-m", "app.infer", "who wrote hamlet", "--backend",
                          "llamacpp", "--model", str(nano.gguf), "--engine", "bm25s",
                          "--json"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    last = json.loads(run.stdout.strip().splitlines()[-1])
    assert last["event"] == "Finished" and last["error"] is None, last
    assert last["stop_reason"] in ("answer", "max_turns") and last["searches"] >= 1, last


# ---------------------------------------------------------------------------- tokenization


def _battery() -> list[str]:
    from tests.test_parity_battery import WORDS, make_cases

    texts = [protocol.INVALID_ACTION_MESSAGE, *EXTRA_TEXTS, *WORDS]
    for case in make_cases(count=1500):
        texts += case.turns
        for query, docs in case.docs.items():
            texts += [query, protocol.observation(protocol.render_documents(docs))]
    return list(dict.fromkeys(texts))


@pytest.mark.parametrize("vocabulary", ["nano", "qwen2.5"])
def test_tokenization_is_the_hugging_face_tokenizers(vocabulary, nano, qwen):
    llama, hf = (nano.llama, nano.hf) if vocabulary == "nano" else (qwen.f16, qwen.hf)
    texts = _battery()
    assert len(texts) > 5000
    assert [t for t in texts if llama.encode(t) != hf._encode(t)] == []
    assert [t for t in texts if llama.decode(llama.encode(t)) != hf.decode(hf._encode(t))] == []
    for text in texts[:300]:
        assert llama.truncate(text, 5) == hf.truncate(text, 5)
        assert llama.count_tokens(text) == hf.count_tokens(text)
    for question in ("who wrote hamlet", "東京の人口は", "  naïve café "):
        assert llama.build_prompt(question) == hf.build_prompt(question)
        assert (llama.context_ids([llama.build_prompt(question), " <search> x </search>"])
                == hf.context_ids([hf.build_prompt(question), " <search> x </search>"]))


def test_what_llama_cpp_alone_would_tokenize_differently(qwen):
    """The two things the backend does itself: NFC (llama.cpp does not normalise), and the
    added tokens (llama.cpp re-types Qwen's plain `</s>` as a control token on load)."""
    llama, hf = qwen.f16, qwen.hf
    decomposed = unicodedata.normalize("NFD", "Ünïcödé café")
    assert llama.encode(decomposed) == hf._encode(decomposed)
    assert llama.encode(decomposed) != llama._model.tokenize(decomposed)
    assert llama.encode("a </s> b") == hf._encode("a </s> b")
    raw = (llama_cpp.llama_token * 16)()
    data = b"a </s> b"
    n = llama_cpp.llama_tokenize(llama._model.vocab, data, len(data), raw, 16, False, True)
    assert 128247 in raw[:n] and 128247 not in llama.encode("a </s> b")
    assert "</s>" in llama.decode(hf._encode("a </s> b"))  # not dropped as a control token


# ---------------------------------------------------------------------------- greedy parity


def test_nano_agent_greedy_trajectories_are_torchs(nano, local_retriever):
    from nano.evaluate import vitalqa

    questions = [q.question for q in vitalqa(6)]
    settings = AgentSettings()
    ours = dict(run_agent_batch(questions, nano.llama, local_retriever, settings))
    theirs = dict(run_agent_batch(questions, nano.hf, local_retriever, settings))
    for i in range(len(questions)):
        assert ours[i].trajectory == theirs[i].trajectory, questions[i]
        assert ours[i].new_tokens == theirs[i].new_tokens
    events = list(run_agent(questions[0], nano.llama, local_retriever, settings))
    done = events[-1]
    assert isinstance(done, Finished) and done.trajectory == theirs[0].trajectory
    deltas = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert deltas == "".join(s.text for s in done.segments if s.generated)


@pytest.mark.parametrize("kind", ["f32", "f16"])
def test_scaled_qwen_greedy_tokens_are_torchs(kind, qwen):
    llama = getattr(qwen, kind)
    for question in ("who wrote hamlet", "東京の人口は"):
        ids = qwen.hf.context_ids([qwen.hf.build_prompt(question)])
        assert same_steps(greedy_ids_llama(llama, ids, 48),
                          greedy_ids_torch(qwen.hf, ids, 48)) == 48, question


# ---------------------------------------------------------------------------- stop rules


@pytest.mark.parametrize(("start", "text", "tokens"), [
    (" one", " q </search>", 4),         # ` </search>`: a space-led closer
    (" two", "</search>\n\n", 3),        # `</search>` ends inside `>\n\n`
    (" three", ".</search>", 4),         # `.</` + `sea` + `rch` + `>`
])
def test_a_turn_stops_at_search_whatever_the_token_boundaries(qwen, start, text, tokens):
    backend = qwen.scripted
    *deltas, out = backend.stream([f"Count:{start}"], 50, Sampling())
    assert (out.text, out.new_tokens, out.finish) == (text, tokens, "stop")
    assert "".join(deltas) == text
    [batched] = backend.generate([[f"Count:{start}"]], [50], Sampling())
    assert batched == out


def test_eos_and_the_budget_end_a_turn(qwen):
    backend = qwen.scripted
    assert {151643, 151645} <= set(backend.eos_ids)
    for start, text, tokens in ((" six", " x", 2), (" seven", "東京🙂 ok", 12)):
        *deltas, out = backend.stream([f"Count:{start}"], 50, Sampling())
        reference = list(qwen.scripted_hf.stream([f"Count:{start}"], 50, Sampling()))[-1]
        assert out == reference == TurnOutput(text, tokens, "eos")
        assert all("\ufffd" not in d for d in deltas) and "".join(deltas) == text
    *_, out = backend.stream(["Count: seven"], 3, Sampling())
    assert out.finish == "length" and out.new_tokens == 3 and "\ufffd" not in out.text
    outs = backend.generate([["Count: six"], ["Count: one"], ["Count: seven"]], [50, 50, 5],
                            Sampling())
    assert [(o.finish, o.new_tokens) for o in outs] == [("eos", 2), ("stop", 4), ("length", 5)]


# ---------------------------------------------------------------------------- the rest


def test_cancel_ends_a_turn_and_an_abandoned_stream_frees_the_model(qwen):
    backend = qwen.f16
    prompt = [backend.build_prompt("who wrote hamlet")]
    cancel = threading.Event()
    cancel.set()
    *_, out = backend.stream(prompt, 200, Sampling(), cancel)
    assert out.finish == "cancelled" and out.new_tokens == 0
    cancel = threading.Event()
    seen = []
    for item in backend.stream(prompt, 200, Sampling(), cancel):
        seen.append(item)
        if len(seen) == 3:
            cancel.set()
    assert seen[-1].finish == "cancelled" and seen[-1].new_tokens < 200
    stream = backend.stream(prompt, 200, Sampling())
    next(stream)
    stream.close()  # the consumer goes away mid-turn
    *_, out = backend.stream(prompt, 5, Sampling())
    assert out.finish == "length" and out.new_tokens == 5


def test_seeded_sampling_is_reproducible(qwen):
    backend = qwen.f16
    prompt = [backend.build_prompt("who wrote hamlet")]
    sampling = Sampling(greedy=False, temperature=1.0, top_p=0.9, seed=7)
    first = list(backend.stream(prompt, 24, sampling))[-1]
    assert list(backend.stream(prompt, 24, sampling))[-1] == first
    other = list(backend.stream(prompt, 24, Sampling(greedy=False, seed=8)))[-1]
    assert other.text != first.text
    rows = [prompt, [backend.build_prompt("東京")]]
    assert backend.generate(rows, [16, 16], sampling) == backend.generate(rows, [16, 16],
                                                                          sampling)


def test_next_turn_feeds_only_what_was_added(nano):
    backend, fresh = nano.llama, LlamaCppBackend(str(nano.gguf), reuse_cache=False)
    segments = [backend.build_prompt("who wrote hamlet")]
    first = list(backend.stream(segments, 40, Sampling()))[-1]
    assert first.finish == "stop"
    segments += [first.text, protocol.observation("Doc 1(Title: \"Hamlet\") A play.\n")]
    before = backend.timings["prompt_tokens"]
    second = list(backend.stream(segments, 12, Sampling()))[-1]
    fed = backend.timings["prompt_tokens"] - before
    added = backend.count_tokens(segments[-1])
    # The observation, and the turn's last token (generated, never fed back).
    assert added <= fed <= added + 2
    assert list(fresh.stream(segments, 12, Sampling()))[-1] == second
    # Batched: each question's next round reuses its own slot's cache.
    rows = [[backend.build_prompt(q)] for q in ("a", "b", "c")]
    outs = backend.generate(rows, [6] * 3, Sampling())
    rows = [r + [o.text, "\n\nmore\n\n"] for r, o in zip(rows, outs, strict=True)]
    before = backend.timings["prompt_tokens"]
    assert backend.generate(rows, [6] * 3, Sampling()) == fresh.generate(rows, [6] * 3,
                                                                         Sampling())
    assert backend.timings["prompt_tokens"] - before < 3 * 12


@pytest.mark.parametrize("which", ["qwen", "nano"])
def test_the_instruction_is_read_once_and_restored_into_each_new_slot(which, qwen, nano):
    # Qwen2.5's vocabulary spells the instruction in 139 tokens; the nano's in 5.
    path = qwen.f16.path if which == "qwen" else nano.gguf
    backend = LlamaCppBackend(str(path), slots=4)
    fresh = LlamaCppBackend(str(path), reuse_cache=False, slots=4)
    prefix = backend.instruction_prefix()
    questions = ("who wrote hamlet", "1984 author", "東京の人口", "'tis the season?")
    rows = [[backend.build_prompt(q)] for q in questions]
    ids = [backend.context_ids(r) for r in rows]
    # The instruction up to the question, in every prompt's ids, and nothing past it.
    assert len(prefix) > (100 if which == "qwen" else 2)
    assert all(i[:len(prefix)] == prefix for i in ids)
    assert backend.decode(prefix).rstrip().endswith("Question:")
    outs = backend.generate(rows, [8] * 4, Sampling())
    # Four new slots: the instruction fed once, then only each question's own tokens.
    assert backend.timings["prompt_tokens"] == len(prefix) + sum(len(i) - len(prefix)
                                                                  for i in ids)
    assert outs == fresh.generate(rows, [8] * 4, Sampling())
    # More slots: the context reopened, its caches gone, and a saved state fits only a
    # context of as many sequences: the instruction read once more, then restored.
    wider = [[backend.build_prompt(f"question number {n}")] for n in range(6)]
    backend.max_slots = 6
    before = backend.timings["prompt_tokens"]
    assert backend.generate(wider, [8] * 6, Sampling()) == fresh.generate(wider, [8] * 6,
                                                                             Sampling())
    fed = backend.timings["prompt_tokens"] - before
    assert fed == len(prefix) + sum(backend.count_tokens(r[0]) - len(prefix) for r in wider)
    # New weights: the saved instruction goes with the caches.
    backend.forget_cache()
    assert backend._prefix_state is None


def test_a_context_past_the_window_is_cut_from_the_left(qwen):
    backend = qwen.f16
    segments = [backend.build_prompt("who wrote hamlet"), " word" * 200]
    ids = backend.context_ids(segments)
    assert len(ids) > 100
    out = list(backend.stream(segments, 6, Sampling(), keep_last=100))[-1]
    # As if the last 100 ids were the whole context (Search-R1's rolling window).
    reference = greedy_ids_torch(qwen.hf, ids[-100:], 6)
    assert out.text == qwen.hf.decode(reference)


def test_batching_benchmark_as_in_the_readme_times_the_three_ways(tmp_path):
    """`python -m benchmarks.llamacpp batching` (the README's figures), on a small budget."""
    out = tmp_path / "batching.json"
    done = subprocess.run([sys.executable, "-m", "benchmarks.llamacpp", "batching", "--rows",
                           "2", "--tokens", "4", "--repeat", "1", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(out.read_text())
    assert figures.pop("cpu").startswith("CPU: ") and "llama.cpp" in figures.pop("llama_cpp")
    assert done.stdout.startswith("CPU: ")  # the figures name the CPU they came from
    assert set(figures) == {"nano", "qwen2.5 x0.125"}
    for ways in figures.values():
        assert list(ways) == ["one at a time", "one context, 2 sequences",
                              "2 one-thread contexts in threads"]
        assert all(way["seconds"] > 0 and way["tokens_per_s"] > 0 for way in ways.values())
    assert "one context, 2 sequences" in done.stdout and "x" in done.stdout


def test_knobs_benchmark_as_in_the_docs_times_the_backend_and_llama_cpp(nano, tmp_path):
    """`python -m benchmarks.llamacpp_knobs` (docs/hardware.md's figures), on nano files."""
    work = tmp_path / "work"
    for kind in ("q4_0", "q8_0"):
        convert(str(NANO), work / kind, kind)
    documents = protocol.observation(protocol.render_documents(
        ["\"Abbey Road\"\nThe album was recorded at EMI Studios in London in 1969."]))
    (work / "documents.json").write_text(json.dumps({"observations": [documents] * 2}))
    command = [sys.executable, "-m", "benchmarks.llamacpp_knobs", "--work", str(work),
               "--types", "q4_0,q8_0", "--ubatch", "512,64", "--flash", "on",
               "--kv", "f16,q8_0", "--repack", "off", "--prompt-tokens", "48",
               "--decode-tokens", "6"]
    done = subprocess.run(command + ["--json", str(tmp_path / "knobs.json")], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("CPU: ") and "fastest question: " in done.stdout
    report = json.loads((tmp_path / "knobs.json").read_text())
    # Each type at the base setting, then the ubatch and the KV cache type moved alone.
    assert [(r["type"], r["ubatch"], r["kv"]) for r in report["results"]] == [
        ("q4_0", 512, "f16"), ("q4_0", 64, "f16"), ("q4_0", 512, "q8_0"),
        ("q8_0", 512, "f16"), ("q8_0", 64, "f16"), ("q8_0", 512, "q8_0")]
    for r in report["results"]:
        assert r["prompt_tokens"] == 48 and r["decode_tokens"] == 6
        for way in ("backend", "llama_cpp"):
            assert r[way]["prompt_tps"] > 0 and r[way]["decode_tps"] > 0
    missing = subprocess.run(command[:5] + ["--types", "iq4_nl"], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "--prepare-only" in missing.stderr


def test_speed_benchmark_as_in_the_docs_prints_the_table_against_torch(tmp_path):
    """`python -m benchmarks.llamacpp speed` (docs/hardware.md's table) on a scaled config."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.llamacpp", "speed", "--work", str(tmp_path / "w"),
         "--scale", "0.0625", "--configs", "torch-fp32,llama-q4_k_m", "--prompt-tokens", "32",
         "--decode-tokens", "4", "--turn-tokens", "4", "--batching-rows", "0", "--json",
         str(tmp_path / "speed.json")], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("CPU: ")
    assert "x: against torch float32" in done.stdout
    report = json.loads((tmp_path / "speed.json").read_text())
    torch_fp32, q4 = report["results"]
    assert (torch_fp32["config"], q4["config"]) == ("torch-fp32", "llama-q4_k_m")
    assert q4["question"]["new_tokens"] == 3 * 4 and q4["prompt_tps"] > 0
    # (c) the instruction read once for four new questions, not four times.
    once, each = (q4["new_questions"][w]["tokens_read"]
                  for w in ("instruction once", "instruction per question"))
    prefix = LlamaCppBackend(str(tmp_path / "w" / "q4_k_m" / "model.gguf")).instruction_prefix()
    assert len(prefix) > 100 and each - once == 3 * len(prefix)
