"""SYNTHETIC training logs for the curves tests and benchmark (shared by both, so here).

Nothing here is real training data: the curves are made up to have known phases (where the
likelihood starts to decay, where it accelerates, where the reward collapses) so the parsers
and the phase rule can be checked against ground truth. Every writer puts "synthetic" in
the run name or file so a figure made from them cannot be mistaken for a real run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class SyntheticPhases:
    """Ground truth of a synthetic GRPO-like run (steps)."""

    decay_at: int = 60
    accel_at: int = 120
    collapse_at: int = 165
    steps: int = 200


def synthetic_run(kind: str = "grpo", steps: int = 200, seed: int = 0,
                  phases: SyntheticPhases | None = None, noise: float = 0.01) -> pd.DataFrame:
    """A step x metric table using verl / LLDS-fork key names.

    kind: "grpo" (flat, steady decay, accelerated collapse, reward collapse),
    "llds" (stable likelihood, no collapse), "flat" (everything flat + noise), or
    "plain-grpo": the "grpo" run as a log without the LLDS fork's likelihood keys (as
    Search-R1's own logs are), its entropy rising as the hidden likelihood falls.
    """
    if kind == "plain-grpo":
        table = synthetic_run("grpo", steps, seed, phases, noise)
        hidden = table["actor/pos_avg_old_log_prob"]
        table["actor/entropy_loss"] = 0.8 + 2.0 * (-0.30 - hidden)
        return table.drop(columns=[k for k in table.columns if "avg_" in k])
    rng = np.random.default_rng(seed)
    ph = phases or SyntheticPhases(steps=steps)
    t = np.arange(1, steps + 1, dtype=float)
    if kind == "grpo":
        lik = np.full_like(t, -0.30)
        ii = (t > ph.decay_at) & (t <= ph.accel_at)
        lik[ii] -= 0.001 * (t[ii] - ph.decay_at)
        iii = t > ph.accel_at
        base = -0.30 - 0.001 * (ph.accel_at - ph.decay_at)
        u = t[iii] - ph.accel_at
        lik[iii] = base - 0.008 * u - 0.0002 * u**2
        reward = 0.1 + 0.35 * (1 - np.exp(-t / 40))
        fall = t > ph.collapse_at
        reward[fall] *= np.exp(-(t[fall] - ph.collapse_at) / 8)
        grad = 0.3 * np.exp(rng.normal(0, 0.1, steps))
        late = np.flatnonzero(t > ph.accel_at + 30)
        grad[late[::7]] *= 15.0
    elif kind == "llds":
        lik = -0.30 + 0.02 * (1 - np.exp(-t / 50))
        reward = 0.1 + 0.4 * (1 - np.exp(-t / 40))
        grad = 0.3 * np.exp(rng.normal(0, 0.1, steps))
    elif kind == "flat":
        lik = np.full_like(t, -0.30)
        reward = np.full_like(t, 0.3)
        grad = 0.3 * np.exp(rng.normal(0, 0.1, steps))
    else:
        raise ValueError(kind)
    table = pd.DataFrame(index=pd.Index(t.astype(int), name="step"))
    table["actor/pos_avg_old_log_prob"] = lik + rng.normal(0, noise, steps)
    table["actor/neg_avg_old_log_prob"] = lik - 0.2 + rng.normal(0, noise, steps)
    table["actor/pos_avg_ref_log_prob"] = -0.32 + rng.normal(0, noise, steps)
    table["actor/neg_avg_ref_log_prob"] = -0.52 + rng.normal(0, noise, steps)
    table["critic/score/mean"] = np.clip(reward + rng.normal(0, 0.02, steps), 0, 1)
    table["actor/grad_norm"] = grad
    table["actor/entropy_loss"] = 0.8 + rng.normal(0, 0.02, steps)
    table["actor/kl_loss"] = 0.001 * t / steps + np.abs(rng.normal(0, 1e-4, steps))
    table["actor/pg_loss"] = rng.normal(0, 0.05, steps)
    table["response_length/mean"] = 400 + rng.normal(0, 10, steps)
    table["env/number_of_valid_search"] = 1.5 + rng.normal(0, 0.1, steps)
    if kind == "llds":
        table["actor/loss_noreduce"] = 0.01 + np.abs(rng.normal(0, 0.002, steps))
        table["actor/loss_noreduce_coef"] = 0.2
    val = table.index % 10 == 0
    table.loc[val, "val/test_score/nq"] = table.loc[val, "critic/score/mean"] * 0.9
    return table


def console_line(step: int, row: pd.Series, style: str = "plain") -> str:
    """One verl console line; style: plain, np (np.float64(...) values), ansi (colour, prefix)."""
    parts = [f"step:{step}"]
    for key, value in row.items():
        if pd.isna(value):
            continue
        text = f"{value:.3f}"
        if style == "np":
            text = f"np.float64({value:.3f})"
        parts.append(f"{key}:{text}")
    line = " - ".join(parts)
    if style == "ansi":
        line = f"\x1b[36m(TaskRunner pid=4242)\x1b[0m {line}"
    return line


def write_console(path: Path, runs: list[tuple[str, pd.DataFrame]], style: str = "plain",
                  noise_lines: bool = True) -> Path:
    """A SYNTHETIC verl console log holding one or more runs, with start-up noise."""
    with open(path, "w", encoding="utf-8") as handle:
        for name, table in runs:
            if noise_lines:
                handle.write("# SYNTHETIC log written by curves/synthetic.py\n")
                handle.write(f"(TaskRunner pid=4242) {{'trainer': {{'experiment_name': "
                             f"'{name}', 'total_epochs': 1}}}}\n")
                handle.write("WARNING: something unrelated happened\n")
            for step, row in table.iterrows():
                handle.write(console_line(int(step), row, style) + "\n")
                if noise_lines and step % 50 == 0:
                    handle.write("Traceback (most recent call last):\n  File \"x.py\", line 1\n")
                    handle.write(f"Training Progress:  {int(step) // 2}%|###   | {step}/200 "
                                 "[00:10<00:20, 1.2it/s]\n")
    return path


def write_jsonl(path: Path, table: pd.DataFrame, step_field: str = "step",
                name: str | None = None) -> Path:
    with open(path, "w", encoding="utf-8") as handle:
        for step, row in table.iterrows():
            record = {step_field: int(step)}
            if name:
                record["experiment_name"] = name
            record.update({k: float(v) for k, v in row.items() if not pd.isna(v)})
            handle.write(json.dumps(record) + "\n")
    return path


def write_wandb_single_csv(path: Path, table: pd.DataFrame, step_col: str = "_step") -> Path:
    frame = table.reset_index().rename(columns={"step": step_col})
    frame["_runtime"] = np.arange(len(frame)) * 30.0
    frame.to_csv(path, index=False)
    return path


def write_wandb_chart_csv(path: Path, runs: list[tuple[str, pd.DataFrame]],
                          keys: list[str]) -> Path:
    """A W&B chart export: Step, `<run> - <key>`, `<run> - <key>__MIN`, `__MAX`."""
    frame = pd.DataFrame(index=sorted(set().union(*[set(t.index) for _, t in runs])))
    for name, table in runs:
        for key in keys:
            frame[f"{name} - {key}"] = table[key]
            frame[f"{name} - {key}__MIN"] = table[key] - 0.01
            frame[f"{name} - {key}__MAX"] = table[key] + 0.01
    frame.index.name = "Step"
    frame.reset_index().to_csv(path, index=False)
    return path


def write_parquet(path: Path, table: pd.DataFrame) -> Path:
    frame = table.reset_index().rename(columns={"step": "_step"})
    frame["_timestamp"] = 1.7e9 + np.arange(len(frame))
    frame.to_parquet(path, index=False)
    return path


def write_tensorboard(folder: Path, table: pd.DataFrame) -> Path:
    """Scalars via torch's SummaryWriter; returns the event file path."""
    from torch.utils.tensorboard import SummaryWriter

    folder.mkdir(parents=True, exist_ok=True)
    writer = SummaryWriter(log_dir=str(folder))
    for step, row in table.iterrows():
        for key, value in row.items():
            if not pd.isna(value):
                writer.add_scalar(key, float(value), int(step))
    writer.close()
    return next(folder.glob("events.out.tfevents.*"))


def stretched_run(steps: int, seed: int = 0) -> pd.DataFrame:
    """The 200-step "grpo" run stretched to `steps`: the same curves, the phases at the
    same fractions of the run (decay at 30%, acceleration at 60%, collapse at 82.5%), with
    a little fresh noise per step."""
    base = synthetic_run("grpo", steps=200, seed=seed)
    rng = np.random.default_rng(seed)
    where = np.linspace(1, 200, steps)
    table = pd.DataFrame(index=pd.Index(np.arange(1, steps + 1), name="step"))
    for key in base.columns:
        column = base[key].dropna()
        table[key] = np.interp(where, column.index.to_numpy(), column.to_numpy())
        if not key.startswith("val/"):
            table[key] += rng.normal(0, 0.2 * float(base[key].diff().std() or 0), steps)
    table.loc[table.index % 10 != 0, [k for k in table.columns if k.startswith("val/")]] = np.nan
    return table


def write_large_console(path: Path, target_bytes: int, n_metrics: int = 60,
                        noise_every: int = 10, seed: int = 0) -> tuple[int, int]:
    """A SYNTHETIC verl console log of about `target_bytes`: a "grpo" run (phases at the
    same fractions of the run as the 200-step default) stretched to as many steps as fit,
    `n_metrics` keys per step line (filler keys beyond the verl ones), and `noise_every`-1
    start-up/tqdm/traceback lines after each step line. Returns (steps, bytes written)."""
    noise = [
        "\x1b[36m(WorkerDict pid=12345)\x1b[0m INFO: synthetic start-up output, shard 3 of 8",
        "Training Progress:  12%|#2        | 120/1000 [10:00<1:13:20,  5.00s/it]",
        "(TaskRunner pid=777) WARNING: synthetic warning about something unrelated",
        '  File "/synthetic/verl/trainer/ppo/ray_trainer.py", line 1, in fit',
    ]
    filler = "\n".join(noise[i % len(noise)] for i in range(noise_every - 1)) + "\n"
    base = synthetic_run("grpo", steps=200, seed=seed)
    width = len(console_line(1, base.iloc[0])) + 30 * (n_metrics - base.shape[1])
    steps = max(200, target_bytes // (width + 40 + len(filler)))
    table = stretched_run(steps, seed)
    rng = np.random.default_rng(seed)
    filler_keys = {f"timing_s/synthetic_{i:02d}": rng.random(steps)
                   for i in range(n_metrics - table.shape[1])}
    table = pd.concat([table, pd.DataFrame(filler_keys, index=table.index)], axis=1)
    keys = [f"{key}:" for key in table.columns]
    values = np.round(table.to_numpy(), 3)
    written = 0
    with open(path, "w", encoding="utf-8") as handle:
        head = "(TaskRunner pid=777) {'trainer': {'experiment_name': 'synthetic-large'}}\n"
        written += handle.write(head)
        for step, row in zip(table.index, values, strict=True):
            pairs = " - ".join(k + f"{v:.3f}" for k, v in zip(keys, row, strict=True)
                               if v == v)  # NaN: validation keys on other steps
            written += handle.write(f"\x1b[36m(TaskRunner pid=777)\x1b[0m step:{step} - "
                                    f"{pairs}\n")
            written += handle.write(filler)
    return steps, written
