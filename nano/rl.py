"""GRPO / LLDS training of a small Qwen2 search agent on CPU, nanoGPT style.

One step: batched rollouts through the project's agent loop (n samples per question,
temperature 1), EM rewards, group advantages, old and reference log-probs in a forward pass
before the update (as verl recomputes them), then PPO mini-batches with AdamW. The loss is
nano/llds.py. Logs go to a verl-style console log and JSON lines that `python -m curves`
reads. Full-scale training is verl with the LLDS fork; this is its recipe at laptop scale.
Over 300 lines because the loop, its checkpointing and its CLI read best in one place.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shlex
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from nano.llds import LossConfig

METHODS = {"grpo": None, "llds-r": "response", "llds-a": "action"}


@dataclass(frozen=True)
class RLConfig:
    method: str = "grpo"
    model: str = ""
    train_data: str = ""
    val_data: str = ""
    val_name: str = ""  # the set's name in `val/test_score/<name>`; default: file stem
    out: str = "runs/nano-rl"
    steps: int = 30
    lr: float = 1e-5
    kl_coef: float = 0.001
    llds_lambda: float = 0.2
    answer_lambda: float | None = None  # set: the MA variant (answer span weighted lower)
    group_size: int = 5
    batch_questions: int = 8
    mini_batches: int = 2  # PPO updates per step (512 prompts / 256 in the paper)
    micro_batch: int = 8  # responses per forward pass (gradient accumulation)
    clip_ratio: float = 0.2
    warmup_ratio: float = 0.285
    grad_clip: float = 1.0
    weight_decay: float = 0.01
    top_p: float = 0.95
    temperature: float = 1.0
    max_turns: int = 3
    max_new_tokens: int = 500
    max_obs_tokens: int = 500
    max_context_tokens: int = 4096
    engine: str = "bm25s"
    corpus: str = "default"
    val_every: int = 5
    val_limit: int = 100
    seed: int = 0
    threads: int = 2
    save_every: int = 10
    resume: bool = False

    @property
    def name(self) -> str:
        # The run's name in the logs (curves split runs by it): what tells two runs apart.
        if self.method == "grpo":
            return f"nano-grpo-lambda0-lr{self.lr:g}-seed{self.seed}"
        return f"nano-{self.method}-lambda{self.llds_lambda:g}-lr{self.lr:g}-seed{self.seed}"

    def loss(self) -> LossConfig:
        gate = METHODS[self.method]
        return LossConfig(clip_ratio=self.clip_ratio, kl_coef=self.kl_coef,
                          llds_lambda=0.0 if gate is None else self.llds_lambda,
                          answer_lambda=self.answer_lambda or 0.0, gate=gate or "response")


# ------------------------------------------------------------------------ the model side

def _padded(samples, device):
    """Left-padded prompts, right-padded responses: every response starts at one column."""
    import torch

    width_p = max(len(s.prompt_ids) for s in samples)
    width_r = max(len(s.response_ids) for s in samples)
    ids = torch.zeros((len(samples), width_p + width_r), dtype=torch.long)
    attention = torch.zeros_like(ids)
    mask = torch.zeros((len(samples), width_r))
    span = torch.zeros((len(samples), width_r))
    labels = torch.zeros((len(samples), width_r), dtype=torch.long)
    for row, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        ids[row, width_p - p:width_p] = torch.tensor(s.prompt_ids)
        ids[row, width_p:width_p + r] = torch.tensor(s.response_ids, dtype=torch.long)
        attention[row, width_p - p:width_p + r] = 1
        mask[row, :r] = torch.tensor(s.mask, dtype=torch.float)
        span[row, :r] = torch.tensor(s.answer_span, dtype=torch.float)
        labels[row, :r] = torch.tensor(s.response_ids, dtype=torch.long)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    return (ids.to(device), attention.to(device), positions.to(device), labels.to(device),
            mask.to(device), span.to(device), width_p)


def response_log_probs(model, samples, entropy: bool = False):
    """Per response token (B, R): log-prob of the sampled token, and the entropy; zeros on
    unmasked tokens. Only generated positions go through the output head (saves memory)."""
    import torch

    ids, attention, positions, labels, mask, span, width_p = _padded(samples, model.device)
    hidden = model.get_decoder()(input_ids=ids, attention_mask=attention,
                                 position_ids=positions, use_cache=False).last_hidden_state
    hidden = hidden[:, width_p - 1:width_p - 1 + labels.shape[1]]  # predicts response tokens
    picked = mask.bool()
    logits = model.get_output_embeddings()(hidden[picked]).float()
    log_softmax = torch.log_softmax(logits, dim=-1)
    log_prob = torch.zeros_like(mask)
    log_prob[picked] = log_softmax.gather(-1, labels[picked][:, None]).squeeze(-1)
    ent = None
    if entropy:
        ent = torch.zeros_like(mask)
        ent[picked] = -(log_softmax.exp() * log_softmax).sum(-1)
    return log_prob, ent, mask, span


def batched_log_probs(model, samples, micro_batch: int) -> list:
    """No-grad log-probs of each sample's response tokens (1-D tensors), micro-batched."""
    import torch

    # Micro-batches of similar lengths pad less; the order does not change any value.
    order = sorted(range(len(samples)),
                   key=lambda i: (len(samples[i].prompt_ids), len(samples[i].response_ids)))
    out: list = [None] * len(samples)
    with torch.no_grad():
        for start in range(0, len(order), micro_batch):
            rows = order[start:start + micro_batch]
            log_prob, _, _, _ = response_log_probs(model, [samples[i] for i in rows])
            for row, i in enumerate(rows):
                out[i] = log_prob[row, :len(samples[i].response_ids)].clone()
    return out


def _stack(values: list, width: int):
    import torch

    out = torch.zeros((len(values), width))
    for row, v in enumerate(values):
        out[row, :len(v)] = v
    return out


def update(model, optimizer, samples, old, ref, advantages, config: RLConfig,
           loss_config: LossConfig) -> dict[str, float]:
    """PPO mini-batches over the step's samples (in order, as verl splits them)."""
    import torch

    from nano.llds import total_loss

    model.train()
    size = math.ceil(len(samples) / config.mini_batches)
    averaged: dict[str, list[float]] = {}
    last: dict[str, float] = {}
    for start in range(0, len(samples), size):
        mini = list(range(start, min(start + size, len(samples))))
        micros = [mini[i:i + config.micro_batch] for i in range(0, len(mini),
                                                                 config.micro_batch)]
        optimizer.zero_grad()
        for micro in micros:
            chunk = [samples[i] for i in micro]
            log_prob, ent, mask, span = response_log_probs(model, chunk, entropy=True)
            width = mask.shape[1]
            loss, metrics = total_loss(
                log_prob, _stack([old[i] for i in micro], width),
                _stack([ref[i] for i in micro], width), advantages[micro], mask, ent,
                loss_config, answer_span=span if config.answer_lambda is not None else None)
            (loss / len(micros)).backward()
            for key in ("actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl",
                        "actor/entropy_loss", "actor/kl_loss"):
                averaged.setdefault(key, []).append(metrics.pop(key))
            last = metrics  # the LLDS fork logs the last micro-batch's values
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        averaged.setdefault("actor/grad_norm", []).append(float(grad_norm))
        if math.isfinite(float(grad_norm)):
            optimizer.step()
    optimizer.zero_grad()
    model.eval()
    return {**{k: sum(v) / len(v) for k, v in averaged.items()}, **last}


# ------------------------------------------------------------------------ logging

class StepLog:
    """verl's console line (3 decimals) to a text log, and the same values as JSON lines."""

    def __init__(self, out: Path, run_name: str):
        self.console = (out / "train.log").open("a", encoding="utf-8")
        self.jsonl = (out / "metrics.jsonl").open("a", encoding="utf-8")
        self.run_name = run_name

    def write(self, step: int, metrics: dict[str, float]) -> str:
        line = " - ".join([f"step:{step}"] + [f"{k}:{v:.3f}" for k, v in metrics.items()])
        self.console.write(line + "\n")
        self.console.flush()
        self.jsonl.write(json.dumps({"step": step, "experiment_name": self.run_name,
                                     **metrics}) + "\n")
        self.jsonl.flush()
        return line

    def close(self) -> None:
        self.console.close()
        self.jsonl.close()


def step_data_metrics(samples) -> dict[str, float]:
    n = len(samples)
    scores = [s.reward for s in samples]
    return {
        "critic/score/mean": sum(scores) / n,
        "critic/rewards/mean": sum(scores) / n,  # no KL in the reward (KL is a loss)
        "response_length/mean": sum(len(s.response_ids) for s in samples) / n,
        "response_length/generated_mean": sum(sum(s.mask) for s in samples) / n,
        "env/number_of_valid_search": sum(s.searches for s in samples) / n,
        "env/answered": sum(s.prediction is not None for s in samples) / n,
    }


# ------------------------------------------------------------------------ checkpoints

def save_checkpoint(directory: Path, model, tokenizer, optimizer, scheduler, step: int,
                    config: RLConfig) -> None:
    import torch

    partial = directory.with_name(directory.name + ".partial")
    partial.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "step": step, "config": asdict(config),
                "rng": {"torch": torch.get_rng_state(), "python": random.getstate()}},
               partial / "trainer_state.pt")
    if directory.exists():  # replace only what this trainer wrote (its own checkpoint)
        old = directory.with_name(directory.name + ".old")
        directory.rename(old)
        partial.rename(directory)
        import shutil

        shutil.rmtree(old)
    else:
        partial.rename(directory)


# ------------------------------------------------------------------------ the loop

def validate(backend, retriever, questions, config: RLConfig) -> float:
    from agent.loop import AgentSettings
    from nano.rollout import rollout

    settings = AgentSettings(max_turns=config.max_turns, max_new_tokens=config.max_new_tokens,
                             max_obs_tokens=config.max_obs_tokens,
                             max_context_tokens=config.max_context_tokens, greedy=True)
    samples = rollout(backend, retriever, questions[:config.val_limit], 1, settings)
    return sum(s.reward for s in samples) / len(samples)


def train(config: RLConfig, command: str = "") -> Path:
    """Run (or resume) one training run; returns the output directory."""
    import torch
    from tqdm import tqdm

    from agent.backends.hf import TransformersBackend
    from agent.loop import AgentSettings
    from nano.llds import group_advantages
    from nano.rollout import TimedRetriever, load_questions, rollout
    from retriever.client import LocalRetriever

    out = Path(config.out)
    checkpoint = out / "checkpoint"
    state = None
    if checkpoint.exists():
        if not config.resume:
            raise SystemExit(f"{out} already holds a run (checkpoint/). Pass --resume to go "
                             "on with it, or choose another --out.")
        state = torch.load(checkpoint / "trainer_state.pt", weights_only=False)
    out.mkdir(parents=True, exist_ok=True)
    (out / "command.txt").write_text(command + "\n", encoding="utf-8")
    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    random.seed(config.seed)

    train_questions = load_questions(config.train_data)
    val_questions = load_questions(config.val_data) if config.val_data else []
    val_name = config.val_name or (Path(config.val_data).stem if config.val_data else "")

    backend = TransformersBackend(str(checkpoint) if state else config.model, device="cpu",
                                  dtype="float32")
    model, tokenizer = backend.model, backend.tokenizer
    ref_model = TransformersBackend(config.model, device="cpu", dtype="float32").model
    ref_model.requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr,
                                  weight_decay=config.weight_decay)
    warmup = max(1, int(config.warmup_ratio * config.steps))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer,
                                                  lambda s: min(1.0, (s + 1) / warmup))
    step = 0
    if state:
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        step = state["step"]
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
    retriever = TimedRetriever(LocalRetriever(engine=config.engine, corpus=config.corpus))
    settings = AgentSettings(max_turns=config.max_turns, max_new_tokens=config.max_new_tokens,
                             max_obs_tokens=config.max_obs_tokens,
                             max_context_tokens=config.max_context_tokens, greedy=False,
                             temperature=config.temperature, top_p=config.top_p)
    loss_config = config.loss()
    log = StepLog(out, config.name)
    if step == 0 and val_questions:
        log.write(0, {f"val/test_score/{val_name}": validate(backend, retriever, val_questions,
                                                             config)})
    bar = tqdm(total=config.steps, initial=step, desc=config.name, unit="step")
    while step < config.steps:
        step += 1
        started = time.perf_counter()
        order = random.Random(config.seed * 100003 + step)
        batch = order.sample(train_questions, min(config.batch_questions, len(train_questions)))
        retriever.seconds = 0.0
        samples = rollout(backend, retriever, batch, config.group_size, settings)
        rolled = time.perf_counter()
        rewards = torch.tensor([s.reward for s in samples])
        advantages = group_advantages(rewards, [s.group for s in samples])
        samples_ok = [s for s in samples if sum(s.mask)]  # a response with no token trains nothing
        keep = [i for i, s in enumerate(samples) if sum(s.mask)]
        old = batched_log_probs(model, samples_ok, config.micro_batch)
        ref = batched_log_probs(ref_model, samples_ok, config.micro_batch)
        scored = time.perf_counter()
        metrics = update(model, optimizer, samples_ok, old, ref, advantages[keep], config,
                         loss_config) if samples_ok else {}
        scheduler.step()
        updated = time.perf_counter()
        metrics = {**metrics, **step_data_metrics(samples),
                   "actor/lr": optimizer.param_groups[0]["lr"],
                   "timing_s/rollout": rolled - started - retriever.seconds,
                   "timing_s/retrieval": retriever.seconds,
                   "timing_s/log_prob": scored - rolled, "timing_s/update": updated - scored}
        if val_questions and (step % config.val_every == 0 or step == config.steps):
            begun = time.perf_counter()
            metrics[f"val/test_score/{val_name}"] = validate(backend, retriever, val_questions,
                                                             config)
            metrics["timing_s/validation"] = time.perf_counter() - begun
        metrics["timing_s/step"] = time.perf_counter() - started
        log.write(step, metrics)
        bar.update(1)
        bar.set_postfix(score=f"{metrics['critic/score/mean']:.2f}",
                        pos_lp=f"{metrics.get('actor/pos_avg_old_log_prob', 0):.3f}")
        if step % config.save_every == 0 or step == config.steps:
            save_checkpoint(checkpoint, model, tokenizer, optimizer, scheduler, step, config)
    bar.close()
    log.close()
    model.save_pretrained(out / "model")
    tokenizer.save_pretrained(out / "model")
    return out


# ------------------------------------------------------------------------ the CLI

_ENV = "LLDS_RL_"


def _env_default(name: str, default):
    value = os.environ.get(_ENV + name.upper())
    if value is None:
        return default
    return type(default)(value) if default not in (None, "") else value


def parse_args(argv: list[str] | None = None) -> RLConfig:
    """CLI flags, each with an env-var twin (LLDS_RL_<FLAG>, e.g. LLDS_RL_LR)."""
    defaults = RLConfig()
    parser = argparse.ArgumentParser(
        prog="python -m nano rl",
        description="GRPO / LLDS training of a small search agent (nano scale, CPU). "
                    f"Every flag falls back to an env var {_ENV}<FLAG>.")
    parser.add_argument("--method", choices=sorted(METHODS),
                        default=_env_default("method", defaults.method))
    parser.add_argument("--lambda", dest="llds_lambda", type=float,
                        default=_env_default("lambda", defaults.llds_lambda),
                        help="LLDS weight (no_reduce_lambda); unused by grpo")
    parser.add_argument("--answer-lambda", type=float,
                        default=_env_default("answer_lambda", None),
                        help="weight of the answer span (the MA variant; capped at --lambda)")
    parser.add_argument("--model", default=_env_default("model", defaults.model),
                        help="the starting checkpoint (a Qwen2 model directory)")
    parser.add_argument("--train-data", default=_env_default("train_data", ""),
                        help="JSON lines with question and golden_answers")
    parser.add_argument("--val-data", default=_env_default("val_data", ""))
    simple = {"val_name": str, "out": str, "steps": int, "lr": float, "kl_coef": float,
              "group_size": int, "batch_questions": int, "mini_batches": int,
              "micro_batch": int, "warmup_ratio": float, "grad_clip": float, "top_p": float,
              "max_turns": int, "max_new_tokens": int, "max_obs_tokens": int,
              "max_context_tokens": int, "engine": str, "corpus": str, "val_every": int,
              "val_limit": int, "seed": int, "threads": int, "save_every": int}
    for name, kind in simple.items():
        parser.add_argument("--" + name.replace("_", "-"), type=kind,
                            default=_env_default(name, getattr(defaults, name)))
    parser.add_argument("--resume", action="store_true",
                        default=os.environ.get(_ENV + "RESUME", "") not in ("", "0"))
    args = parser.parse_args(argv)
    if not args.model:
        parser.error("--model is required: the starting Qwen2 checkpoint directory")
    if not args.train_data:
        parser.error("--train-data is required: a JSON-lines file of training questions")
    for name in ("steps", "group_size", "batch_questions", "mini_batches", "micro_batch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    values = {f.name: getattr(args, f.name) for f in fields(RLConfig) if hasattr(args, f.name)}
    return RLConfig(**values)


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    command = "python -m nano rl " + shlex.join(sys.argv[1:] if argv is None else argv)
    out = train(config, command)
    print(f"done: logs in {out / 'train.log'} and {out / 'metrics.jsonl'}, model in "
          f"{out / 'model'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
