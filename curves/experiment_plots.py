"""Two pictures of a collapse experiment, for looking rather than reading: how many runs of
each method still stand at each step (a survival curve), and each run's anchor change by
method (a strip plot). The runs come in as `RunOutcome`s; whoever read them (the nano
experiments' verdict code) decided what a collapse and the anchor change are."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import plotly.graph_objects as go

from curves.plots import GRPO_COLOURS, LLDS_COLOURS, TEMPLATE_JSON

COHORT_DASH = {"confirmatory": "solid", "exploratory": "dot"}
COHORT_SYMBOL = {"confirmatory": "circle", "exploratory": "circle-open"}
PLOT_PX = 300


@dataclass(frozen=True)
class RunOutcome:
    """One ended run: its method ("GRPO", "LLDS-A"), which set it belongs to
    ("exploratory" or "confirmatory"), the step its collapse was called (None: it stood to
    its end) and its anchor change (None: not measured)."""

    name: str
    method: str
    cohort: str
    collapse_at: int | None
    anchor_change: float | None


def colour(method: str) -> str:
    return GRPO_COLOURS[0] if method.upper().startswith("GRPO") else LLDS_COLOURS[0]


def standing(outcomes: Sequence[RunOutcome], step: int) -> int:
    """Runs not collapsed by `step` (a run collapsed at `step` has fallen)."""
    return sum(o.collapse_at is None or o.collapse_at > step for o in outcomes)


def _groups(outcomes: Sequence[RunOutcome]) -> list[tuple[str, str, list[RunOutcome]]]:
    """(cohort, method, runs): confirmatory first, GRPO before LLDS within each."""
    keys = sorted({(o.cohort, o.method) for o in outcomes},
                  key=lambda k: (k[0] != "confirmatory", not k[1].upper().startswith("GRPO"),
                                 k[1]))
    return [(c, m, [o for o in outcomes if (o.cohort, o.method) == (c, m)]) for c, m in keys]


def _layout(figure: go.Figure, title: str, subtitle: str) -> go.Figure:
    figure.update_layout(
        template=TEMPLATE_JSON, height=PLOT_PX + 150,
        title=dict(text=f"{title}<br><sup>{subtitle}</sup>", x=0.01, xanchor="left",
                   font=dict(size=15)),
        margin=dict(l=50, r=40, t=70, b=40),
        legend=dict(orientation="h", y=-0.22, x=0, font=dict(size=10)))
    return figure


def survival_figure(outcomes: Sequence[RunOutcome], end: int) -> go.Figure:
    """The share of each method's runs still standing at each step, 0 to `end`; a line per
    method and set (confirmatory solid, exploratory dotted), its count in the legend."""
    figure = go.Figure()
    steps = list(range(end + 1))
    for cohort, method, runs in _groups(outcomes):
        counts = [standing(runs, s) for s in steps]
        figure.add_trace(go.Scatter(
            x=steps, y=[c / len(runs) for c in counts], mode="lines", line_shape="hv",
            name=f"{method}, {cohort} ({counts[-1]} of {len(runs)} standing)",
            line=dict(color=colour(method), dash=COHORT_DASH.get(cohort, "dash"), width=2),
            customdata=[[c, len(runs)] for c in counts],
            hovertemplate="step %{x}: %{customdata[0]} of %{customdata[1]} standing"
                          f"<extra>{method}, {cohort}</extra>"))
    figure.update_xaxes(title_text="step", range=[0, end])
    figure.update_yaxes(title_text="share standing", range=[-0.03, 1.05], tickformat=".0%")
    return _layout(figure, "Runs standing", "not collapsed, by the collapse rule")


def _jitter(k: int, n: int, width: float = 0.22) -> float:
    """Spread `n` points of one column evenly, deterministic (no random jitter)."""
    return 0.0 if n == 1 else -width + 2 * width * k / (n - 1)


def anchor_figure(outcomes: Sequence[RunOutcome], window: tuple[int, int]) -> go.Figure:
    """Each run's anchor change, a point a run in a column a method and set (filled:
    confirmatory, hollow: exploratory), a line at 0 (no change)."""
    figure = go.Figure()
    columns = [(c, m, [o for o in runs if o.anchor_change is not None])
               for c, m, runs in _groups(outcomes)]
    columns = [col for col in columns if col[2]]
    names = [f"{m}<br>{c}" for c, m, _ in columns]
    for x, (cohort, method, runs) in enumerate(columns):
        figure.add_trace(go.Scatter(
            x=[x + _jitter(k, len(runs)) for k in range(len(runs))],
            y=[o.anchor_change for o in runs], mode="markers",
            name=f"{method}, {cohort} ({len(runs)} run{'s' if len(runs) != 1 else ''})",
            text=[o.name for o in runs],
            marker=dict(color=colour(method), size=9, line=dict(width=1.5,
                                                                 color=colour(method)),
                        symbol=COHORT_SYMBOL.get(cohort, "diamond")),
            hovertemplate="%{text}: %{y:+.2f}<extra></extra>"))
    values = [o.anchor_change for _, _, runs in columns for o in runs]
    low, high = (min(values + [0.0]), max(values + [0.0])) if values else (-1.0, 1.0)
    pad = 0.08 * (high - low or 1.0)
    figure.add_hline(y=0, line=dict(color="#888", width=1, dash="dash"))
    figure.update_xaxes(tickvals=list(range(len(columns))), ticktext=names, tickangle=0,
                        tickfont=dict(size=10), zeroline=False, showgrid=False,
                        range=[-0.6, len(columns) - 0.4])
    figure.update_yaxes(title_text="change (nats/token)",
                        range=[math.floor((low - pad) * 10) / 10,
                               math.ceil((high + pad) * 10) / 10])
    return _layout(figure, "Anchor likelihood change",
                   f"steps {window[0]}-{window[1]} minus step 0; above 0: rose")
