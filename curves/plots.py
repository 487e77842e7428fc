"""Plotly figures for training curves: one panel per series, all on the same step axis.

Lines are EMA-smoothed (W&B-style weight: 0 = raw, 0.99 = very smooth); the hover shows
the raw value and the raw logger key. Phases found by `analysis` are shaded per run and can
be turned off with `annotate=False`; their labels are short ("run: II @ 100", the details in
the label's hover) and stacked in rows above the plot so that no two print over each other.
The legend sits under the plot, so long run names never squeeze the plot itself. Every
trace is bounded (`curves.downsample`): the smoothing runs over all logged points, then at
most MAX_POINTS real points are drawn.
"""

from __future__ import annotations

import textwrap
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

import pandas as pd
import plotly.graph_objects as go

from curves.analysis import FALLBACK_SERIES, RunAnalysis
from curves.downsample import MAX_POINTS, extreme_indices
from curves.runs import CANONICAL_BY_ID, TrainingRun, resolve_metrics
from curves.seeds import BANDS, mean_band, seed_groups

# Warm colours for GRPO, cool for LLDS, so the two methods read apart when overlaid.
GRPO_COLOURS = ("#d62728", "#ff7f0e", "#8c564b", "#e377c2", "#bcbd22", "#b15928")
LLDS_COLOURS = ("#1f77b4", "#2ca02c", "#17becf", "#9467bd", "#1b9e77", "#386cb0")

MAX_SPIKE_MARKS = 200  # gradient-norm spikes marked per run: the largest ones
ROUNDING_NOTE = ("Values from verl console logs are rounded to 3 decimals, which flattens "
                 "small log-likelihood changes; prefer a W&B export when you have one.")
LIKELIHOOD_NOTE = (
    "How likely the model finds responses, as the mean log-probability per token (under the "
    "model that sampled them). 'pos (A≥0)': responses that scored at least their group's "
    "average (advantage ≥ 0, which includes groups where every response scored the same), not "
    "the same as 'correct'; 'neg (A<0)': responses below their group's average. The fork logs "
    "these for the last slice of each step's batch only, divided by all its response tokens, "
    "so they also move with how many tokens each kind has. The 'per token' series split "
    "above, equal to and below the group's average over the whole step, each divided by its "
    "own tokens; 'anchor set' is a fixed set of right answers of the starting model, "
    "re-scored every few steps (drawn as points)."
)
REF_RATIO_NOTE = (
    "How far the model has moved from the one training started from: per generated token, "
    "its log-probability minus the starting model's (log π − log π_ref), averaged over the "
    "step's responses. 0 = unchanged; above 0, the model finds its own samples likelier than "
    "the starting model did."
)
# Phase labels: a row of text above the plot per stack level. The rows are packed for a
# narrow plot (LABEL_PLOT_PX wide, about a 1000 px window's) with a generous width per
# character, so labels stay apart on any wider plot too.
LABEL_FONT_PX = 10
LABEL_CHAR_PX = 5.5  # measured 4.5 in Chromium's fallback for plotly's font; a margin more
LABEL_ROW_PX = 16
LABEL_PLOT_PX = 520
PHASE_KEY = "II: steady decay, III: accelerated decay"  # of the likelihood
PLOT_PX = 250  # the plotting area's height, whatever sits above or under it
TITLE_PX = 30  # the title's first line and the gap under the title block
TITLE_LINE_PX = 20  # each further line of the title
SUBTITLE_LINE_PX = 15
# Lines are wrapped for a 390 px window, whose figure is about 340 px wide: the title at 15 px
# (about 8 px a character), the subtitle at 11 px, the legend's names at 10 px beside their
# 40 px symbol. Plotly does not wrap text itself; cut text runs off the figure.
TITLE_CHARS, SUBTITLE_CHARS, LEGEND_CHARS = 34, 52, 50
LEGEND_ROW_PX = 22
LEGEND_LINE_PX = 13  # each further line of a wrapped legend name
LEGEND_MAX_PX = 160  # a longer legend scrolls


# A small explicit template: assigning "plotly_white" copies and validates defaults for
# every trace type, which was most of the figure-building time.
_TEMPLATE = go.layout.Template(layout=dict(
    paper_bgcolor="white", plot_bgcolor="white", font=dict(color="#2a3f5f"),
    xaxis=dict(gridcolor="#EBF0F8", zerolinecolor="#EBF0F8", linecolor="#EBF0F8"),
    yaxis=dict(gridcolor="#EBF0F8", zerolinecolor="#EBF0F8", linecolor="#EBF0F8"),
    colorway=list(GRPO_COLOURS + LLDS_COLOURS),
))
TEMPLATE_JSON = _TEMPLATE.to_plotly_json()


@dataclass
class Panel:
    id: str
    title: str
    figure: go.Figure
    note: str = ""


def ema(values: pd.Series, weight: float) -> pd.Series:
    """Exponential moving average over logged points; weight 0 returns the values."""
    if weight <= 0:
        return values
    return values.ewm(alpha=1.0 - min(weight, 0.999), adjust=False).mean()


def run_colours(runs: Sequence[TrainingRun],
                groups: Sequence[tuple[str, Sequence[TrainingRun]]] = ()) -> dict[str, str]:
    """A colour per run; the runs of a seed group drawn as one band share the band's colour,
    so a run's phase label and shading match the line it is drawn in, and the palette is
    spent on what is drawn (twelve runs in three bands wrapped it onto a second band)."""
    first_of = {id(run): members[0] for _, members in groups for run in members}
    colours: dict[str, str] = {}
    counts = {"GRPO": 0, "LLDS": 0}
    for run in runs:
        leader = first_of.get(id(run), run)
        if leader is not run and leader.name in colours:
            colours[run.name] = colours[leader.name]
            continue
        palette = LLDS_COLOURS if run.method == "LLDS" else GRPO_COLOURS
        colours[run.name] = palette[counts.get(run.method, 0) % len(palette)]
        counts[run.method] = counts.get(run.method, 0) + 1
    return colours


def _series_traces(run: TrainingRun, key: str, label: str, colour: str, smoothing: float,
                   dash: str = "solid") -> list[go.Scatter]:
    raw = run.table[key].dropna()
    if raw.empty:
        return []
    steps = raw.index.to_numpy()
    name = f"{run.name} [{run.method}] {label}".strip()
    hover = (f"<b>{name}</b><br>key {key}<br>step %{{x}}<br>smoothed %{{y:.5g}}"
             "<br>raw %{customdata:.5g}<extra></extra>")
    values = raw.to_numpy()
    # A key logged every few steps (an anchor-set evaluation, validation) shows its points.
    mode = "lines+markers" if _is_sparse(raw, run) else "lines"
    traces = []
    if smoothing > 0:
        # The raw curve stays visible but faint, so smoothing never hides a spike.
        kept = extreme_indices(values, MAX_POINTS)
        traces.append(go.Scatter(x=steps[kept], y=values[kept], mode="lines",
                                 name=name + " (raw)",
                                 line=dict(color=colour, width=1, dash=dash), opacity=0.25,
                                 hoverinfo="skip", showlegend=False, legendgroup=run.name))
    smooth = ema(raw, smoothing).to_numpy()
    kept = extreme_indices(smooth, MAX_POINTS)
    traces.append(go.Scatter(x=steps[kept], y=smooth[kept], customdata=values[kept],
                             mode=mode, name=name, line=dict(color=colour, width=2, dash=dash),
                             marker=dict(size=5), hovertemplate=hover, legendgroup=run.name))
    return traces


def _is_sparse(values: pd.Series, run: TrainingRun) -> bool:
    """Logged at under half of the run's steps (and few enough points to mark each)."""
    return len(values) < 0.5 * len(run.table) and len(values) <= MAX_POINTS // 4


def _band_traces(label: str, members: Sequence[TrainingRun], keys: Sequence[str],
                 suffix: str, colour: str, smoothing: float, band: str,
                 dash: str = "solid") -> list[go.Scatter]:
    """The mean over a seed group's runs (each smoothed first) and a filled band."""
    series = [ema(run.table[key].dropna(), smoothing) for run, key in zip(members, keys,
                                                                           strict=True)]
    series = [s for s in series if len(s)]
    if not series:
        return []
    stats = mean_band(series, band)
    kept = extreme_indices(stats["mean"].to_numpy(), MAX_POINTS)
    stats = stats.iloc[kept]
    steps = stats.index.to_numpy()
    name = f"{label} [{members[0].method}] {suffix}".strip()
    sparse = all(_is_sparse(run.table[key].dropna(), run) for run, key in zip(
        members, keys, strict=True))
    band_trace = go.Scatter(
        x=list(steps) + list(steps[::-1]),
        y=list(stats["high"].to_numpy()) + list(stats["low"].to_numpy()[::-1]),
        fill="toself", fillcolor=colour, opacity=0.18, line=dict(width=0), mode="lines",
        name=name, hoverinfo="skip", showlegend=False, legendgroup=label)
    hover = (f"<b>{name}</b><br>step %{{x}}<br>mean %{{y:.5g}} of %{{customdata[0]}} runs"
             f"<br>band ({BANDS[band]}) %{{customdata[1]:.5g}} to %{{customdata[2]:.5g}}"
             "<extra></extra>")
    mean_trace = go.Scatter(
        x=steps, y=stats["mean"].to_numpy(),
        customdata=stats[["n", "low", "high"]].to_numpy(), mode="lines+markers" if sparse
        else "lines", name=name, line=dict(color=colour, width=2, dash=dash),
        marker=dict(size=5), hovertemplate=hover, legendgroup=label)
    return [band_trace, mean_trace]


def wrap(text: str, width: int) -> str:
    """`text` in lines of at most `width` characters (a longer word stays whole), joined by
    plotly's line break."""
    return "<br>".join(line for part in text.split("<br>") for line in textwrap.wrap(
        part, width, break_long_words=False, break_on_hyphens=False)) if text else text


def _lines(text: str) -> int:
    return text.count("<br>") + 1 if text else 0


def _legend_px(names: Sequence[str], plot_px: float = 620.0) -> int:
    """Room for the legend under the plot: its entries (wrapped names) laid in rows across a
    plot about a 1000 px window's width (on a wider plot it takes fewer rows and leaves a
    gap; on a narrower one it scrolls within this room)."""
    rows, used, height, row_lines = 0, plot_px, 0, 1
    for name in names:
        width = 40 + 5.5 * max(len(line) for line in name.split("<br>"))
        if used + width > plot_px:
            height += LEGEND_ROW_PX + (row_lines - 1) * LEGEND_LINE_PX if rows else 0
            rows, used, row_lines = rows + 1, 0.0, 1
        used += width
        row_lines = max(row_lines, _lines(name))
    if not rows:
        return 0
    height += LEGEND_ROW_PX + (row_lines - 1) * LEGEND_LINE_PX
    return min(LEGEND_MAX_PX, height + 8 + LEGEND_ROW_PX)  # and the legend's title


def _layout(title: str, subtitle: str, x_range: tuple[float, float] | None,
            log_y: bool = False, label_rows: int = 0, legend_px: int = 0,
            legend_title: str = "") -> dict:
    title, subtitle = wrap(title, TITLE_CHARS), wrap(subtitle, SUBTITLE_CHARS)
    top = (TITLE_PX + (_lines(title) - 1) * TITLE_LINE_PX
           + _lines(subtitle) * SUBTITLE_LINE_PX + label_rows * LABEL_ROW_PX)
    bottom = 50 + legend_px  # the step axis's numbers and title, then the legend
    return dict(
        # Pinned to the top left, so the rows of phase labels under it never reach the title
        # and the modebar (top right) never covers it.
        title=dict(text=title, font=dict(size=15),
                   subtitle=dict(text=subtitle, font=dict(size=11)) if subtitle else None,
                   xref="container", x=0, xanchor="left", yref="container", y=1.0,
                   yanchor="top", pad=dict(t=10, l=10)),
        template=TEMPLATE_JSON, height=top + PLOT_PX + bottom,
        margin=dict(l=60, r=36, t=top, b=bottom),
        modebar=dict(orientation="v"),  # a column in the right margin, clear of the title
        hovermode="closest",
        # Under the plot, in rows: on the right, names of 60-80 characters took two thirds
        # of a 700 px figure and left the curves 100 px. Held to the figure's bottom and to
        # its room there, so it never reaches up to the step axis.
        legend=dict(font=dict(size=10), orientation="h", xref="container", x=0,
                    xanchor="left", yref="container", y=0, yanchor="bottom",
                    maxheight=max(legend_px, 2 * LEGEND_ROW_PX), tracegroupgap=2,
                    title=dict(text=legend_title, side="top") if legend_title else None),
        # Keeps zoom when the figure is rebuilt (e.g. smoothing changed in the UI).
        uirevision="curves",
        xaxis=dict(title=dict(text="step"), range=list(x_range) if x_range else None),
        yaxis=dict(type="log" if log_y else "linear"),
    )


def _vline(x: float, colour: str, dash: str = "dot", width: int = 1) -> dict:
    return dict(type="line", xref="x", yref="paper", x0=x, x1=x, y0=0, y1=1,
                line=dict(color=colour, dash=dash, width=width))


@dataclass
class Mark:
    """A label for a step of one run: short text on the plot, the details on hover."""

    x: float
    text: str
    hover: str
    colour: str


def place_marks(marks: Sequence[Mark],
                x_range: tuple[float, float] | None) -> tuple[list[dict], int]:
    """Annotations for `marks` in rows above the plot, and how many rows they took.

    Each label starts at its step (or ends there, when it would run past the right edge)
    and goes in the lowest row where it clears every label already there, its width
    estimated for a LABEL_PLOT_PX-wide plot: on one row at a fixed height, the bundled
    runs' nine labels printed over each other.
    """
    if not marks:
        return [], 0
    low, high = x_range or (min(m.x for m in marks), max(m.x for m in marks))
    span = (high - low) or 1.0
    per_px = span / LABEL_PLOT_PX
    rows: list[list[tuple[float, float]]] = []
    annotations = []
    for mark in sorted(marks, key=lambda m: m.x):
        width = (len(mark.text) * LABEL_CHAR_PX + 8) * per_px
        anchor = "left" if mark.x + width <= high or mark.x - width < low else "right"
        start = mark.x if anchor == "left" else mark.x - width
        interval = (start, start + width)
        row = next((i for i, taken in enumerate(rows) if all(
            interval[1] <= a or b <= interval[0] for a, b in taken)), len(rows))
        if row == len(rows):
            rows.append([])
        rows[row].append(interval)
        annotations.append(dict(
            x=mark.x, xref="x", y=1.0, yref="paper", yanchor="bottom", xanchor=anchor,
            yshift=2 + row * LABEL_ROW_PX, showarrow=False, text=mark.text,
            hovertext=mark.hover, font=dict(size=LABEL_FONT_PX, color=mark.colour)))
    return annotations, len(rows)


_PHASE_NAMES = {"II": "steady decay of the likelihood",
                "III": "accelerated decay of the likelihood"}


def _phase_marks(analyses: Sequence[RunAnalysis],
                 colours: dict[str, str]) -> tuple[list[dict], list[Mark]]:
    """Shapes shading phases II and III of each run in the run's colour, and their labels."""
    shapes: list[dict] = []
    marks: list[Mark] = []
    for analysis in analyses:
        colour = colours.get(analysis.run, "#888")
        for label, start, end in analysis.phases():
            if label == "I":
                continue
            shapes.append(dict(type="rect", xref="x", yref="paper", x0=start, x1=end, y0=0,
                               y1=1, fillcolor=colour, opacity=0.07 if label == "II" else 0.16,
                               line=dict(width=0), layer="below"))
            shapes.append(_vline(start, colour))
            series = analysis.phase_series.get(label, "")
            key = series.split(" ", 1)[0]
            # A phase read from a stand-in (entropy, response length, gradient norm) says so
            # on the plot: it is a weaker claim than one read from a likelihood.
            source = f" (from {key})" if series and key != analysis.likelihood_key else ""
            marks.append(Mark(start, f"{analysis.run}: {label} @ {start}{source}",
                              f"{analysis.run}: phase {label} ({_PHASE_NAMES[label]}) from "
                              f"step {start}" + (f", read from {series}" if series else ""),
                              colour))
    return shapes, marks


def _rounded_subtitle(runs: Sequence[TrainingRun], extra: str = "") -> str:
    parts = [extra] if extra else []
    if any(run.rounded for run in runs):
        parts.append("console-log values rounded to 3 decimals")
    return "<br>".join(parts)  # a line each (a 390 px window has room for little more)


def build_panels(runs: Sequence[TrainingRun], analyses: Sequence[RunAnalysis],
                 smoothing: float = 0.6, annotate: bool = True,
                 extra_metrics: Sequence[str] = (), band: str | None = None,
                 marked: Collection[str] | None = None) -> list[Panel]:
    """Figures for the canonical series present in any run, then the user-picked raw keys.

    band: None draws every run; "minmax" or "se" (`curves.seeds.BANDS`) draws each group of
    runs that differ only by seed as its mean with that band, and the other runs as they are.
    marked: the runs whose phases, collapse and spikes are marked (None: every run); with
    many runs overlaid, one run's marks can be read, twenty runs' cannot.
    """
    if not runs:
        return []
    if band is not None and band not in BANDS:
        raise ValueError(f"band must be one of {', '.join(BANDS)}, got {band!r}")
    groups = seed_groups(runs) if band else []
    colours = run_colours(runs, groups)
    group_of = {id(run): (label, members) for label, members in groups for run in members}
    # What each panel draws: single runs, and each seed group where its first run was.
    units: list[tuple[str, list[TrainingRun]]] = []
    for run in runs:
        label, members = group_of.get(id(run), ("", [run]))
        if members[0] is run:
            units.append((label, members))
    by_run = {a.run: a for a in analyses}
    resolved = {run.name: resolve_metrics(run.table.columns) for run in runs}
    starts = [run.table.index.min() for run in runs if len(run.table)]
    ends = [run.table.index.max() for run in runs if len(run.table)]
    x_range = (float(min(starts)), float(max(ends))) if starts else None
    panels: list[Panel] = []

    def add_panel(panel_id: str, title: str, series: list[tuple[str, str, str]],
                  note: str = "", log_y: bool = False, shade: bool = False,
                  marks=None) -> None:
        """series: (metric id or raw key, legend suffix, dash); marks(used runs) returns
        extra (traces, shapes, annotations) drawn only when annotating."""
        traces: list[go.Scatter] = []
        used: list[TrainingRun] = []
        for label, members in units:
            for metric, suffix, dash in series:
                found = [(run, resolved[run.name].get(
                    metric, metric if metric in run.table else None)) for run in members]
                found = [(run, key) for run, key in found if key is not None]
                if not found:
                    continue
                if label:
                    new = _band_traces(label, [r for r, _ in found], [k for _, k in found],
                                       suffix, colours[members[0].name], smoothing, band or "",
                                       dash)
                else:
                    run, key = found[0]
                    new = _series_traces(run, key, suffix, colours[run.name], smoothing, dash)
                if new:
                    traces.extend(new)
                    used.extend(run for run, _ in found if run not in used)
        if not traces:
            return
        shapes: list[dict] = []
        phase_labels: list[Mark] = []
        labels: list[Mark] = []
        if annotate:
            chosen = [r for r in used if marked is None or r.name in marked]
            if shade:
                shapes, phase_labels = _phase_marks(
                    [by_run[r.name] for r in chosen if r.name in by_run], colours)
            if marks is not None:
                more_traces, more_shapes, labels = marks(chosen)
                traces.extend(more_traces)
                shapes += more_shapes
        all_marks = phase_labels + labels
        key = PHASE_KEY if phase_labels else ""
        if marked is not None and len(marked) == 1 and all_marks:
            # One run marked: its name once, in the subtitle, not on every label (at 390 px
            # "collapse/grpo-lr3e-4-seed0: II @ 0" and its "III @ 30" printed over each other).
            (name,) = marked
            all_marks = [replace(m, text=m.text.removeprefix(f"{name}: ")) for m in all_marks]
            key = "<br>".join(p for p in (f"marks: {name}", key) if p)
        annotations, rows = place_marks(all_marks, x_range)
        for trace in traces:  # wrapped, so a 390 px window shows whole names
            if trace.showlegend is not False and trace.name:
                trace.name = wrap(trace.name, LEGEND_CHARS)
        legend = [t.name for t in traces if t.showlegend is not False and t.name]
        # The labels are short ("II @ 100"): the subtitle says what the numerals mean.
        subtitle = _rounded_subtitle(used, key)
        layout = _layout(title, subtitle, x_range, log_y=log_y, label_rows=rows,
                         legend_px=_legend_px(legend),
                         legend_title=f"shaded: {BANDS[band]}" if band and groups else "")
        if annotate:
            layout.update(shapes=shapes, annotations=annotations)
        # One constructor call: validating the figure once is several times faster than
        # building it up with add_trace / update_layout.
        fig = go.Figure(data=traces, layout=layout)
        rounded = ROUNDING_NOTE if any(r.rounded for r in used) else ""
        panels.append(Panel(panel_id, title, fig, " ".join(n for n in (note, rounded) if n)))

    def collapse_marks(used: list[TrainingRun]):
        shapes, labels = [], []
        for run in used:
            a = by_run.get(run.name)
            if a and a.collapse_step is not None:
                colour = colours[run.name]
                step = a.collapse_step
                shapes.append(_vline(step, colour, dash="dash", width=2))
                labels.append(Mark(step, f"{run.name}: collapse @ {step}",
                                   f"{run.name}: collapsed at step {step} ({a.collapse_rule})",
                                   colour))
        return [], shapes, labels

    def spike_marks(used: list[TrainingRun]):
        traces = []
        for run in used:
            a = by_run.get(run.name)
            key = resolved[run.name].get("grad_norm")
            if a and a.grad_spikes and key:
                values = run.table.loc[a.grad_spikes, key]
                if len(values) > MAX_SPIKE_MARKS:  # the largest ones, in step order
                    values = values.nlargest(MAX_SPIKE_MARKS).sort_index()
                traces.append(go.Scatter(
                    x=values.index.to_numpy(), y=values.to_numpy(), mode="markers",
                    marker=dict(symbol="x", size=9, color=colours[run.name]),
                    name=f"{run.name} grad-norm spikes", legendgroup=run.name,
                    hovertemplate="spike at step %{x}: %{y:.4g}<extra></extra>"))
        return traces, [], []

    add_panel("likelihood", "Likelihood (log-prob a token)",
              [("lik_pos", "pos (A≥0)", "solid"), ("lik_neg", "neg (A<0)", "dot"),
               ("disp_pos", "A>0 per token", "dash"), ("disp_zero", "A=0 per token", "longdash"),
               ("disp_neg", "A<0 per token", "dashdot"), ("anchor_logp", "anchor set", "solid")],
              note=LIKELIHOOD_NOTE, shade=True)
    add_panel("ref_log_ratio", "Drift from the starting model",
              [("ref_log_ratio", "", "solid")], note=REF_RATIO_NOTE)
    add_panel("likelihood_ref", "Likelihood under the start model",
              [("lik_pos_ref", "pos (A≥0)", "solid"), ("lik_neg_ref", "neg (A<0)", "dot")],
              note="The same responses as the likelihood panel, scored by the model training "
                   "started from; the same caveats apply.")
    add_panel("reward", "Reward", [("reward", "", "solid")], shade=True, marks=collapse_marks)
    add_panel("grad_norm", "Gradient norm (log scale)", [("grad_norm", "", "solid")],
              log_y=True, shade=True, marks=spike_marks)
    for metric_id in ("entropy", "kl", "ppo_kl", "llds_penalty", "valid_search",
                      "response_length"):
        metric = CANONICAL_BY_ID[metric_id]
        add_panel(metric_id, metric.label[:1].upper() + metric.label[1:],
                  [(metric_id, "", "solid")], log_y=metric.log_y,
                  shade=metric_id in FALLBACK_SERIES)
    val_ids = sorted({m for keys in resolved.values() for m in keys if m.startswith("val:")})
    if val_ids:
        dashes = ("solid", "dot", "dash", "dashdot", "longdash", "longdashdot")
        add_panel("validation", "Validation scores",
                  [(m, m[4:], dashes[i % len(dashes)]) for i, m in enumerate(val_ids)],
                  note="Logged on validation steps only.")
    for key in extra_metrics:
        add_panel(f"metric:{key}", key, [(key, "", "solid")])
    return panels
