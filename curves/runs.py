"""Runs and the metrics we know how to read from them.

A `TrainingRun` is one training run: a name, a method label (GRPO or LLDS) and a step x metric table
whose columns keep the raw logger keys. `CANONICAL` maps the verl / LLDS-fork keys onto the
series the analysis and the plots speak about; anything else stays plottable by raw key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pandas as pd

METHODS = ("GRPO", "LLDS")

# Formats whose numbers were printed by verl's console logger, which rounds to 3 decimals.
ROUNDED_FORMATS = frozenset({"verl-console"})


# eq=False: two runs are the same run only if they are the same object (comparing their
# tables element-wise is neither meaningful nor possible).
@dataclass(eq=False)
class TrainingRun:
    """One training run. `table` is indexed by integer step; columns are raw metric keys."""

    name: str
    table: pd.DataFrame
    source: str
    source_format: str
    method: str = "GRPO"
    method_reason: str = ""
    notes: list[str] = field(default_factory=list)
    # The run's configuration where the log records one (W&B config, MLflow params),
    # flattened to dotted keys.
    params: dict[str, str] = field(default_factory=dict)

    @property
    def rounded(self) -> bool:
        """True when values went through verl's 3-decimal console rounding."""
        return self.source_format in ROUNDED_FORMATS

    @property
    def steps(self) -> pd.Index:
        return self.table.index


def make_run(name: str, table: pd.DataFrame, source: str, source_format: str,
             notes: list[str] | None = None,
             params: dict[str, str] | None = None) -> TrainingRun:
    """Build a TrainingRun with a sorted float table and a guessed method label."""
    table = table.sort_index()
    table.index = table.index.astype("int64")
    table.index.name = "step"
    table = table.astype("float64")
    method, reason = guess_method(name, table)
    return TrainingRun(name=name, table=table, source=source, source_format=source_format,
               method=method, method_reason=reason, notes=list(notes or []),
               params=dict(params or {}))


# `lambda0.2`, `lambda_0.2`, `lambda=0.2`, `lam0.2` in run names: the LLDS weight.
_LAMBDA_RE = re.compile(r"(?:lambda|lam)[_=\-]?(\d+(?:\.\d+)?(?:e-?\d+)?)", re.IGNORECASE)
_LLDS_WORD_RE = re.compile(r"llds|noreduce", re.IGNORECASE)


def guess_method(name: str, table: pd.DataFrame | None = None) -> tuple[str, str]:
    """Guess GRPO or LLDS from a run name, returning (method, why).

    An explicit lambda in the name decides (0 = plain GRPO, > 0 = LLDS), because the LLDS
    fork with lambda 0 *is* GRPO. Otherwise `llds` / `noreduce` in the name means LLDS.
    Failing both, a logged `actor/loss_noreduce_coef` above 0 means LLDS; else GRPO.
    """
    match = _LAMBDA_RE.search(name)
    if match:
        value = float(match.group(1))
        if value > 0:
            return "LLDS", f"name has {match.group(0)!r}"
        return "GRPO", f"name has {match.group(0)!r} (no LLDS penalty)"
    match = _LLDS_WORD_RE.search(name)
    if match:
        return "LLDS", f"name has {match.group(0)!r}"
    if table is not None and "actor/loss_noreduce_coef" in table.columns:
        coef = table["actor/loss_noreduce_coef"].dropna()
        if len(coef) and float(coef.max()) > 0:
            return "LLDS", f"actor/loss_noreduce_coef = {float(coef.max()):g}"
    return "GRPO", "no LLDS marker in the name"


def normalise_method(label: str) -> str:
    """'llds' -> 'LLDS'; raises ValueError for anything but GRPO/LLDS."""
    upper = label.strip().upper()
    if upper not in METHODS:
        raise ValueError(f"method must be GRPO or LLDS, got {label!r}")
    return upper


@dataclass(frozen=True)
class Metric:
    """A canonical series: what it is called on screen and which raw keys supply it."""

    id: str
    label: str
    keys: tuple[str, ...]
    caveat: str = ""
    log_y: bool = False


_LIK_CAVEAT = (
    "mean token log-likelihood under the behaviour policy; 'pos' = advantage >= 0 "
    "(includes all-equal groups), not 'correct'; divided by all response tokens, so it also "
    "moves with the share of such tokens; last micro-batch only"
)

_DISP_CAVEAT = (
    "mean per-token log-prob under the behaviour policy over every micro-batch of the step, "
    "each class divided by its own tokens (so it does not move with the class's share)"
)

CANONICAL: tuple[Metric, ...] = (
    Metric("lik_pos", "log-lik., advantage >= 0 responses", ("actor/pos_avg_old_log_prob",),
           _LIK_CAVEAT),
    Metric("lik_neg", "log-lik., advantage < 0 responses", ("actor/neg_avg_old_log_prob",),
           _LIK_CAVEAT.replace("'pos' = advantage >= 0 (includes all-equal groups), not "
                               "'correct'", "'neg' = advantage < 0, not 'wrong'")),
    Metric("lik_pos_ref", "ref-policy log-lik., advantage >= 0", ("actor/pos_avg_ref_log_prob",),
           "same masking as above, under the frozen reference policy"),
    Metric("lik_neg_ref", "ref-policy log-lik., advantage < 0", ("actor/neg_avg_ref_log_prob",),
           "same masking as above, under the frozen reference policy"),
    Metric("disp_pos", "log-prob, advantage > 0 responses", ("displacement/pos_logp",),
           _DISP_CAVEAT),
    Metric("disp_zero", "log-prob, advantage = 0 responses", ("displacement/zero_logp",),
           _DISP_CAVEAT),
    Metric("disp_neg", "log-prob, advantage < 0 responses", ("displacement/neg_logp",),
           _DISP_CAVEAT),
    Metric("anchor_logp", "log-lik. of the fixed anchor set", ("anchor/logp",),
           "mean per-token log-likelihood of a fixed set of correct trajectories under the "
           "current policy; logged every few steps only"),
    Metric("ref_log_ratio", "log π − log π_ref (per token)", ("displacement/ref_log_ratio",),
           "mean over every generated token of the step, old policy minus reference policy"),
    # verl's names first, then TRL's GRPOTrainer's (`reward`, `kl`, `entropy`,
    # `completions/mean_length`, older `completion_length`), then plain ones other trainers
    # write. Each may also come with the `train/` prefix the HF Trainer adds in W&B and
    # TensorBoard (`train/reward`).
    Metric("reward", "reward (mean score)", ("critic/score/mean", "critic/rewards/mean",
                                             "reward", "rewards", "score")),
    Metric("grad_norm", "gradient norm", ("actor/grad_norm", "grad_norm"), log_y=True),
    Metric("entropy", "entropy", ("actor/entropy", "actor/entropy_loss", "entropy")),
    Metric("kl", "KL to reference", ("actor/kl_loss", "actor/kl", "kl")),
    Metric("ppo_kl", "PPO KL (old -> new policy)", ("actor/ppo_kl",)),
    Metric("llds_penalty", "LLDS penalty", ("actor/loss_noreduce",)),
    Metric("valid_search", "valid searches per response", ("env/number_of_valid_search",)),
    Metric("response_length", "response length (tokens)",
           ("response_length/mean", "completions/mean_length", "completion_length",
            "response_length")),
)
TRAIN_PREFIX = "train/"  # the HF Trainer's prefix for training metrics in W&B / TensorBoard


def column_aliases(spec: str) -> dict[str, str]:
    """A visitor's own names, "reward=my_score, kl=kl_div" (what it is = the column), as
    raw column -> the key the reader recognises for it; ValueError says what was wrong."""
    aliases: dict[str, str] = {}
    for part in (p.strip() for p in spec.replace(";", ",").split(",")):
        if not part:
            continue
        what, sep, column = (x.strip() for x in part.partition("="))
        if not sep or not what or not column:
            raise ValueError(f"{part!r} is not metric=column (e.g. reward=my_score)")
        if what not in CANONICAL_BY_ID:
            raise ValueError(f"{what!r} is not a metric we plot; use one of "
                             + ", ".join(CANONICAL_BY_ID))
        aliases[column] = CANONICAL_BY_ID[what].keys[0]
    return aliases


def known_names() -> str:
    """Every metric name the reader recognises, for a visitor: `key` (what it plots as)."""
    return "; ".join(f"{m.label}: " + ", ".join(f"`{k}`" for k in m.keys) for m in CANONICAL)

CANONICAL_BY_ID = {m.id: m for m in CANONICAL}

# val/test_score/nq, val-core/nq/acc/mean@1, val-core/nq/reward/mean@1 ...
_VAL_RE = re.compile(r"^val(?:-core)?/(?:test_score/)?([^/]+)(?:/(.+))?$")


def resolve_metrics(columns: list[str] | pd.Index) -> dict[str, str]:
    """Map canonical id -> raw key present in `columns` (first listed key wins).

    Validation scores become ids `val:<dataset>`; for `val-core` keys the first
    `mean@1`-style key per dataset is used when several exist.
    """
    present = set(columns)
    found: dict[str, str] = {}
    for metric in CANONICAL:
        for key in metric.keys:
            hit = next((k for k in (key, TRAIN_PREFIX + key) if k in present), None)
            if hit is not None:
                found[metric.id] = hit
                break
    for key in sorted(present):
        dataset = validation_dataset(key)
        if dataset is not None:
            found.setdefault(f"val:{dataset}", key)
    return found


def validation_dataset(key: str) -> str | None:
    """'val/test_score/nq' -> 'nq'; None for keys that are not validation scores."""
    match = _VAL_RE.match(key)
    if not match:
        return None
    dataset, rest = match.group(1), match.group(2)
    if key.startswith("val/") and not key.startswith("val/test_score/"):
        return None
    if key.startswith("val-core/") and rest is not None and "mean" not in rest:
        return None
    return dataset


def recognised_keys(columns: list[str] | pd.Index) -> list[str]:
    """Raw keys in `columns` that map to a canonical series."""
    return sorted(set(resolve_metrics(columns).values()))
