"""Training-curve analysis: did Lazy Likelihood Displacement set in, and when?

`analyze_uploads` is the one call a UI needs: files in, figures + summary table + messages
out. Nothing it is given can make it raise; per-file problems become messages.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from curves.analysis import SUMMARY_COLUMNS, PhaseRule, RunAnalysis, analyse_run, summary_table
from curves.parse import LogFormatError, ParsedFile
from curves.plots import ROUNDING_NOTE, Panel, build_panels
from curves.runs import TrainingRun, normalise_method
from curves.seeds import BANDS
from curves.sources import read_source

__all__ = ["BANDS", "AnalysisResult", "LogFormatError", "Message", "Panel", "PhaseRule",
           "TrainingRun", "analyze_uploads"]


@dataclass
class Message:
    level: str  # "error" | "warning" | "info"
    text: str
    source: str = ""

    def __str__(self) -> str:
        where = f"{self.source}: " if self.source else ""
        return f"{self.level}: {where}{self.text}"


@dataclass
class AnalysisResult:
    runs: list[TrainingRun]
    analyses: list[RunAnalysis]
    panels: list[Panel]
    summary: pd.DataFrame
    messages: list[Message] = field(default_factory=list)
    rule: PhaseRule = field(default_factory=PhaseRule)

    @property
    def figures(self) -> dict[str, go.Figure]:
        return {panel.id: panel.figure for panel in self.panels}

    @property
    def errors(self) -> list[Message]:
        return [m for m in self.messages if m.level == "error"]


def analyze_uploads(paths: list[str], labels: dict[str, str] | None = None,
                    smoothing: float = 0.6, annotate: bool = True, *,
                    metrics: Sequence[str] = (), rule: PhaseRule | None = None,
                    band: str | None = None,
                    aliases: dict[str, str] | None = None,
                    marked: Sequence[str] | None = None,
                    read: Callable[[str, dict[str, str] | None], ParsedFile] = read_source,
                    ) -> AnalysisResult:
    """Read every file or log folder, analyse every run, build the figures and the summary.

    labels: run name -> "GRPO" | "LLDS", overriding the guess from the name.
    metrics: extra raw keys to plot, one panel each.
    band: "minmax" or "se" draws runs that differ only by seed as a mean with that band.
    aliases: raw column -> recognised key (curves.runs.column_aliases), a visitor's names.
    marked: the runs whose phases and collapse are marked on the plots (None: every run).
    read: how a path is read (`read_source`; the studio's keeps what it read of an upload).
    """
    rule = rule or PhaseRule()
    messages: list[Message] = []
    runs: list[TrainingRun] = []
    for path in paths:
        source = Path(path).name
        try:
            parsed = read(path, aliases)
        except LogFormatError as exc:
            messages.append(Message("error", str(exc), source))
            continue
        except Exception as exc:  # a bug of ours must not take the other files down
            messages.append(Message("error", f"could not be read ({type(exc).__name__}: {exc})",
                                    source))
            continue
        messages.extend(Message("warning", note, source) for note in parsed.notes)
        for run in parsed.runs:
            messages.extend(Message("info", f"{run.name}: {note}", source) for note in run.notes)
        runs.extend(parsed.runs)
    runs = _prefer_exports(runs, messages)
    _apply_labels(runs, labels or {}, messages)
    for run in runs:
        messages.append(Message("info", f"{run.name}: {run.method} ({run.method_reason}); "
                                f"{len(run.table)} steps, {run.table.shape[1]} metrics",
                                Path(run.source).name))
    if any(run.rounded for run in runs):
        messages.append(Message("info", ROUNDING_NOTE))
    if not runs and not messages:
        messages.append(Message("error", "no files were given"))
    analyses = []
    for run in runs:
        try:
            analyses.append(analyse_run(run, rule))
        except Exception as exc:  # keep the plots even if one analysis trips
            messages.append(Message("error", f"{run.name}: analysis failed "
                                    f"({type(exc).__name__}: {exc})", Path(run.source).name))
    missing = [m for m in metrics if not any(m in run.table.columns for run in runs)]
    for key in missing:
        messages.append(Message("warning", f"metric {key!r} is in none of the runs"))
    try:
        panels = build_panels(runs, analyses, smoothing=smoothing, annotate=annotate,
                              marked=marked,
                              extra_metrics=[m for m in metrics if m not in missing], band=band)
    except Exception as exc:
        messages.append(Message("error", f"plotting failed ({type(exc).__name__}: {exc})"))
        panels = []
    summary = summary_table(analyses) if analyses else pd.DataFrame(columns=SUMMARY_COLUMNS)
    return AnalysisResult(runs, analyses, panels, summary, messages, rule)


_HASHED = re.compile(r"[0-9a-f]{16,}")  # a folder named by a hash (Gradio's uploads)


def _prefer_exports(runs: list[TrainingRun], messages: list[Message]) -> list[TrainingRun]:
    """Same run from a console log and a W&B/TensorBoard export: keep the unrounded one.
    Same name from two other files: keep both, made unique with the file name."""
    by_name: dict[str, list[TrainingRun]] = {}
    for run in runs:
        by_name.setdefault(run.name, []).append(run)
    kept: list[TrainingRun] = []
    for name, group in by_name.items():
        exact = [r for r in group if not r.rounded]
        if exact and len(exact) < len(group):
            for dropped in (r for r in group if r.rounded):
                messages.append(Message("info", f"{name}: the console log is not used because "
                                        "an export of the same run has unrounded values",
                                        Path(dropped.source).name))
            group = exact
        if len(group) > 1:
            tails = _distinct_tails([Path(r.source) for r in group])
            if any(_HASHED.fullmatch(part) for tail in tails for part in Path(tail).parts):
                # Uploads (one hashed temp folder each, e.g. two TRL trainer_state.json):
                # the server's paths mean nothing to the visitor; their order does.
                tails = [f"file {i}" for i in range(1, len(group) + 1)]
            for run, where in zip(group, tails, strict=True):
                run.name = f"{name} ({where})"
        kept.extend(group)
    # Keep upload order.
    order = {id(run): i for i, run in enumerate(runs)}
    return sorted(kept, key=lambda run: order[id(run)])


def _distinct_tails(paths: list[Path]) -> list[str]:
    """Each path's shortest tail (file name, then folder/file name, …) that no other path in
    the list shares: runs/grpo/train.log and runs/llds-a/train.log become grpo/train.log and
    llds-a/train.log, however deep the shared names go."""
    def tail(path: Path, depth: int) -> str:
        return "/".join(path.parts[-depth:])

    out = []
    for path in paths:
        depth = 1
        while depth < len(path.parts) and sum(
                tail(other, depth) == tail(path, depth) for other in paths) > 1:
            depth += 1
        out.append(tail(path, depth))
    return out


def _apply_labels(runs: list[TrainingRun], labels: dict[str, str], messages: list[Message]) -> None:
    names = {run.name: run for run in runs}
    for name, label in labels.items():
        try:
            method = normalise_method(label)
        except ValueError as exc:
            messages.append(Message("warning", f"label for {name!r} ignored: {exc}"))
            continue
        run = names.get(name)
        if run is None:
            known = ", ".join(names) or "none"
            messages.append(Message("warning", f"no run named {name!r} to label; runs: {known}"))
            continue
        run.method, run.method_reason = method, "set by the user"
