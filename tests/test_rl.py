"""The RL trainer on tiny Qwen2 models the tests build: rollouts through the real agent loop
and the real in-process retriever, token masks, log-probs, the update step against a
hand-computed one, logs the curves reader takes in, and a 3-step run through the CLI (then
resumed)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from agent.events import Segment
from agent.loop import AgentSettings
from evaluator.benchmarks import DataError
from nano.rl import batched_log_probs, read_questions, response_log_probs
from nano.rollout import TimedRetriever, encode, rollout
from tests.conftest import ROOT

QUESTIONS = [
    {"question": "who directed 2001 a space odyssey", "golden_answers": ["American"]},
    {"question": "what is the capital of france", "golden_answers": ["Paris"]},
    {"question": "who wrote hamlet", "golden_answers": ["Shakespeare", "American"]},
]


@pytest.fixture(scope="module")
def questions_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("rl-data") / "train.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return path


@pytest.fixture(scope="module")
def scripted_backend(tiny_models):
    from agent.backends.hf import TransformersBackend

    return TransformersBackend(str(tiny_models["scripted"]), device="cpu")


# Observations uncut, so the scripted model sees the blank line that makes it answer.
SETTINGS = AgentSettings(max_turns=3, max_new_tokens=16, max_obs_tokens=4000, greedy=False,
                         top_p=0.95)


@pytest.mark.slow
def test_rollout_masks_only_what_the_model_generated(scripted_backend, local_retriever,
                                                     questions_file):
    retriever = TimedRetriever(local_retriever)
    samples = rollout(scripted_backend, retriever, read_questions(questions_file)[:2], 2,
                      SETTINGS)
    assert [s.group for s in samples] == [0, 0, 1, 1]
    assert retriever.seconds > 0
    tokenizer = scripted_backend.tokenizer
    for sample in samples:
        assert len(sample.mask) == len(sample.response_ids) == len(sample.answer_span)
        generated = [t for t, m in zip(sample.response_ids, sample.mask, strict=True) if m]
        inserted = [t for t, m in zip(sample.response_ids, sample.mask, strict=True) if not m]
        # The scripted model searches, reads an observation, then answers.
        assert sample.searches == 1 and sample.prediction == "American"
        assert "<information>" in tokenizer.decode(inserted)
        assert "<information>" not in tokenizer.decode(generated)
        assert tokenizer.decode(generated).endswith("<answer> American</answer>")
        span = [t for t, a in zip(sample.response_ids, sample.answer_span, strict=True) if a]
        assert tokenizer.decode(span) == "<answer> American</answer>"
    assert [s.reward for s in samples] == [1.0, 1.0, 0.0, 0.0]


@pytest.mark.slow
def test_encode_follows_the_segments(scripted_backend):
    from agent.events import Finished

    segments = (Segment("PROMPT\n", False), Segment("<search> war</search>", True),
                Segment("\n\n<information>Doc 1(Title: x) <answer> y</answer></information>"
                        "\n\n", False), Segment("<answer> z</answer>", True))
    finished = Finished("answer", 2, 1, 9, 0.1, "".join(s.text for s in segments),
                        segments[0].text, "z", segments=segments)
    sample = encode(scripted_backend, finished, group=3, reward=1.0)
    ids = [scripted_backend.context_ids([s.text]) for s in segments]
    assert sample.prompt_ids == ids[0]
    assert sample.response_ids == ids[1] + ids[2] + ids[3]
    assert sample.mask == [1] * len(ids[1]) + [0] * len(ids[2]) + [1] * len(ids[3])
    assert sample.answer_span == [0] * (len(ids[1]) + len(ids[2])) + [1] * len(ids[3])


@pytest.mark.slow
def test_batched_log_probs_equal_one_by_one_full_forward(tiny_models, local_retriever,
                                                         questions_file):
    from agent.backends.hf import TransformersBackend

    backend = TransformersBackend(str(tiny_models["random"]), device="cpu")
    short = AgentSettings(max_turns=1, max_new_tokens=8, greedy=False)
    samples = rollout(backend, TimedRetriever(local_retriever),
                      read_questions(questions_file), 2, short)
    batched = batched_log_probs(backend.model, samples, micro_batch=6)
    with torch.no_grad():
        for sample, got in zip(samples, batched, strict=True):
            ids = torch.tensor([sample.prompt_ids + sample.response_ids])
            logits = backend.model(input_ids=ids).logits[0, len(sample.prompt_ids) - 1:-1]
            want = torch.log_softmax(logits, -1).gather(
                -1, torch.tensor(sample.response_ids)[:, None]).squeeze(-1)
            mask = torch.tensor(sample.mask, dtype=torch.bool)
            assert torch.allclose(got[mask], want[mask], atol=1e-4)
            assert torch.all(got[~mask] == 0)
    log_prob, entropy, mask, _ = response_log_probs(backend.model, samples[:2],
                                                  with_entropy=True)
    assert torch.all(entropy[mask.bool()] > 0) and torch.all(entropy[~mask.bool()] == 0)


def test_bad_question_file_says_what_is_wrong(tmp_path):
    with pytest.raises(DataError, match="No file for 'missing'"):
        read_questions(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "golden_answers": ["a"]}\n{"query": "x"}\n')
    with pytest.raises(DataError, match="bad.jsonl:2: no 'question' field"):
        read_questions(bad)
    unanswerable = tmp_path / "unanswerable.jsonl"
    unanswerable.write_text('{"id": "u1", "question": "q"}\n')
    with pytest.raises(DataError, match="no golden answers.*'u1'"):
        read_questions(unanswerable)


def _run_cli(args):
    return subprocess.run([sys.executable, "-m", "nano", "rl", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def micro_run(tiny_models, questions_file, tmp_path_factory, local_retriever):
    out = tmp_path_factory.mktemp("rl-run") / "llds-a"
    args = ["--method", "llds-a", "--lambda", "0.2", "--model", str(tiny_models["scripted"]),
            "--train-data", str(questions_file), "--val-data", str(questions_file),
            "--val-name", "toy", "--val-limit", "2", "--steps", "3", "--batch-questions", "2",
            "--group-size", "2", "--max-new-tokens", "16", "--max-obs-tokens", "4000",
            "--val-every", "2",
            "--save-every", "1", "--out", str(out), "--lr", "1e-4"]
    done = _run_cli(args)
    assert done.returncode == 0, done.stderr[-3000:]
    return out, args


@pytest.mark.slow
def test_three_step_cli_run_writes_logs_checkpoint_and_model(micro_run):
    out, _ = micro_run
    lines = (out / "train.log").read_text().splitlines()
    assert [line.split(" - ")[0] for line in lines] == ["step:0", "step:1", "step:2", "step:3"]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    step = records[1]
    for key in ("actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/kl_loss",
                "actor/entropy_loss", "actor/grad_norm", "actor/pos_avg_old_log_prob",
                "actor/neg_avg_old_log_prob", "actor/pos_avg_ref_log_prob",
                "actor/neg_avg_ref_log_prob", "actor/loss_noreduce",
                "actor/loss_noreduce_coef", "actor/mean_reduce_chunk",
                "actor/lowest_prob_avg_mean", "actor/lowest_prob_avg_min",
                "actor/answer_weight", "critic/score/mean", "critic/rewards/mean",
                "response_length/mean", "env/number_of_valid_search", "timing_s/rollout",
                "timing_s/retrieval", "timing_s/log_prob", "timing_s/update"):
        assert key in step, key
    assert step["actor/loss_noreduce_coef"] == 0.2
    assert step["env/number_of_valid_search"] == 1.0
    assert "val/test_score/toy" in records[0] and "val/test_score/toy" in records[2]
    assert "step:1 - actor/pg_loss:" in lines[1]
    value = lines[1].split(" - ")[1].split(":")[-1]
    assert len(value.split(".")[1]) == 3  # verl's console rounding
    assert (out / "model" / "config.json").is_file()
    assert (out / "checkpoint" / "state.pt").is_file()
    assert "--method llds-a" in (out / "command.txt").read_text()


@pytest.mark.slow
def test_logs_parse_through_the_curves_reader_into_one_run(micro_run):
    from curves.parse import read_log
    from curves.runs import resolve_metrics

    out, _ = micro_run
    for name in ("train.log", "metrics.jsonl"):
        parsed = read_log(out / name)
        assert parsed.bad_lines == 0 and len(parsed.runs) == 1
        run = parsed.runs[0]
        assert run.method == "LLDS"
        assert list(run.table.index) == [0, 1, 2, 3]
        for key in ("actor/pos_avg_old_log_prob", "critic/score/mean", "actor/grad_norm",
                    "actor/entropy_loss", "actor/loss_noreduce", "val/test_score/toy"):
            assert run.table[key].notna().any(), (name, key)
        found = resolve_metrics(run.table.columns)
        for series in ("lik_pos", "lik_neg", "lik_pos_ref", "lik_neg_ref", "reward",
                       "grad_norm", "entropy", "kl", "ppo_kl", "llds_penalty", "valid_search",
                       "response_length", "val:toy"):
            assert series in found, (name, series)


@pytest.mark.slow
def test_an_existing_run_is_refused_without_resume_and_continued_with_it(micro_run):
    out, args = micro_run
    refused = _run_cli(args)
    assert refused.returncode == 2 and "pass --resume" in refused.stderr
    steps = args[args.index("--steps") + 1]
    more = [*args, "--resume"]
    more[more.index("--steps") + 1] = str(int(steps) + 1)
    done = _run_cli(more)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4]


@pytest.mark.slow
def test_cli_refuses_missing_inputs_with_the_way_out():
    done = _run_cli(["--method", "grpo"])
    assert done.returncode == 2 and "--model is required" in done.stderr


@pytest.mark.slow
def test_forget_cache_after_an_update_gives_what_the_updated_model_computes(tiny_models):
    """Rollouts after a training update must not reuse keys and values of the old weights."""
    from agent.backends.base import Sampling
    from agent.backends.hf import TransformersBackend

    def perturb(model):
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.5 * torch.randn(p.shape, generator=gen))

    greedy = Sampling(greedy=True)
    prompt = "<|im_start|>user\nwho wrote hamlet<|im_end|>\n<|im_start|>assistant\n"
    contexts = [[prompt], [prompt + "the "]]
    stale, forgot, fresh = (TransformersBackend(str(tiny_models["random"]), device="cpu")
                            for _ in range(3))
    for backend in (stale, forgot):
        first = backend.generate(contexts, [6, 6], greedy)  # fills the batch cache
        perturb(backend.model)
    forgot.forget_cache()
    perturb(fresh.model)
    follow = [c + [t.text, "\n\n<information>Paris</information>\n\n"]
              for c, t in zip(contexts, first, strict=True)]
    want = [t.text for t in fresh.generate(follow, [6, 6], greedy)]
    assert [t.text for t in forgot.generate(follow, [6, 6], greedy)] == want
    # The control: kept, the old keys and values do change what is generated.
    assert [t.text for t in stale.generate(follow, [6, 6], greedy)] != want


# ------------------------------------------------------------------ the update, by hand

def _tiny_model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=24, hidden_size=16, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, intermediate_size=32,
                         max_position_embeddings=64)
    return Qwen2ForCausalLM(config).float()


def _sample(group: int, prompt: list[int], response: list[int], mask: list[int]):
    from nano.rollout import Sample

    return Sample(group, 0.0, prompt, response, mask, [0] * len(response), 0, None)


# Different prompt and response lengths (so padding differs per micro-batch), observations
# (mask 0) inside responses, and different counts of generated tokens.
SAMPLES = [([1, 2, 3], [4, 5, 6, 7], [1, 1, 0, 1]),
           ([1, 8], [9, 10, 11], [1, 1, 1]),
           ([1, 2, 12, 13], [14, 15], [1, 1]),
           ([1], [16, 17, 18, 19, 20], [1, 0, 0, 1, 1])]
ADVANTAGES = [1.0, -0.5, 0.3, -1.2]


def _own_log_probs(model, prompt: list[int], response: list[int]) -> torch.Tensor:
    """Log-probs of the response tokens from one unpadded forward pass."""
    ids = torch.tensor([prompt + response])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1]
    return torch.log_softmax(logits.float(), -1).gather(
        -1, torch.tensor(response)[:, None]).squeeze(-1)


def test_update_accumulates_micro_batches_into_one_step_as_computed_by_hand():
    """Two micro-batches of two: each micro-batch's loss divided by 2, gradients added, one
    optimizer step per mini-batch. At the start the ratio is 1 and the KL 0, so the loss of a
    micro-batch is -sum(A_i * logp_it over generated t) / (its generated tokens)."""
    import copy

    from nano.rl import RLConfig, update

    model = _tiny_model()
    by_hand = copy.deepcopy(model)
    samples = [_sample(i, *s) for i, s in enumerate(SAMPLES)]
    advantages = torch.tensor(ADVANTAGES)
    old = batched_log_probs(model, samples, micro_batch=4)
    config = RLConfig(mini_batches=1, micro_batch=2, grad_clip=1e9, kl_coef=0.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    metrics = update(model, optimizer, samples, old, old, advantages, config, config.loss())

    total, pg_losses = 0.0, []
    for micro in ([0, 1], [2, 3]):
        tokens = sum(sum(SAMPLES[i][2]) for i in micro)
        loss = -sum(ADVANTAGES[i] * (_own_log_probs(by_hand, *SAMPLES[i][:2])
                                     * torch.tensor(SAMPLES[i][2], dtype=torch.float)).sum()
                    for i in micro) / tokens
        pg_losses.append(-sum(ADVANTAGES[i] * sum(SAMPLES[i][2]) for i in micro) / tokens)
        total = total + loss / 2
    total.backward()
    moved = 0.0
    for (name, got), start in zip(model.named_parameters(), by_hand.parameters(), strict=True):
        want = start - 0.5 * (start.grad if start.grad is not None else 0)
        assert torch.allclose(got, want, atol=1e-6), name
        moved += float((got - start).abs().sum().detach())
    assert moved > 0  # the step did change the weights
    assert metrics["actor/pg_loss"] == pytest.approx(sum(pg_losses) / 2, abs=1e-6)


def test_micro_batches_of_equal_token_counts_match_one_full_batch_step():
    """Same generated-token count in each micro-batch: accumulating two halves is the same
    step as the whole mini-batch in one pass (padding and order change nothing)."""
    import copy

    from nano.rl import RLConfig, update

    equal = [([1, 2, 3], [4, 5, 6], [1, 1, 1]), ([1], [9, 10, 11, 7], [1, 0, 1, 1]),
             ([1, 2], [14, 15, 3], [1, 1, 1]), ([1, 5, 6, 7], [16, 17, 18], [1, 1, 1])]
    samples = [_sample(i, *s) for i, s in enumerate(equal)]
    advantages = torch.tensor(ADVANTAGES)
    results = []
    for micro_batch in (2, 4):
        model = _tiny_model()
        old = batched_log_probs(model, samples, micro_batch=4)
        config = RLConfig(mini_batches=1, micro_batch=micro_batch, kl_coef=0.0, grad_clip=1e9)
        update(model, torch.optim.SGD(model.parameters(), lr=0.5), samples, old, old,
               advantages, config, config.loss())
        results.append(copy.deepcopy(list(model.parameters())))
    for halves, whole in zip(*results, strict=True):
        assert torch.allclose(halves, whole, atol=1e-6)


def test_a_dropped_response_takes_its_advantage_with_it():
    """A response with no generated token is dropped, and every other sample keeps its own
    advantage (not its neighbour's)."""
    from nano.rl import trainable

    samples = [_sample(0, [1], [2, 3], [1, 1]), _sample(0, [1], [4, 5], [0, 0]),
               _sample(1, [1], [6], [1]), _sample(1, [1], [7, 8], [0, 1])]
    advantages = torch.tensor([0.7, -0.7, 1.5, -1.5])
    kept, kept_advantages = trainable(samples, advantages)
    assert kept == [samples[0], samples[2], samples[3]]
    assert kept_advantages.tolist() == pytest.approx([0.7, 1.5, -1.5])
    nothing, none = trainable(samples[1:2], advantages[1:2])
    assert nothing == [] and none.numel() == 0


# ------------------------------------------------------------------ displacement, anchors, gate

@pytest.fixture(scope="module")
def coin_model(tiny_models, tmp_path_factory):
    """The scripted model with a coin at the answer: after `<answer>` it writes " American"
    or " first" with equal logits (then `</answer>`), so groups of the same question
    disagree and advantages of both signs occur. A test double of a policy that is right
    some of the time; the scripted model itself is tested above."""
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    from agent.testing import single_token

    tokenizer = AutoTokenizer.from_pretrained(tiny_models["scripted"])
    model = Qwen2ForCausalLM.from_pretrained(tiny_models["scripted"])
    answer, right = tokenizer.convert_tokens_to_ids("<answer>"), single_token(tokenizer,
                                                                               " American")
    wrong, close = single_token(tokenizer, " first"), tokenizer.convert_tokens_to_ids(
        "</answer>")
    embed, head = model.model.embed_tokens.weight, model.lm_head.weight
    with torch.no_grad():
        head[wrong] = head[right]  # the same logit as " American" after every token
        head[close] += 50 * embed[wrong] / embed[wrong].norm()
    out = tmp_path_factory.mktemp("coin")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    assert answer != close
    return out


def _coin_config(model, questions_file, out, **change):
    from nano.rl import RLConfig

    settings = dict(method="llds-a", llds_lambda=0.2, gate="tolerance", model=str(model),
                    train_data=str(questions_file), steps=3, batch_questions=3, group_size=2,
                    max_new_tokens=16, max_obs_tokens=4000, lr=1e-3, anchor_size=3,
                    anchor_every=2, save_every=1, out=str(out))
    return RLConfig(**{**settings, **change})


@pytest.fixture
def same_retriever(monkeypatch, local_retriever):
    """The trainer opens the in-process retriever the tests share (the same engine and
    corpus it would open itself), instead of loading its index again."""
    import retriever.client

    monkeypatch.setattr(retriever.client, "LocalRetriever", lambda **_: local_retriever)


@pytest.mark.slow
def test_a_run_logs_displacement_per_class_anchor_logp_and_resumes_with_its_anchor_set(
        coin_model, questions_file, tmp_path, same_retriever):
    import math

    from nano import anchors
    from nano.rl import train

    out = tmp_path / "run"
    train(_coin_config(coin_model, questions_file, out), "test")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert all(math.isfinite(v) for r in records for v in r.values()
               if isinstance(v, float))
    steps = records[1:]
    for step in steps:
        for key in ("displacement/ref_log_ratio", "displacement/n_pos",
                    "displacement/n_zero", "displacement/n_neg", "actor/pos_avg_old_log_prob",
                    "actor/neg_avg_old_log_prob"):
            assert key in step, key
        counts = [step[f"displacement/n_{c}"] for c in ("pos", "zero", "neg")]
        assert sum(counts) == 6  # every response of the step, not one micro-batch
        for name, count in zip(("pos", "zero", "neg"), counts, strict=True):
            assert (f"displacement/{name}_logp" in step) == (count > 0)
            if count:
                assert step[f"displacement/{name}_logp"] < 0
    for name in ("pos", "zero", "neg"):  # the coin gives every class in some step
        assert any(f"displacement/{name}_logp" in step for step in steps), name
    assert all(step["actor/loss_noreduce_coef"] == 0.2 for step in steps)

    # The anchor set: correct trajectories of the starting model, measured at steps 0, 2, 3.
    saved = anchors.read(out / anchors.FILE)
    assert len(saved) == 3 and all(s.prediction == "American" for s in saved)
    measured = [r["step"] for r in records if "anchor/logp" in r]
    assert measured == [0, 2, 3] and records[0]["anchor/n"] == 3
    with torch.no_grad():
        start = torch.cat([_own_log_probs(_start_model(coin_model), s.prompt_ids,
                                          s.response_ids)[torch.tensor(s.mask, dtype=torch.bool)]
                           for s in saved])
    assert records[0]["anchor/logp"] == pytest.approx(float(start.mean()), abs=1e-4)
    assert records[3]["anchor/logp"] != records[0]["anchor/logp"]  # the policy moved

    # A resume reads the run's own set (here cut to one trajectory), never draws a new one.
    lines = (out / anchors.FILE).read_text().splitlines()
    (out / anchors.FILE).write_text(lines[0] + "\n")
    train(_coin_config(coin_model, questions_file, out, steps=4, resume=True), "test")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4]
    assert records[4]["anchor/n"] == 1
    assert (out / anchors.FILE).read_text() == lines[0] + "\n"


def _start_model(path):
    from transformers import Qwen2ForCausalLM

    return Qwen2ForCausalLM.from_pretrained(path).float().eval()


@pytest.mark.slow
def test_drawing_the_anchor_set_leaves_the_training_random_state_alone(
        coin_model, questions_file, local_retriever):
    """So a run samples the same batches with or without an anchor set."""
    import random

    from agent.backends.hf import TransformersBackend
    from nano import anchors

    backend = TransformersBackend(str(coin_model), device="cpu")
    torch.manual_seed(7)
    random.seed(7)
    torch_state, python_state = torch.get_rng_state(), random.getstate()
    first = anchors.draw(backend, TimedRetriever(local_retriever),
                         read_questions(questions_file), 2, SETTINGS)
    assert torch.equal(torch.get_rng_state(), torch_state)
    assert random.getstate() == python_state
    again = anchors.draw(backend, TimedRetriever(local_retriever),
                         read_questions(questions_file), 2, SETTINGS)
    # Fixed: the same draw every time, only correct answers, at most the size asked for.
    assert [s.response_ids for _, s in first] == [s.response_ids for _, s in again]
    assert len(first) == 2 and all(s.reward == 1 for _, s in first)


def test_gate_options_are_checked_and_name_the_run(tmp_path):
    from curves.runs import guess_method
    from nano.rl import RLConfig

    with pytest.raises(ValueError, match="--method grpo does not have"):
        RLConfig(method="grpo", gate="positive")
    with pytest.raises(ValueError, match="--gate-tolerance is -1"):
        RLConfig(method="llds-a", gate="tolerance", gate_tolerance=-1)
    config = RLConfig(method="llds-a", gate="tolerance", gate_tolerance=1e-3)
    assert (config.loss().gate, config.loss().gate_tolerance, config.loss().unit) == (
        "tolerance", 1e-3, "action")
    assert config.name == "nano-llds-a-gate-tolerance-lambda0.2-lr1e-05-seed0"
    assert guess_method(config.name)[0] == "LLDS"
    assert RLConfig(method="llds-a").name == "nano-llds-a-lambda0.2-lr1e-05-seed0"
    assert RLConfig(method="grpo").loss().llds_lambda == 0.0


def _rl_inputs(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    data = tmp_path / "train.jsonl"
    data.write_text('{"question": "q", "golden_answers": ["a"]}\n')
    return model, data


def _anchor_line(**change) -> str:
    record = {"id": "q0", "question": "q", "golden_answers": ["a"], "prompt_ids": [1, 2],
              "response_ids": [3, 4, 5], "mask": [1, 0, 1], "answer_span": [0, 0, 1]}
    return json.dumps({**record, **change}) + "\n"


def test_an_anchor_file_is_checked_before_any_work(tmp_path):
    from nano.anchors import AnchorError, read
    from nano.rl import RLConfig, check_paths

    model, data = _rl_inputs(tmp_path)
    good, bad, out = tmp_path / "good.jsonl", tmp_path / "bad.jsonl", tmp_path / "out"
    good.write_text(_anchor_line())
    bad.write_text(_anchor_line() + _anchor_line(mask=[1, 0]))
    config = dict(method="llds-a", model=str(model), train_data=str(data), out=str(out))
    check_paths(RLConfig(**config, anchors=str(good)))
    assert [s.mask for s in read(good)] == [[1, 0, 1]]
    with pytest.raises(AnchorError, match="bad.jsonl:2: not an anchor record"):
        check_paths(RLConfig(**config, anchors=str(bad)))
    with pytest.raises(AnchorError, match="no such file|cannot read"):
        check_paths(RLConfig(**config, anchors=str(tmp_path / "missing.jsonl")))
    with pytest.raises(ValueError, match="--anchor-size 0"):
        check_paths(RLConfig(**config, anchors=str(good), anchor_size=0))
    # A run keeps its own set: another file is refused, the same one accepted.
    out.mkdir()
    (out / "anchors.jsonl").write_text(_anchor_line(id="other"))
    with pytest.raises(ValueError, match="a run keeps its own set"):
        check_paths(RLConfig(**config, anchors=str(good)))
    (out / "anchors.jsonl").write_text(good.read_text())
    check_paths(RLConfig(**config, anchors=str(good)))
    assert not (out / "command.txt").exists()


def test_an_anchor_set_of_another_tokenizer_is_refused():
    from nano.anchors import AnchorError, check_tokens
    from nano.rollout import Sample

    samples = [Sample(0, 1.0, [1, 2], [3, 900], [1, 1], [0, 0], 1, "a")]
    check_tokens(samples, 901, "set.jsonl")
    with pytest.raises(AnchorError, match="token id 900 is outside the model's vocabulary"):
        check_tokens(samples, 900, "set.jsonl")


def test_warmup_in_steps_keeps_the_schedule_when_the_run_is_longer():
    # The collapse-regime runs (80 steps) keep the 50-step sweep's 14 warm-up steps.
    from nano.rl import RLConfig

    assert RLConfig(steps=50).warmup_length == 14
    assert RLConfig(steps=80).warmup_length == 22
    assert RLConfig(steps=80, warmup_steps=14).warmup_length == 14
    with pytest.raises(ValueError, match="--warmup-steps is -1"):
        RLConfig(warmup_steps=-1)


def _fallen_history(upto: int) -> list[dict]:
    """Validation 0.8 at step 0 and 0.0 at step 5; reward 1.0 at steps 1-4, 0.0 after: the
    collapse rule's R5 falls under half its peak (0.8) from step 8."""
    rows = [{"step": 0, "val/test_score/toy": 0.8}]
    for step in range(1, upto + 1):
        row = {"step": step, "critic/score/mean": 1.0 if step < 5 else 0.0}
        if step == 5:
            row["val/test_score/toy"] = 0.0
        rows.append(row)
    return rows


@pytest.mark.slow
def test_stop_after_fall_ends_a_real_run_where_the_collapse_rule_has_held(micro_run,
                                                                           tmp_path):
    """A run resumed at step 9 with a fallen history (steps 8-9) trains step 10 for real,
    sees the fall held 2 steps and stops there: stopped.json, checkpoint and final model."""
    import shutil

    source, args = micro_run
    out = tmp_path / "stopping"
    shutil.copytree(source, out)
    shutil.rmtree(out / "model")
    state = torch.load(out / "checkpoint" / "state.pt", weights_only=True)
    state["step"] = 9
    torch.save(state, out / "checkpoint" / "state.pt")
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n"
                                               for r in _fallen_history(9)))
    more = [*args, "--resume", "--stop-after-fall", "2", "--val-every", "100"]
    more[more.index("--out") + 1] = str(out)
    more[more.index("--steps") + 1] = "30"
    done = _run_cli(more)
    assert done.returncode == 0, done.stderr[-3000:]
    stopped = json.loads((out / "stopped.json").read_text())
    assert stopped["step"] == 10 and stopped["collapse_at"] == 8 and stopped["held_steps"] == 2
    steps = [json.loads(line)["step"]
             for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert max(steps) == 10  # step 10 was trained and logged, step 11 never began
    assert (out / "model" / "config.json").is_file()
    assert torch.load(out / "checkpoint" / "state.pt", weights_only=True)["step"] == 10
    assert "stopped at step 10: collapsed at step 8" in done.stdout + done.stderr


def test_the_stopping_rule_needs_the_fall_held_to_the_last_row():
    from curves.collapse_rule import fall_held

    rows = _fallen_history(9)
    assert fall_held(rows, 1) == 8 and fall_held(rows, 2) is None
    assert fall_held(_fallen_history(12), 4) == 8
    lifted = _fallen_history(12) + [{"step": 13, "critic/score/mean": 1.0,
                                     "val/test_score/toy": 0.8}]
    assert fall_held(lifted, 1) is None
    assert fall_held(_fallen_history(4), 1) is None
