"""Lazy Likelihood Displacement phases, reward collapse and gradient spikes, per run.

The LLDS paper reads three phases off the curves (I stagnation, II steady decay, III
accelerated collapse) but gives no numeric rule, so this module uses one simple rule,
with every threshold in `PhaseRule`:

* Likelihood phases. Cut the logged likelihood of advantage >= 0 responses into straight
  pieces by binary segmentation: split a piece where two least-squares lines fit better
  than one by more than `split_gain` noise variances (noise from second differences), each
  piece at least `min_segment` points, at most `max_pieces` pieces. A piece *declines* when
  its slope is negative by at least `min_drop_z` standard errors and it loses at least
  `min_drop` nats. Steady decay (II) starts where the first declining piece starts, but not
  before the smoothed curve's highest point up to that piece's end (a decline cannot begin
  before the peak it declines from), provided the smoothed curve ends at least `min_drop`
  below that point; accelerated collapse (III) starts where a later piece declines at least
  `accel_ratio` times as fast. Fewer than `min_steps` logged points: no phase is claimed.
* Reward collapse: the first step from which the smoothed reward stays below
  (1 - `reward_drop`) x its running best, for at least `reward_min_steps` points to the end;
  or, when the log ends inside a deep fall (below `reward_deep` x its running best for at
  least `reward_deep_min_steps` points to the end), the first step of that fall, with a note
  saying the call was made on a deep fall near the end of the log.
* Gradient-norm spike: a value above `spike_factor` x the median of the previous
  `spike_window` values.
* Peak / trend: the likelihood smoothed with a centred rolling mean of `smooth_window`
  points; the peak is its maximum.
* A log with an anchor set (`anchor/logp`: a fixed set of correct trajectories re-scored
  every few steps) of at least `min_steps` points is read from it instead: it scores the
  same tokens each time, so it moves with the policy only, while the fork's key is the
  last micro-batch's samples and moves with how hard they were (it tracked the reference
  model's log-prob of the same samples at r 0.89-0.92 in the nano runs of issue 28).
* Plain GRPO logs (Search-R1's own) have no likelihood keys. Then the same piecewise rule
  runs on a stand-in, the first present of `FALLBACK_SERIES`: the entropy, then the
  response length, each rising where the likelihood would fall (in units of its median, so
  `min_drop` is a relative rise). Phase III falls back further on the gradient norm: its
  first spike after the onset of II, or, without II, the last spike before a reward
  collapse. Each phase records the series it was read from (`phase_series`).
* Long runs are analysed on at most `max_points` bin means (consecutive steps averaged),
  so the cost stays bounded whatever the log length; onsets are then bin starts.

The phase rule is one algorithm (piecewise fit, onset refinement, stand-in series, reward
collapse, gradient spikes), followed by the summary table that reports it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd

from curves.runs import TrainingRun, resolve_metrics


@dataclass(frozen=True)
class PhaseRule:
    """Parameters of the phase rule (see the module docstring); defaults are ours, not the
    paper's."""

    min_steps: int = 30
    smooth_window: int = 9
    min_segment: int = 10
    split_gain: float = 16.0
    max_pieces: int = 12
    min_drop_z: float = 5.0
    min_drop: float = 0.02
    accel_ratio: float = 3.0
    reward_drop: float = 0.3
    reward_min_steps: int = 10
    # A fall this deep (to half the best) is a collapse even when the log ends a few points
    # after it: a run whose reward went from 0.9 to 0.03 does not need ten more points.
    reward_deep: float = 0.5
    reward_deep_min_steps: int = 3
    spike_factor: float = 3.0
    spike_window: int = 20
    max_points: int = 2000

    def describe(self) -> str:
        return (", ".join(f"{key}={value}" for key, value in asdict(self).items())
                + "; " + FALLBACK_TEXT)


# Stand-ins for the likelihood of advantage >= 0 responses when a log lacks the LLDS fork's
# keys, in order: a falling likelihood of the model's own samples shows as a rising entropy,
# and as responses running longer. Ours, not the paper's.
FALLBACK_SERIES = ("entropy", "response_length")
FALLBACK_TEXT = ("without actor/pos_avg_old_log_prob, phases II/III come from a rising "
                 "entropy, else a rising response length, and phase III else from the "
                 "gradient norm's first spike after II (without II, its last spike before a "
                 "reward collapse)")


@dataclass
class Piece:
    start: int
    end: int
    slope: float  # nats per step
    z: float  # slope / its standard error
    drop: float  # value lost over the piece (positive = decline)


@dataclass
class RunAnalysis:
    run: str
    method: str
    n_steps: int
    first_step: int | None
    last_step: int | None
    likelihood_key: str | None = None
    likelihood_trend: pd.Series | None = None
    peak_step: int | None = None
    peak_value: float | None = None
    end_value: float | None = None
    segments: list[Piece] = field(default_factory=list)
    decay_onset: int | None = None
    accel_onset: int | None = None
    reward_key: str | None = None
    best_reward: float | None = None
    best_reward_step: int | None = None
    final_reward: float | None = None
    reward_collapse_step: int | None = None  # the reward-only rule (reward_collapse)
    # The page's one collapse: the studio's rule (curves.collapse_rule: reward and validation
    # both under half, held to the end) where the log has a validation score at its first
    # step, else the reward-only rule; `collapse_rule` says which.
    collapse_step: int | None = None
    collapse_rule: str | None = None
    grad_spikes: list[int] = field(default_factory=list)
    phase_series: dict[str, str] = field(default_factory=dict)  # "II"/"III" -> where from
    notes: list[str] = field(default_factory=list)

    @property
    def likelihood_change(self) -> float | None:
        if self.peak_value is None or self.end_value is None:
            return None
        return self.end_value - self.peak_value

    def phases(self) -> list[tuple[str, int, int]]:
        """(label, start step, end step) for each detected phase, for shading."""
        if self.first_step is None or self.last_step is None:
            return []
        if self.decay_onset is None:  # phase III from the gradient norm alone
            return [] if self.accel_onset is None else [("III", self.accel_onset,
                                                         self.last_step)]
        spans = []
        if self.decay_onset > self.first_step:
            spans.append(("I", self.first_step, self.decay_onset))
        decay_end = self.accel_onset if self.accel_onset is not None else self.last_step
        spans.append(("II", self.decay_onset, decay_end))
        if self.accel_onset is not None:
            spans.append(("III", self.accel_onset, self.last_step))
        return spans


def centred_mean(values: pd.Series, window: int) -> pd.Series:
    """Centred rolling mean over logged points (no lag, unlike an EMA)."""
    return values.rolling(window=max(1, window), center=True, min_periods=1).mean()


def noise_sigma(y: np.ndarray) -> float:
    """Noise scale from second differences, which cancel straight trends and (after the
    median) steady curvature: MAD(d2) / (0.6745 * sqrt 6) for white noise."""
    diffs = np.diff(y, n=2)
    if not len(diffs):
        return 0.0
    mad = float(np.median(np.abs(diffs - np.median(diffs))))
    return mad / (0.6745 * np.sqrt(6.0))


def _line_rss(sums: np.ndarray) -> np.ndarray:
    """RSS of a least-squares line from stacked sums (n, Sx, Sy, Sxx, Sxy, Syy)."""
    n, sx, sy, sxx, sxy, syy = sums
    with np.errstate(invalid="ignore", divide="ignore"):
        vxx = sxx - sx * sx / n
        vxy = sxy - sx * sy / n
        vyy = syy - sy * sy / n
        rss = vyy - np.where(vxx > 0, vxy * vxy / vxx, 0.0)
    return np.maximum(rss, 0.0)


def _best_split(x: np.ndarray, y: np.ndarray, min_segment: int) -> tuple[int, float] | None:
    """Index k splitting x[:k] | x[k:] into two lines with the least total RSS, and the gain."""
    n = len(x)
    if n < 2 * min_segment:
        return None
    terms = np.stack([np.ones(n), x, y, x * x, x * y, y * y])
    prefix = np.concatenate([np.zeros((6, 1)), np.cumsum(terms, axis=1)], axis=1)
    total = prefix[:, -1:]
    ks = np.arange(min_segment, n - min_segment + 1)
    left = prefix[:, ks]
    rss = _line_rss(left) + _line_rss(total - left)
    best = int(np.argmin(rss))
    whole = float(_line_rss(total)[0])
    return int(ks[best]), whole - float(rss[best])


def _piece(x: np.ndarray, y: np.ndarray, sigma: float) -> Piece:
    xc = x - x.mean()
    sxx = float(xc @ xc)
    slope = float(xc @ (y - y.mean()) / sxx) if sxx > 0 else 0.0
    se = sigma / np.sqrt(sxx) if sxx > 0 else np.inf
    z = slope / se if se > 0 else (-np.inf if slope < 0 else np.inf if slope > 0 else 0.0)
    return Piece(int(x[0]), int(x[-1]), slope, float(z), -slope * float(x[-1] - x[0]))


def fit_pieces(x: np.ndarray, y: np.ndarray, rule: PhaseRule) -> list[Piece]:
    """Piecewise-linear description of y(x) by binary segmentation.

    Split a piece in two (separate least-squares lines, each at least `min_segment`
    points) wherever that lowers the squared error by more than `split_gain` noise
    variances; repeat on the halves until no split pays or `max_pieces` is reached.
    """
    # A floor on sigma: console values are rounded to 1e-3, and a noiseless synthetic curve
    # must not make every wiggle "significant".
    sigma = max(noise_sigma(y), 5e-4)
    pieces = [(0, len(x))]
    while len(pieces) < rule.max_pieces:
        best: tuple[float, int, int] | None = None
        for number, (lo, hi) in enumerate(pieces):
            split = _best_split(x[lo:hi], y[lo:hi], rule.min_segment)
            if split is not None and split[1] > rule.split_gain * sigma**2:
                if best is None or split[1] > best[0]:
                    best = (split[1], number, lo + split[0])
        if best is None:
            break
        _, number, cut = best
        lo, hi = pieces[number]
        pieces[number:number + 1] = [(lo, cut), (cut, hi)]
    return [_piece(x[lo:hi], y[lo:hi], sigma) for lo, hi in pieces]


def _hinge_joint(x: np.ndarray, y: np.ndarray, min_segment: int) -> int | None:
    """Index of the joint of the best continuous two-line (hinge) fit, or None if too short."""
    n = len(x)
    if n < 2 * min_segment:
        return None
    t = (x - x[0]) / (float(x[-1] - x[0]) or 1.0)
    ks = np.arange(min_segment, n - min_segment + 1)
    rss = np.empty(len(ks))
    chunk = max(1, 2**20 // n)  # candidate joints per pass: ~24 MB of design matrix
    for lo in range(0, len(ks), chunk):
        part = ks[lo:lo + chunk]
        design = np.empty((len(part), n, 3))
        design[:, :, 0] = 1.0
        design[:, :, 1] = t
        design[:, :, 2] = np.maximum(0.0, t[None, :] - t[part][:, None])
        xtx = np.einsum("kni,knj->kij", design, design)
        xty = np.einsum("kni,n->ki", design, y)
        try:
            beta = np.linalg.solve(xtx, xty[..., None])[..., 0]
        except np.linalg.LinAlgError:
            return None
        rss[lo:lo + len(part)] = float(y @ y) - np.einsum("ki,ki->k", beta, xty)
    return int(ks[int(np.argmin(rss))])


def _refine_onset(x: np.ndarray, y: np.ndarray, pieces: list[Piece], k: int,
                  rule: PhaseRule) -> int:
    """Place the onset of piece k with a continuous hinge fit over it and the piece before.

    Binary segmentation fits separate lines, which blurs a gentle knee; a hinge (two lines
    that meet) pins where the slope changes.
    """
    lo_step = pieces[k - 1].start if k > 0 else pieces[0].start
    hi_step = pieces[k].end
    mask = (x >= lo_step) & (x <= hi_step)
    joint = _hinge_joint(x[mask], y[mask], rule.min_segment)
    if joint is None:
        return pieces[k].start
    if k == 0:
        # The run may decline from its first step; only move the onset if the part before
        # the joint is not itself declining.
        sigma = max(noise_sigma(y), 5e-4)
        before = _piece(x[mask][:joint], y[mask][:joint], sigma)
        if _declines(before, rule):
            return pieces[0].start
    return int(x[mask][joint])


def _declines(piece: Piece, rule: PhaseRule) -> bool:
    return piece.slope < 0 and piece.z <= -rule.min_drop_z and piece.drop >= rule.min_drop


def detect_phases(values: pd.Series, rule: PhaseRule) -> tuple[list[Piece], int | None,
                                                               int | None, list[str]]:
    """Return (pieces, steady-decay onset, accelerated-collapse onset, notes)."""
    values = values.dropna()
    if len(values) < rule.min_steps:
        return [], None, None, [
            f"only {len(values)} logged likelihood points; at least {rule.min_steps} are "
            "needed to call phases, so none are claimed"
        ]
    x = values.index.to_numpy(dtype=float)
    y = values.to_numpy(dtype=float)
    pieces = fit_pieces(x, y, rule)
    first = next((k for k, piece in enumerate(pieces) if _declines(piece, rule)), None)
    if first is None:
        return pieces, None, None, [
            f"no decline met the phase-II rule (no stretch of at least {rule.min_segment} "
            f"logged points fell steadily, with a slope {rule.min_drop_z:g} standard errors or "
            f"more below zero, i.e. far beyond the noise, and by at least {rule.min_drop:g} in "
            "all)"
        ]
    decay = _refine_onset(x, y, pieces, first, rule)
    trend = centred_mean(values, rule.smooth_window)
    # A fitted line can start its decline before the curve has peaked (a piece of 10 sparse
    # points spans the rise and the fall), which put an onset at step 0 on a curve that rose
    # to step 40: the decline starts no earlier than the highest point before it ends.
    decay = max(decay, int(trend.loc[:pieces[first].end].idxmax()))
    # "Sustained": the smoothed end of the run is still min_drop below the onset level.
    if float(trend.iloc[-1]) > float(trend.loc[decay]) - rule.min_drop:
        return pieces, None, None, [
            f"the likelihood declined from step {decay} but recovered by the end; "
            "no sustained decay claimed"
        ]
    accel = None
    for k in range(first + 1, len(pieces)):
        piece = pieces[k]
        if _declines(piece, rule) and piece.slope <= rule.accel_ratio * pieces[first].slope:
            accel = max(_refine_onset(x, y, pieces, k, rule), decay)
            break
    notes = [] if accel is not None else [
        "no accelerated decay (phase III) found after the steady decay"
    ]
    return pieces, decay, accel, notes


def _held_to_end(flags: np.ndarray) -> int:
    """How many points at the end of `flags` are True in a row."""
    held = 0
    while held < len(flags) and flags[len(flags) - 1 - held]:
        held += 1
    return held


def reward_collapse(reward: pd.Series, rule: PhaseRule) -> tuple[int | None, str | None]:
    """First step from which the smoothed reward stays `reward_drop` below its running best
    (for `reward_min_steps` points), or, at the end of the log, `reward_deep` of it."""
    smooth = centred_mean(reward.dropna(), rule.smooth_window)
    if len(smooth) < rule.min_steps:
        return None, f"only {len(smooth)} reward points; collapse not judged"
    best = smooth.cummax()
    below = ((smooth < (1.0 - rule.reward_drop) * best) & (best > 0)).to_numpy()
    held = _held_to_end(below)
    if not held:
        return None, None
    if held >= rule.reward_min_steps:
        return int(smooth.index[len(below) - held]), None
    deep = ((smooth < rule.reward_deep * best) & (best > 0)).to_numpy()
    deep_held = _held_to_end(deep)
    if deep_held >= rule.reward_deep_min_steps:
        start = len(deep) - deep_held
        return int(smooth.index[start]), (
            f"reward collapse called on a deep fall near the end of the log: the smoothed "
            f"reward is below {rule.reward_deep:.0%} of its best ({float(best.iloc[start]):.2f})"
            f" over the last {deep_held} points, where the log ends")
    return None, (f"reward is {rule.reward_drop:.0%} below its best over the last {held} "
                  "points only: too soon to call a collapse")


def grad_spikes(grad_norm: pd.Series, rule: PhaseRule) -> list[int]:
    """Steps where the gradient norm exceeds spike_factor x the median of the previous window."""
    grad_norm = grad_norm.dropna()
    baseline = grad_norm.shift(1).rolling(rule.spike_window, min_periods=5).median()
    spikes = grad_norm[(grad_norm > rule.spike_factor * baseline) & (baseline > 0)]
    return [int(step) for step in spikes.index]


def bin_means(values: pd.Series, max_points: int) -> pd.Series:
    """At most `max_points` means of consecutive points, each at its bin's first step."""
    values = values.dropna()
    size = -(-len(values) // max(1, max_points))  # ceiling division
    if size <= 1:
        return values
    groups = np.arange(len(values)) // size
    means = values.groupby(groups).mean()
    means.index = values.index[::size]
    return means


def _signal(table: pd.DataFrame, keys: dict[str, str],
            rule: PhaseRule) -> tuple[str, pd.Series, bool] | None:
    """(raw key, values where a fall means displacement, is the likelihood itself)."""
    if "anchor_logp" in keys:
        anchor = table[keys["anchor_logp"]].dropna()
        if len(anchor) >= rule.min_steps:
            return keys["anchor_logp"], anchor, True
    if "lik_pos" in keys:
        return keys["lik_pos"], table[keys["lik_pos"]].dropna(), True
    for metric_id in FALLBACK_SERIES:
        key = keys.get(metric_id)
        if key is None:
            continue
        values = table[key].dropna()
        if len(values):
            scale = float(np.median(np.abs(values.to_numpy()))) or 1.0
            return key, -values / scale, False
    return None


def _likelihood_findings(result: RunAnalysis, run: TrainingRun, values: pd.Series,
                         rule: PhaseRule) -> None:
    if len(values):
        trend = centred_mean(values, rule.smooth_window)
        result.likelihood_trend = trend
        result.peak_step = int(trend.idxmax())
        result.peak_value = float(trend.max())
        result.end_value = float(trend.iloc[-1])
    if run.rounded and len(values):
        result.notes.append("likelihood read from a console log (rounded to 3 decimals)")


def _phases(result: RunAnalysis, run: TrainingRun, keys: dict[str, str],
            rule: PhaseRule) -> None:
    signal = _signal(run.table, keys, rule)
    if signal is None:
        result.notes.append("no actor/pos_avg_old_log_prob (logged by the LLDS verl fork) "
                            "and no entropy or response length to stand in: likelihood phases "
                            "not detected")
        return
    key, values, is_likelihood = signal
    if is_likelihood:
        result.likelihood_key = key
        _likelihood_findings(result, run, values, rule)
        where = key
    else:
        where = f"{key} (rising; stand-in, no likelihood keys)"
        result.notes.append(f"no actor/pos_avg_old_log_prob (logged by the LLDS verl fork): "
                            f"phases read from {key} instead")
    series = bin_means(values, rule.max_points)
    if len(series) < len(values):
        result.notes.append(f"phases located on {len(series)} bin means of "
                            f"{-(-len(values) // len(series))} steps each")
    pieces, decay, accel, notes = detect_phases(series, rule)
    if not is_likelihood:  # the stand-in was negated: its "decline" is a rise
        notes = [n.replace("likelihood declined", f"{key} rose")
                 .replace("likelihood decline", f"{key} rise").replace("likelihood", key)
                 for n in notes]
    result.segments, result.decay_onset, result.accel_onset = pieces, decay, accel
    result.notes.extend(notes)
    if decay is not None:
        result.phase_series["II"] = where
    if accel is not None:
        result.phase_series["III"] = where


def _phase_three_from_spikes(result: RunAnalysis, grad_key: str) -> None:
    """Without the likelihood, a gradient-norm spike marks phase III (the paper's III:
    sharp drop, gradient-norm spike, then the reward falls)."""
    if result.decay_onset is not None:
        after = [step for step in result.grad_spikes if step > result.decay_onset]
        if after:
            result.accel_onset = after[0]
            result.phase_series["III"] = f"{grad_key} (first spike after II)"
    elif result.reward_collapse_step is not None:
        before = [step for step in result.grad_spikes if step <= result.reward_collapse_step]
        if before:
            result.accel_onset = before[-1]
            result.phase_series["III"] = (f"{grad_key} (last spike before the reward "
                                          "collapse)")


def analyse_run(run: TrainingRun, rule: PhaseRule | None = None) -> RunAnalysis:
    """All per-run findings; every claim not supported by the data is left None with a note."""
    rule = rule or PhaseRule()
    table = run.table
    keys = resolve_metrics(table.columns)
    steps = table.index
    result = RunAnalysis(run=run.name, method=run.method, n_steps=len(steps),
                         first_step=int(steps.min()) if len(steps) else None,
                         last_step=int(steps.max()) if len(steps) else None)
    _phases(result, run, keys, rule)
    reward_key = keys.get("reward")
    if reward_key is None:
        result.notes.append("no reward key (critic/score/mean): reward collapse not judged")
    else:
        reward = table[reward_key].dropna()
        result.reward_key = reward_key
        if len(reward):
            smooth = centred_mean(reward, rule.smooth_window)
            result.best_reward = float(smooth.max())
            result.best_reward_step = int(smooth.idxmax())
            result.final_reward = float(reward.iloc[-5:].mean())
            result.reward_collapse_step, note = reward_collapse(reward, rule)
            if note:
                result.notes.append(note)
            _collapse(result, table, reward_key, keys)
    grad_key = keys.get("grad_norm")
    if grad_key is not None:
        result.grad_spikes = grad_spikes(table[grad_key], rule)
        if result.likelihood_key is None and result.accel_onset is None:
            _phase_three_from_spikes(result, grad_key)
    return result


VALIDATED_RULE = "reward and validation both under half, held"
REWARD_ONLY_RULE = "reward-only rule (no validation at the log's start)"


def _collapse(result: RunAnalysis, table: pd.DataFrame, reward_key: str,
              keys: dict[str, str]) -> None:
    """The run's one collapse step: the studio's rule where it can be read, else the
    reward-only rule's call."""
    from curves.collapse_rule import collapse_step

    val_key = next((raw for found, raw in keys.items() if found.startswith("val:")), None)
    first = table.index.min() if len(table) else None
    if val_key is not None and first is not None and pd.notna(table.at[first, val_key]):
        rows = [{"step": int(step), **({"r": float(r)} if pd.notna(r) else {}),
                 **({"val/test_score/v": float(v)} if pd.notna(v) else {})}
                for step, r, v in zip(table.index, table[reward_key], table[val_key],
                                      strict=True)]
        result.collapse_step, result.collapse_rule = collapse_step(rows, "r")[0], VALIDATED_RULE
    else:
        result.collapse_step, result.collapse_rule = result.reward_collapse_step, \
            REWARD_ONLY_RULE


def phase_sources(analysis: RunAnalysis) -> str:
    """'II: key; III: key (...)' for the phases found, '' when none."""
    return "; ".join(f"{label}: {where}" for label, where in analysis.phase_series.items())


SUMMARY_COLUMNS = [
    "run", "method", "steps", "step range", "best reward (smoothed)", "best reward step",
    "final reward (last 5 mean)", "likelihood peak step", "likelihood change peak→end",
    "steady decay onset (II)", "accelerated decay onset (III)", "first grad-norm spike",
    "collapse step", "collapsed", "collapse rule", "phases from", "notes",
]


def summary_table(analyses: list[RunAnalysis]) -> pd.DataFrame:
    """One row per run; missing findings are empty (None), never guessed."""
    rows = []
    for a in analyses:
        change = a.likelihood_change
        rows.append({
            "run": a.run,
            "method": a.method,
            "steps": a.n_steps,
            "step range": f"{a.first_step}-{a.last_step}" if a.n_steps else "",
            "best reward (smoothed)": _round(a.best_reward),
            "best reward step": a.best_reward_step,
            "final reward (last 5 mean)": _round(a.final_reward),
            "likelihood peak step": a.peak_step,
            "likelihood change peak→end": _round(change),
            "steady decay onset (II)": a.decay_onset,
            "accelerated decay onset (III)": a.accel_onset,
            "first grad-norm spike": a.grad_spikes[0] if a.grad_spikes else None,
            "collapse step": a.collapse_step,
            "collapsed": ("yes" if a.collapse_step is not None
                          else "no" if a.reward_key else "unknown"),
            "collapse rule": a.collapse_rule,
            "phases from": phase_sources(a),
            "notes": "; ".join(a.notes),
        })
    table = pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
    # Nullable integers, so a missing onset shows as <NA> instead of turning steps into floats.
    for column in _STEP_COLUMNS:
        table[column] = table[column].astype("Int64")
    return table


_STEP_COLUMNS = ("steps", "best reward step", "likelihood peak step", "steady decay onset (II)",
                 "accelerated decay onset (III)", "first grad-norm spike",
                 "collapse step")


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)
