"""Runs of one method that differ only by seed, and their mean with a band.

Runs belong together when their names are the same but for a seed token (`grpo-seed0`,
`grpo_seed1`, `grpo-seed=2`), or, for runs without one in the name, when their logged
configs (`TrainingRun.params`) are equal but for the seed and the run's name. A group of two
or more is drawn as the mean over its runs with a band: `minmax` (the lowest to the highest
run) or `se` (mean ± one standard error, sample std / sqrt(n)).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import pandas as pd

from curves.runs import TrainingRun

BANDS = {"minmax": "min-max over seeds", "se": "mean ± 1 standard error over seeds"}

_SEED_RE = re.compile(r"[-_.]?seed[-_=]?\d+", re.IGNORECASE)
# Config keys that name a run rather than configure it.
_NAME_PARAMS = frozenset({"name", "run_name", "experiment_name", "trainer.experiment_name"})


def _is_seed_param(key: str) -> bool:
    return key.lower() == "seed" or key.lower().endswith((".seed", "/seed"))


def _group_key(run: TrainingRun) -> tuple | None:
    if _SEED_RE.search(run.name):
        return ("name", run.method, _SEED_RE.sub("", run.name).strip("-_. "))
    if any(_is_seed_param(key) for key in run.params):
        rest = frozenset((k, v) for k, v in run.params.items()
                         if not _is_seed_param(k) and k not in _NAME_PARAMS)
        return ("params", run.method, rest)
    return None


def _group_label(key: tuple, members: list[TrainingRun]) -> str:
    if key[0] == "name" and key[2]:
        base = key[2]
    else:
        names = [run.name for run in members]
        prefix = names[0]
        for name in names[1:]:
            while not name.startswith(prefix):
                prefix = prefix[:-1]
        base = prefix.strip("-_. ") or members[0].method
    return f"{base} (mean of {len(members)} seeds)"


def seed_groups(runs: Sequence[TrainingRun]) -> list[tuple[str, list[TrainingRun]]]:
    """(label, runs) for every set of two or more runs that differ only by seed, in the
    order their first run comes."""
    grouped: dict[tuple, list[TrainingRun]] = {}
    for run in runs:
        key = _group_key(run)
        if key is not None:
            grouped.setdefault(key, []).append(run)
    return [(_group_label(key, members), members)
            for key, members in grouped.items() if len(members) > 1]


def mean_band(series: Sequence[pd.Series], band: str) -> pd.DataFrame:
    """Per step over the union of the series' steps: `mean`, `low`, `high` and `n` (how many
    series have a value there). `band` is a key of BANDS; where one series has the step, the
    band is that value."""
    if band not in BANDS:
        raise ValueError(f"band must be one of {', '.join(BANDS)}, got {band!r}")
    frame = pd.concat([s.dropna() for s in series], axis=1, sort=True)
    values = frame.to_numpy(dtype="float64")
    n = np.sum(~np.isnan(values), axis=1)
    keep = n > 0
    values, n, steps = values[keep], n[keep], frame.index[keep]
    mean = np.nanmean(values, axis=1)
    if band == "minmax":
        low, high = np.nanmin(values, axis=1), np.nanmax(values, axis=1)
    else:
        spread = np.zeros_like(mean)
        several = n > 1
        spread[several] = np.nanstd(values[several], axis=1, ddof=1) / np.sqrt(n[several])
        low, high = mean - spread, mean + spread
    return pd.DataFrame({"mean": mean, "low": low, "high": high, "n": n}, index=steps)
