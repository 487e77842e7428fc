"""A finished run as files: JSON lines of its events and a readable Markdown record.

Pure text builders (`trace_jsonl`, `trace_markdown`), and `write_exports`, which puts both
in a fresh temporary folder for the Ask tab's download box; `remove_exports` deletes that
folder once Gradio has copied the files into its own cache.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from agent.events import (
    AnswerGiven,
    DocumentsReturned,
    Event,
    Finished,
    InvalidAction,
    TextDelta,
    TurnStarted,
    event_to_dict,
)
from agent.loop import AgentSettings
from app.ui.model_pool import ModelStatus

EXPORT_PREFIX = "llds-trace-"


def settings_summary(settings: AgentSettings) -> dict:
    """The settings a reader of a trace needs, in words."""
    sampling = ("greedy" if settings.greedy
                else f"temperature {settings.temperature:g}, top-p {settings.top_p:g}")
    return {"decoding": sampling, "max_turns": settings.max_turns, "topk": settings.topk,
            "max_new_tokens": settings.max_new_tokens}


def coalesce(events: Iterable[Event | ModelStatus]) -> list[Event]:
    """Agent events with consecutive TextDeltas merged (one per turn, not one per token)."""
    merged: list[Event] = []
    for event in events:
        if isinstance(event, ModelStatus):
            continue
        if isinstance(event, TextDelta) and merged and isinstance(merged[-1], TextDelta):
            merged[-1] = TextDelta(merged[-1].text + event.text)
        else:
            merged.append(event)
    return merged


def trace_jsonl(events: Iterable[Event | ModelStatus], header: dict | None = None) -> str:
    """The trace as JSON lines of `event_to_dict`, after a header line when one is given."""
    lines = [json.dumps({"event": "Run", **header}, ensure_ascii=False)] if header else []
    lines += [json.dumps(event_to_dict(e), ensure_ascii=False) for e in coalesce(events)]
    return "\n".join(lines) + "\n"


def trace_markdown(question: str, model: str, events: Iterable[Event | ModelStatus],
                   settings: dict | None = None) -> str:
    """A readable record of one run: question, model, each step, the answer, the raw text."""
    events = coalesce(events)
    out = [f"# {question.strip()}", "", f"- Model: `{model}`"]
    if settings:
        out.append("- Settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()))
    finished = next((e for e in events if isinstance(e, Finished)), None)
    if finished is not None:
        out.append(f"- Stop reason: {finished.stop_reason}; turns {finished.turns}, searches "
                   f"{finished.searches}, new tokens {finished.new_tokens}, "
                   f"{finished.seconds:.2f} s")
    out.append("")
    for event in events:
        if isinstance(event, TurnStarted):
            closing = " (closing round, no retrieval)" if event.final else ""
            out += [f"## Turn {event.turn} of {event.rounds}{closing}", ""]
        elif isinstance(event, TextDelta):
            out += ["```text", event.text.strip(), "```", ""]
        elif isinstance(event, DocumentsReturned):
            out += [f"**Search:** {event.query} ({event.seconds:.2f} s)", ""]
            for i, doc in enumerate(event.docs, 1):
                out.append(f"{i}. **{doc.title}** (score {doc.score:.2f}): {doc.text.strip()}")
            out.append("")
        elif isinstance(event, InvalidAction):
            out += ["_Invalid action: no search or answer in this turn._", ""]
        elif isinstance(event, AnswerGiven):
            out += [f"**Answer:** {event.answer}", ""]
        elif isinstance(event, Finished):
            if event.error:
                out += [f"**Error:** {event.error}", ""]
            out += ["## Raw text (what the model saw)", "", "````text", event.trajectory,
                    "````", ""]
    return "\n".join(out)


def write_files(texts: dict[str, str]) -> list[str]:
    """Each name -> text as a file in a new temporary folder (for a download box; the
    handler removes the folder with `remove_exports` once Gradio has copied the files)."""
    folder = Path(tempfile.mkdtemp(prefix=EXPORT_PREFIX))
    for name, text in texts.items():
        (folder / name).write_text(text, encoding="utf-8")
    return [str(folder / name) for name in texts]


def write_exports(question: str, model: str, events: Iterable[Event | ModelStatus],
                  settings: AgentSettings) -> list[str]:
    """The trace as `trace-<time>.jsonl` and `trace-<time>.md` in a new temporary folder."""
    events = list(events)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    summary = settings_summary(settings)
    return write_files({
        f"trace-{stamp}.jsonl": trace_jsonl(events, {"question": question, "model": model,
                                                     "settings": summary}),
        f"trace-{stamp}.md": trace_markdown(question, model, events, summary)})


def remove_exports(paths: Iterable[str]) -> None:
    """Delete the folders `write_exports` made for `paths` (and nothing else: a folder that
    is not one of ours is left alone)."""
    for folder in {Path(p).parent for p in paths}:
        if folder.name.startswith(EXPORT_PREFIX) and folder.parent == Path(
                tempfile.gettempdir()):
            shutil.rmtree(folder, ignore_errors=True)
