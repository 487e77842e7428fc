"""The micro training run: real data through the CLI, a tiny Qwen2 trained from scratch.

Its loss falls, it resumes from its checkpoint (with resume, and only then), and afterwards
it writes well-formed actions (a parsable <search> or <answer>) more often than the same
model at initialisation.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agent import protocol
from agent.loop import AgentSettings, run_agent
from nano import checkpoint
from nano.sft import TrainConfig, encode_record, train

ROOT = Path(__file__).resolve().parent.parent
# Tiny and state-masked only (no document loss): what it must learn in a minute is the format.
MICRO = dict(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=192, batch_tokens=2048,
             steps=80, lr=1e-2, warmup=5, threads=1, save_every=40, log_every=10,
             doc_weight=0.0, first_turns=True, content_weight=1.0)


def _well_formed_first_turns(model_dir: Path, questions: list[str]) -> int:
    """How many first turns open as the protocol's do: a closed <think> then <search> (one
    turn each, greedy). A micro model cannot copy a long question into the query in 80
    steps (it has no induction head), so the whole action is not asked of it."""
    from agent.backends.hf import TransformersBackend

    backend = TransformersBackend(str(model_dir), device="cpu")
    # the closing round only; room for a search that copies a long question whole
    settings = AgentSettings(max_turns=0, max_new_tokens=120)
    count = 0
    for question in questions:
        finished = list(run_agent(question, backend, _NoDocs(), settings))[-1]
        turn = finished.response
        count += re.match(r"\s*<think>.*?</think>\s*<search>", turn, re.DOTALL) is not None
    return count


class _NoDocs:
    def search(self, queries, topk=3):
        return [[] for _ in queries]


@pytest.mark.slow
def test_micro_training(micro_data, tmp_path):
    records = [json.loads(x) for x in (micro_data / "train.jsonl").read_text().splitlines()]
    assert len(records) >= 200
    config = TrainConfig(data=micro_data / "train.jsonl", tokenizer=micro_data / "tokenizer",
                         out=tmp_path / "run", **MICRO)
    # The untrained model: same seed and shapes, zero steps.
    untrained = train(TrainConfig(**{**config.__dict__, "out": tmp_path / "init", "steps": 0}),
                      log=lambda *_: None)
    assert untrained["steps"] == 0
    half = train(TrainConfig(**{**config.__dict__, "steps": 40}), log=lambda *_: None)
    assert half["steps"] == 40
    with pytest.raises(ValueError, match="already holds a run.*pass --resume"):
        train(config, log=lambda *_: None)  # never mixed into silently
    lines: list[str] = []
    summary = train(TrainConfig(**{**config.__dict__, "resume": True}), log=lines.append)
    assert any("resuming" in line and "step 40" in line for line in lines)
    history = json.loads((tmp_path / "run" / "train_summary.json").read_text())
    assert history["steps"] == 80 == summary["steps"]
    assert summary["last_own_loss"] < 0.6 * summary["first_own_loss"]
    questions = [r["question"] for r in records[:12]]
    before = _well_formed_first_turns(tmp_path / "init", questions)
    after = _well_formed_first_turns(tmp_path / "run", questions)
    print(f"first turns opening a search: {before} of 12 before, {after} after")
    assert after > before, (before, after)


@pytest.mark.slow
def test_state_masking(micro_data):
    """Loss falls only on the model's own turns; the prompt and observations are masked."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(micro_data / "tokenizer"))
    record = json.loads((micro_data / "train.jsonl").read_text().splitlines()[0])
    ids, kinds = encode_record(record, tokenizer)
    own = tokenizer.decode([i for i, k in zip(ids, kinds, strict=True) if k in (1, 3)])
    mine = "".join(text for text, generated in record["segments"] if generated)
    assert own == mine + "<|im_end|>"
    content = tokenizer.decode([i for i, k in zip(ids, kinds, strict=True) if k == 3])
    actions = [protocol.parse_action(t).content for t, g in record["segments"] if g]
    assert content.split() == " ".join(actions).split()  # the queries and the answer
    inserted = tokenizer.decode([i for i, k in zip(ids, kinds, strict=True) if k == 2])
    assert "<information>" in inserted and "<think>" not in inserted


def test_copy_drills_repeat_a_window_with_loss_on_the_repeat_only():
    import random

    from nano.sft import INSERTED, PROMPT, copy_drills

    documents = [list(range(1000, 1200)), list(range(5)), list(range(2000, 2100))]
    drills = copy_drills(documents, 6, random.Random(0))
    assert len(drills) == 6
    for n, (ids, kinds) in enumerate(drills):
        size = len(ids) // 2
        assert 24 <= size <= 96 and ids[:size] == ids[size:]
        assert kinds == [PROMPT] * size + [INSERTED] * size
        source = next(d for d in documents if ids[0] in d)
        in_order = ids[:size] == source[source.index(ids[0]):source.index(ids[0]) + size]
        assert in_order == (n % 2 == 0)  # every other window is shuffled
    assert copy_drills([list(range(5))], 3, random.Random(0)) == []  # too short to drill


@pytest.mark.slow
def test_train_cli_as_in_the_readme(micro_data, tmp_path):
    """`python -m nano train --data … --tokenizer … --out …` with the flags the model card's
    attempts use (`assets/nano-agent/ATTEMPTS.md`: first turns, content weight, copy drills,
    an induction stage): it trains, saves a
    loadable model and counts the drills among its sequences."""
    from transformers import AutoModelForCausalLM

    out = tmp_path / "cli-run"
    tiny = ["--hidden", "32", "--layers", "1", "--heads", "2", "--kv-heads", "1",
            "--intermediate", "64", "--steps", "3", "--threads", "1", "--limit", "40",
            "--save-every", "2", "--log-every", "1"]
    command = [sys.executable, "-m", "nano", "train", "--data", str(micro_data / "train.jsonl"),
               "--tokenizer", str(micro_data / "tokenizer"), "--out", str(out), *tiny,
               "--first-turns", "--content-weight", "5"]
    plain = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert plain.returncode == 0, plain.stderr[-2000:]
    drilled = subprocess.run([*command[:-1], "5", "--out", str(tmp_path / "drills"),
                              "--copy-drills", "25", "--induction-steps", "2"],
                             cwd=ROOT, capture_output=True, text=True)
    assert drilled.returncode == 0, drilled.stderr[-2000:]
    assert "done: 3 steps" in plain.stdout
    counts = [json.loads((d / "train_summary.json").read_text())["sequences"]
              for d in (out, tmp_path / "drills")]
    assert counts[1] == counts[0] + 25  # 40 runs + their first turns, then 25 drills
    model = AutoModelForCausalLM.from_pretrained(str(out))
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 1


def test_induction_batches_copy_spans_from_random_places():
    """An induction batch: random text, then spans copied out of it from random places, each
    given its first token with the loss on the rest; the distances differ, so no head that
    looks a fixed number of tokens back can solve it."""
    import random

    from nano.sft import INSERTED, PROMPT, induction_examples

    held = induction_examples(random.Random(12345), low=3, high=4000)
    for ids, kinds in held:
        context = kinds.index(INSERTED) - 1  # the random text, then the first span's first token
        text, probes = ids[:context], ids[context:]
        assert kinds[:context] == [PROMPT] * context and len(probes) > 4
        starts = [n for n, kind in enumerate(kinds[context:]) if kind == PROMPT]
        assert len(starts) == 3  # three spans, each given its first token, loss on the rest
        for start, end in zip(starts, starts[1:] + [len(probes)], strict=True):
            span = probes[start:end]
            assert any(text[i:i + len(span)] == span for i in range(len(text)))
    assert len({len(ids) for ids, _ in held}) > 1


@pytest.mark.slow
def test_a_fixed_distance_copier_does_not_solve_the_induction_batches(micro_data):
    """Why the spans come from random places: a model trained on one window repeated at a
    fixed distance learns to copy it, and that skill is worth nothing on spans copied from
    random places (at chance or worse)."""
    import math
    import random

    import torch
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    from nano.sft import INSERTED, PROMPT, batch_loss, induction_examples, model_config

    def fixed_window(rng: random.Random) -> list[tuple[list[int], list[int]]]:
        rows = []
        for _ in range(32):
            window = [rng.randrange(3, 4000) for _ in range(40)]
            rows.append((window[:8] + window[8:] + window[8:], [PROMPT] * 40 + [INSERTED] * 32))
        return rows

    torch.manual_seed(0)
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(str(micro_data / "tokenizer"))
    config = TrainConfig(data=micro_data / "train.jsonl", tokenizer=micro_data / "tokenizer",
                         out=micro_data, **MICRO)
    model = Qwen2ForCausalLM(model_config(config, tokenizer))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.98))
    for step in range(150):
        rows = fixed_window(random.Random(step))
        loss = batch_loss(model, rows, range(len(rows)), 1.0)[0]
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    model.eval()
    repeats, spans = fixed_window(random.Random(10_000)), induction_examples(
        random.Random(10_000), low=3, high=4000)
    with torch.no_grad():
        learnt = batch_loss(model, repeats, range(len(repeats)), 1.0)[2]
        transfer = batch_loss(model, spans, range(len(spans)), 1.0)[2]
    chance = math.log(3997)
    # measured: 2.4 on unseen fixed-distance repeats (8.3 at the start), 17.8 on the spans
    assert learnt < 0.5 * chance and transfer > 0.9 * chance, (learnt, transfer)


@pytest.mark.slow
def test_induction_batches_recur_after_the_stage(micro_data, tmp_path):
    """With induction_every, every n-th step after the stage is an induction batch again (no
    own-token loss: the trajectories' steps have one)."""

    config = TrainConfig(data=micro_data / "train.jsonl", tokenizer=micro_data / "tokenizer",
                         out=tmp_path / "recur", **{**MICRO, "steps": 7, "save_every": 7,
                                                    "induction_steps": 2, "induction_every": 3})
    train(config, log=lambda *_: None)
    history = checkpoint.load_state(tmp_path / "recur" / "checkpoint")["history"]
    induction = [step for step, own, _ in history if own == 0]
    assert induction == [1, 2, 4, 7]  # steps 0, 1 (the stage), then 3 and 6 (every 3rd)


@pytest.mark.slow
def test_init_fine_tunes_saved_weights_and_rejects_another_vocabulary(micro_data, tmp_path):
    """--init starts from a saved model (zero steps keep its weights exactly); a model with
    another vocabulary is refused with a message that says what to give instead."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    base = dict(data=micro_data / "train.jsonl", tokenizer=micro_data / "tokenizer",
                **{**MICRO, "steps": 0})
    train(TrainConfig(out=tmp_path / "a", **base), log=lambda *_: None)
    lines: list[str] = []
    train(TrainConfig(out=tmp_path / "b", init=tmp_path / "a", **base), log=lines.append)
    assert any("starting from the weights" in line for line in lines)
    a, b = (Qwen2ForCausalLM.from_pretrained(str(tmp_path / d)) for d in ("a", "b"))
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(),
                                                  b.state_dict().values(), strict=True))
    Qwen2ForCausalLM(Qwen2Config(vocab_size=50, hidden_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1,
                                 intermediate_size=64)).save_pretrained(str(tmp_path / "other"))
    with pytest.raises(ValueError, match="vocabulary of 50.*give the tokenizer"):
        train(TrainConfig(out=tmp_path / "c", init=tmp_path / "other", **base),
              log=lambda *_: None)


def test_swap_answer_replaces_the_answer_after_the_prompt_only():
    from nano.sft import swap_answer

    record = {"answers": ["Rome"], "family": "span", "segments": [
        ["<|im_start|>user\nQuestion: where is the Colosseum?\n<|im_end|>\n", False],
        ["<think> I need to search for this. </think>\n<search> Colosseum </search>", True],
        ['\n\n<information>Doc 1(Title: "Colosseum") The Colosseum is in Rome, not in '
         "Romeo's Verona.\n</information>\n\n", False],
        ["<think> The answer is in Doc 1. </think>\n<answer> Rome </answer>", True]]}
    swapped = swap_answer(record, "Ouagadougou")
    assert swapped["answers"] == ["Ouagadougou"] and record["answers"] == ["Rome"]
    assert "is in Ouagadougou, not in Romeo's" in swapped["segments"][2][0]  # whole words only
    assert protocol.parse_action(swapped["segments"][3][0]).content == "Ouagadougou"
    assert swapped["segments"][0] == record["segments"][0]
    assert [g for _, g in swapped["segments"]] == [g for _, g in record["segments"]]
    named = {**record, "segments": [["Question: is Rome in Italy?", False],
                                    *record["segments"][1:]]}
    assert swap_answer(named, "Paris") is None  # the question names it: no clean swap
    unread = {**record, "answers": ["Milan"]}
    assert swap_answer(unread, "Paris") is None  # no document holds it


@pytest.mark.slow
def test_a_run_killed_mid_rotation_resumes_from_its_newest_whole_checkpoint(micro_data,
                                                                             tmp_path):
    """The two states a kill during a save can leave: between the two renames (only
    checkpoint.old is there) and while checkpoint.old is being removed (half of it beside
    the new checkpoint). With resume, the run goes on from the newest whole checkpoint and
    saves again without tripping over the leftover."""
    import shutil

    base = TrainConfig(data=micro_data / "train.jsonl", tokenizer=micro_data / "tokenizer",
                       out=tmp_path / "run", **{**MICRO, "steps": 4, "save_every": 2,
                                                 "log_every": 100, "limit": 40})
    train(base, log=lambda *_: None)
    saved = tmp_path / "run" / "checkpoint"
    old = tmp_path / "run" / "checkpoint.old"
    saved.rename(old)  # killed between the renames
    lines: list[str] = []
    train(TrainConfig(**{**base.__dict__, "steps": 6, "resume": True}), log=lines.append)
    assert any("resuming" in line and "step 4" in line for line in lines), lines
    shutil.copytree(saved, old)
    (old / "model.safetensors").unlink()  # killed while removing checkpoint.old
    lines.clear()
    summary = train(TrainConfig(**{**base.__dict__, "steps": 8, "resume": True}),
                    log=lines.append)
    assert any("resuming" in line and "step 6" in line for line in lines), lines
    assert summary["steps"] == 8 and checkpoint.load_state(saved)["step"] == 8
    assert sorted(p.name for p in (tmp_path / "run").iterdir() if "checkpoint" in p.name) == [
        "checkpoint"]


class _RunsCode:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        import os

        return os.mkdir, (str(self.marker),)


@pytest.mark.slow
def test_resume_refuses_a_state_file_that_would_run_code(micro_data, tmp_path, capsys):
    import torch

    from nano.__main__ import main

    saved = tmp_path / "run" / "checkpoint"
    saved.mkdir(parents=True)
    marker = tmp_path / "code-ran"
    torch.save({"step": 1, "payload": _RunsCode(marker)}, saved / "state.pt")
    argv = ["train", "--data", str(micro_data / "train.jsonl"), "--tokenizer",
            str(micro_data / "tokenizer"), "--out", str(tmp_path / "run"), "--resume",
            "--threads", "1"]
    assert main(argv) == 2
    assert "loading it would run code" in capsys.readouterr().err
    assert not marker.exists()


def test_device_flag_is_checked_before_any_work(micro_data, tmp_path):
    """`--device` takes cpu, cuda or cuda:N; a GPU the machine lacks is refused with the
    fix, and nothing is written. (On CPU the default trains as every test here does.)"""
    import torch

    base = dict(data=micro_data / "train.jsonl", tokenizer=micro_data / "tokenizer",
                out=tmp_path / "gpu-run", **MICRO)
    with pytest.raises(ValueError, match="pass cpu, cuda or cuda:N"):
        TrainConfig(**base, device="gpu")
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU; the refusal is for machines without one")
    with pytest.raises(ValueError, match="torch sees no CUDA GPU.*--device cpu"):
        train(TrainConfig(**base, device="cuda"))
    # as a user types it: exit 2, the fix on stderr, nothing written
    typed = subprocess.run([sys.executable, "-m", "nano", "train", "--data",
                            str(micro_data / "train.jsonl"), "--tokenizer",
                            str(micro_data / "tokenizer"), "--out", str(tmp_path / "gpu-run"),
                            "--device", "cuda"], cwd=ROOT, capture_output=True, text=True)
    assert typed.returncode == 2 and "--device cpu" in typed.stderr, typed.stderr[-2000:]
    assert not (tmp_path / "gpu-run").exists()
