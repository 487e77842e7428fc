"""GRPO / LLDS training of a small Qwen2 search agent on CPU, nanoGPT style.

One step: batched rollouts through the project's agent loop (n samples per question,
temperature 1), EM rewards, group advantages, old and reference log-probs in a forward pass
before the update (as verl recomputes them), then PPO mini-batches with AdamW. The loss is
nano/llds.py. Logs go to a verl-style console log and JSON lines that `python -m curves`
reads: the LLDS fork's keys, and measures of displacement of our own (per advantage class
over the whole step, and the likelihood of a fixed anchor set; docs/llds.md). Full-scale
training is verl with the LLDS fork; this is its recipe at laptop scale.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from curves.collapse_rule import fall_held
from nano import anchors, checkpoint
from nano.llds import GATES, LossConfig, entropy
from nano.options import check_bounds, option
from nano.rollout import RolloutOptions

METHODS = {"grpo": None, "llds-r": "response", "llds-a": "action"}


@dataclass(frozen=True)
class RLConfig(RolloutOptions):
    method: str = option("grpo", "grpo, or the LLDS term gated per response (llds-r) or "
                                 "per action (llds-a)", choices=tuple(sorted(METHODS)))
    model: str = option("", "the starting checkpoint (a Qwen2 model directory); required")
    train_data: str = option("", "JSON lines with question and golden_answers; required")
    val_data: str = option("", "validation questions, same format")
    val_name: str = option("", "the set's name in `val/test_score/<name>`; default: the "
                               "file's stem")
    out: str = option("runs/nano-rl", "where logs, the checkpoint and the model go")
    resume: bool = option(False, "go on from OUT/checkpoint (an existing one is refused "
                                 "without this flag)")
    steps: int = option(30, "training steps")
    lr: float = option(1e-5, "peak learning rate (linear warm-up, then constant)")
    kl_coef: float = option(0.001, "weight of low_var_kl to the reference, as a loss")
    llds_lambda: float = option(0.2, "LLDS weight (no_reduce_lambda); unused by grpo",
                                flag="--lambda")
    gate: str = option("lazy", "which fallen responses/actions the LLDS term holds: lazy "
                               "(the fork's: A >= 0, sum(old - new) > 0), tolerance (A >= 0, "
                               "sum(old - new) > --gate-tolerance per token), positive (the "
                               "fork's test on A > 0 only)", choices=GATES)
    gate_tolerance: float = option(1e-4, "per generated token: the fall the tolerance gate "
                                         "ignores")
    answer_lambda: float | None = option(None, "weight of the answer span (the MA variant; "
                                               "capped at --lambda)")
    group_size: int = option(5, "responses per question (the GRPO group)")
    batch_questions: int = option(8, "questions per step")
    mini_batches: int = option(2, "PPO updates per step (512 prompts / 256 in the paper)")
    micro_batch: int = option(8, "responses per forward pass (gradient accumulation)")
    clip_ratio: float = option(0.2, "PPO clip range")
    warmup_ratio: float = option(0.285, "fraction of the steps the learning rate warms up")
    warmup_steps: int = option(0, "warm-up length in steps, overriding --warmup-ratio (0: use "
                                  "the ratio); keeps the schedule when --steps changes")
    grad_clip: float = option(1.0, "gradient-norm clip")
    weight_decay: float = option(0.01, "AdamW weight decay")
    val_every: int = option(5, "steps between validations")
    val_limit: int = option(100, "validate on the first this-many questions")
    seed: int = option(0, "seeds the question order and the sampling")
    threads: int = option(2, "torch threads")
    save_every: int = option(10, "steps between checkpoints")
    anchor_size: int = option(64, "correct trajectories of the starting model drawn as the "
                                  "anchor set (OUT/anchors.jsonl; a set read from --anchors "
                                  "is used whole); 0: no anchor set")
    anchor_every: int = option(5, "steps between measures of anchor/logp")
    anchors: str = option("", "an anchors.jsonl to use instead of sampling a set (copied "
                              "into OUT)")
    stop_after_fall: int = option(0, "stop once the collapse rule (curves/collapse_rule.py) "
                                     "has held this many steps (OUT/stopped.json says "
                                     "where); 0: always run --steps")

    def __post_init__(self) -> None:
        """Values that cannot train, refused with what to pass instead."""
        if self.method not in METHODS:
            raise ValueError(f"--method {self.method!r}: pick one of {', '.join(METHODS)}.")
        self.check_rollout()
        check_bounds(self, at_least_one=("steps", "group_size", "batch_questions",
                                         "mini_batches", "micro_batch", "val_every",
                                         "val_limit", "threads", "save_every",
                                         "anchor_every"),
                     not_negative=("kl_coef", "llds_lambda", "weight_decay", "clip_ratio",
                                   "warmup_ratio", "warmup_steps", "gate_tolerance",
                                   "anchor_size", "stop_after_fall"))
        if self.gate not in GATES:
            raise ValueError(f"--gate {self.gate!r}: pick one of {', '.join(GATES)}.")
        if self.gate != "lazy" and self.method == "grpo":
            raise ValueError(f"--gate {self.gate} changes the LLDS term, which --method grpo "
                             "does not have: pass --method llds-a or llds-r, or drop --gate.")
        if self.answer_lambda is not None and self.answer_lambda < 0:
            raise ValueError(f"--answer-lambda is {self.answer_lambda}; it cannot be negative.")
        if not self.lr > 0 or not self.grad_clip > 0:
            raise ValueError("--lr and --grad-clip must be above 0 (they are "
                             f"{self.lr}, {self.grad_clip}).")

    @property
    def name(self) -> str:
        # The run's name in the logs (curves split runs by it): what tells two runs apart.
        if self.method == "grpo":
            return f"nano-grpo-lambda0-lr{self.lr:g}-seed{self.seed}"
        gate = "" if self.gate == "lazy" else f"-gate-{self.gate}"
        return (f"nano-{self.method}{gate}-lambda{self.llds_lambda:g}-lr{self.lr:g}"
                f"-seed{self.seed}")

    @property
    def warmup_length(self) -> int:
        """Steps of linear warm-up: --warmup-steps, else the ratio of --steps (verl's rule)."""
        return self.warmup_steps or max(1, int(self.warmup_ratio * self.steps))

    def loss(self) -> LossConfig:
        unit = METHODS[self.method]
        return LossConfig(clip_ratio=self.clip_ratio, kl_coef=self.kl_coef,
                          llds_lambda=0.0 if unit is None else self.llds_lambda,
                          answer_lambda=self.answer_lambda or 0.0, unit=unit or "response",
                          gate=self.gate, gate_tolerance=self.gate_tolerance)


def check_paths(config: RLConfig) -> None:
    """The model and question files exist and OUT can take the run: a ValueError saying
    what to pass, before anything is loaded or written."""
    if not config.model:
        raise ValueError("--model is required: the starting Qwen2 checkpoint directory.")
    if not (Path(config.model) / "config.json").is_file():
        raise ValueError(f"--model {config.model}: no model there (no config.json); pass a "
                         "Qwen2 model directory, e.g. assets/nano-agent.")
    if not config.train_data:
        raise ValueError("--train-data is required: a JSON-lines file of training questions.")
    for flag, path in (("--train-data", config.train_data), ("--val-data", config.val_data)):
        if path and not Path(path).is_file():
            raise ValueError(f"{flag} {path}: no such file; pass a JSON-lines file whose "
                             "records have question and golden_answers.")
    checkpoint.check_out(Path(config.out), config.resume)
    if config.anchors:
        if not config.anchor_size:
            raise ValueError("--anchors with --anchor-size 0: pass a size above 0 to measure "
                             "the anchor set, or drop --anchors.")
        anchors.read(Path(config.anchors))  # an AnchorError (a ValueError) if malformed
        own = Path(config.out) / anchors.FILE
        if own.is_file() and own.read_bytes() != Path(config.anchors).read_bytes():
            raise ValueError(f"{own} holds this run's anchor set and differs from --anchors "
                             f"{config.anchors}; a run keeps its own set: drop --anchors or "
                             "choose another --out.")


def read_questions(path: str | Path) -> list:
    """The questions of one file, through the evaluator's loader (FlashRAG records)."""
    from evaluator.benchmarks import DataError, load_local

    path = Path(path)
    questions, _, found = load_local(path.parent, path.stem)
    if found != path:
        raise DataError(f"{path}: the loader would read {found} instead (same name); move "
                        "the question file to a directory of its own.")
    unanswerable = [q.id for q in questions if not q.golden_answers]
    if unanswerable:
        raise DataError(f"{path}: {len(unanswerable)} record(s) have no golden answers (e.g. "
                        f"id {unanswerable[0]!r}), so no response could earn a reward; add "
                        "golden_answers or remove them.")
    if not questions:
        raise DataError(f"{path} holds no questions.")
    return questions


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


def response_log_probs(model, samples, with_entropy: bool = False):
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
    if with_entropy:
        ent = torch.zeros_like(mask)
        ent[picked] = entropy(log_softmax)
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


def trainable(samples: list, advantages) -> tuple[list, object]:
    """The samples with at least one generated token, and their advantages, in step: a
    response with no generated token has no loss to train on."""
    keep = [i for i, s in enumerate(samples) if sum(s.mask)]
    return [samples[i] for i in keep], advantages[keep]


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
            log_prob, ent, mask, span = response_log_probs(model, chunk, with_entropy=True)
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


def read_log(out: Path, upto: int) -> list[dict]:
    """The run's metrics rows up to step `upto`, the last line of a step winning (a resumed
    run writes the steps after its checkpoint again)."""
    rows: dict[int, dict] = {}
    for line in (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            if int(row["step"]) <= upto:
                rows[int(row["step"])] = row
    return [rows[s] for s in sorted(rows)]


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


def step_displacement(samples, old, ref, advantages) -> dict[str, float]:
    """`displacement_metrics` over every trained response of the step (old and ref as
    `batched_log_probs` gives them, before the update)."""
    import torch

    from nano.llds import displacement_metrics

    if not samples:
        return displacement_metrics(torch.zeros((0, 1)), torch.zeros((0, 1)),
                                    torch.zeros(0), torch.zeros((0, 1)))
    width = max(len(s.response_ids) for s in samples)
    mask = _stack([torch.tensor(s.mask, dtype=torch.float) for s in samples], width)
    return displacement_metrics(_stack(old, width), _stack(ref, width), advantages, mask)


# ------------------------------------------------------------------------ the anchor set

def read_anchor_set(config: RLConfig, vocab_size: int) -> list | None:
    """The run's own anchor set (OUT/anchors.jsonl, as on a resume), else --anchors copied
    into OUT, else None (to be drawn); None too with --anchor-size 0."""
    if not config.anchor_size:
        return None
    own = Path(config.out) / anchors.FILE
    source = own if own.is_file() else Path(config.anchors) if config.anchors else None
    if source is None:
        return None
    samples = anchors.read(source)
    anchors.check_tokens(samples, vocab_size, source)
    if source != own:
        own.parent.mkdir(parents=True, exist_ok=True)
        own.write_bytes(source.read_bytes())
    return samples


def draw_anchor_set(reference, retriever, questions, settings, config: RLConfig,
                    decode) -> list:
    """Sample the anchor set from the starting model (the reference: the same weights on a
    resume) and write it to OUT/anchors.jsonl."""
    drawn = anchors.draw(reference, retriever, questions, config.anchor_size, settings)
    if not drawn:
        raise anchors.AnchorError(
            f"the starting model answered none of the {len(questions)} training questions "
            "right when sampled, so there is no anchor set: pass --anchor-size 0 to train "
            "without one, or --anchors FILE.")
    anchors.write(Path(config.out) / anchors.FILE, drawn, decode)
    if len(drawn) < config.anchor_size:
        print(f"anchor set: {len(drawn)} correct trajectories of the {config.anchor_size} "
              f"asked for ({len(questions)} questions tried)", flush=True)
    return [sample for _, sample in drawn]


# ------------------------------------------------------------------------ checkpoints

def save_checkpoint(directory: Path, model, tokenizer, optimizer, scheduler, step: int,
                    config: RLConfig) -> None:
    import torch

    def write_files(path: Path) -> None:
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)

    checkpoint.save(directory, write_files,
                    {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                     "step": step, "config": asdict(config),
                     "rng": {"torch": torch.get_rng_state(), "python": random.getstate()}})


# ------------------------------------------------------------------------ the loop

def validate(backend, retriever, questions, config: RLConfig) -> float:
    from nano.rollout import rollout, rollout_settings

    samples = rollout(backend, retriever, questions[:config.val_limit], 1,
                      rollout_settings(config, greedy=True))
    return sum(s.reward for s in samples) / len(samples)


def train(config: RLConfig, command: str = "") -> Path:
    """Run (or resume) one training run; returns the output directory."""
    import torch
    from tqdm import tqdm

    from agent.backends.hf import TransformersBackend
    from nano.llds import group_advantages
    from nano.rollout import TimedRetriever, rollout, rollout_settings
    from retriever.client import LocalRetriever

    check_paths(config)
    train_questions = read_questions(config.train_data)
    val_questions = read_questions(config.val_data) if config.val_data else []
    val_name = config.val_name or (Path(config.val_data).stem if config.val_data else "")
    out = Path(config.out)
    saved = out / "checkpoint"
    state = checkpoint.load_state(saved) if config.resume and checkpoint.exists(saved) else None
    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    random.seed(config.seed)

    backend = TransformersBackend(str(saved) if state else config.model, device="cpu",
                                  dtype="float32")
    model, tokenizer = backend.model, backend.tokenizer
    reference = TransformersBackend(config.model, device="cpu", dtype="float32")
    ref_model = reference.model
    ref_model.requires_grad_(False)
    anchor_set = read_anchor_set(config, model.config.vocab_size)
    out.mkdir(parents=True, exist_ok=True)
    (out / "command.txt").write_text(command + "\n", encoding="utf-8")
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr,
                                  weight_decay=config.weight_decay)
    warmup = config.warmup_length
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
    settings = rollout_settings(config)
    loss_config = config.loss()
    if config.anchor_size and anchor_set is None:
        anchor_set = draw_anchor_set(reference, retriever, train_questions, settings, config,
                                     tokenizer.decode)

    def measure_anchors() -> dict[str, float]:
        if not anchor_set:
            return {}
        begun = time.perf_counter()
        log_probs = batched_log_probs(model, anchor_set, config.micro_batch)
        return {"anchor/logp": anchors.mean_log_prob(log_probs, anchor_set),
                "anchor/n": float(len(anchor_set)),
                "timing_s/anchor": time.perf_counter() - begun}

    log = StepLog(out, config.name)
    if step == 0 and (val_questions or anchor_set):
        first = measure_anchors()
        if val_questions:
            first[f"val/test_score/{val_name}"] = validate(backend, retriever, val_questions,
                                                           config)
        log.write(0, first)
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
        kept, kept_advantages = trainable(samples, advantages)
        old = batched_log_probs(model, kept, config.micro_batch)
        ref = batched_log_probs(ref_model, kept, config.micro_batch)
        scored = time.perf_counter()
        metrics = update(model, optimizer, kept, old, ref, kept_advantages, config,
                         loss_config) if kept else {}
        scheduler.step()
        updated = time.perf_counter()
        metrics = {**metrics, **step_displacement(kept, old, ref, kept_advantages),
                   **step_data_metrics(samples),
                   "actor/lr": optimizer.param_groups[0]["lr"],
                   "timing_s/rollout": rolled - started - retriever.seconds,
                   "timing_s/retrieval": retriever.seconds,
                   "timing_s/log_prob": scored - rolled, "timing_s/update": updated - scored}
        if val_questions and (step % config.val_every == 0 or step == config.steps):
            begun = time.perf_counter()
            metrics[f"val/test_score/{val_name}"] = validate(backend, retriever, val_questions,
                                                             config)
            metrics["timing_s/validation"] = time.perf_counter() - begun
        if step % config.anchor_every == 0 or step == config.steps:
            metrics.update(measure_anchors())
        metrics["timing_s/step"] = time.perf_counter() - started
        log.write(step, metrics)
        bar.update(1)
        bar.set_postfix(score=f"{metrics['critic/score/mean']:.2f}",
                        pos_lp=f"{metrics.get('actor/pos_avg_old_log_prob', 0):.3f}")
        fell_at = fall_held(read_log(out, step), config.stop_after_fall) \
            if config.stop_after_fall else None
        if step % config.save_every == 0 or step == config.steps or fell_at is not None:
            save_checkpoint(saved, model, tokenizer, optimizer, scheduler, step, config)
        if fell_at is not None:
            (out / "stopped.json").write_text(json.dumps(
                {"step": step, "collapse_at": fell_at, "held_steps": step - fell_at,
                 "rule": "curves/collapse_rule.py, --stop-after-fall "
                         f"{config.stop_after_fall}"}) + "\n", encoding="utf-8")
            tqdm.write(f"stopped at step {step}: collapsed at step {fell_at} by the collapse "
                       f"rule, held {step - fell_at} steps")
            break
    bar.close()
    log.close()
    model.save_pretrained(out / "model")
    tokenizer.save_pretrained(out / "model")
    return out
