"""`python -m app.infer "question"`: stream the agent's reasoning to the terminal."""

from __future__ import annotations

import argparse
import json
import sys

from agent.backends.base import ModelLoadError
from agent.config import (
    add_agent_flags,
    add_model_flags,
    add_retriever_flags,
    agent_settings,
    make_backend,
    make_retriever,
)
from agent.events import (
    AnswerGiven,
    DocumentsReturned,
    Finished,
    InvalidAction,
    SearchCalled,
    TextDelta,
    TurnStarted,
    event_to_dict,
)
from agent.loop import run_agent


class Style:
    def __init__(self, colour: bool):
        self.colour = colour

    def __call__(self, text: str, code: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.colour else text


def render_terminal(event, style: Style) -> str:
    """How one event reads in a terminal (pure: returns the text to print)."""
    if isinstance(event, TurnStarted):
        # Counted as --max-turns counts: the rounds with search, then the closing one.
        title = ("closing turn, no search" if event.final
                 else f"turn {event.turn}/{event.rounds - 1}")
        return style(f"\n── {title} ──\n", "2")
    if isinstance(event, TextDelta):
        return event.text
    if isinstance(event, SearchCalled):
        return "\n" + style(f"search: {event.query}", "1;36") + "\n"
    if isinstance(event, DocumentsReturned):
        lines = [style(f"   {len(event.docs)} documents in {event.seconds:.2f}s", "2")]
        for i, doc in enumerate(event.docs, 1):
            snippet = doc.text[:160].replace("\n", " ")
            lines.append(style(f"   [{i}] {doc.title}", "36") + f" ({doc.score:.2f}) {snippet}…")
        return "\n".join(lines) + "\n"
    if isinstance(event, InvalidAction):
        return "\n" + style("invalid action: the model is told to try again", "33") + "\n"
    if isinstance(event, AnswerGiven):
        return "\n\n" + style(f"answer: {event.answer}", "1;32") + "\n"
    if isinstance(event, Finished):
        stats = (f"stop={event.stop_reason} turns={event.turns} searches={event.searches} "
                 f"new_tokens={event.new_tokens} seconds={event.seconds:.1f}")
        error = "\n" + style(f"error: {event.error}", "1;31") if event.error else ""
        return error + "\n" + style(stats, "2") + "\n"
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.infer", description=__doc__)
    parser.add_argument("question")
    add_model_flags(parser)
    add_retriever_flags(parser)
    add_agent_flags(parser)
    parser.add_argument("--json", action="store_true", help="print events as JSON lines")
    args = parser.parse_args(argv)
    if not args.question.strip() or len(args.question) > 2000:
        print("error: the question must be 1 to 2,000 characters.", file=sys.stderr)
        return 2
    try:
        backend = make_backend(args)
    except ModelLoadError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    style = Style(sys.stdout.isatty() and not args.json)
    finished = None
    for event in run_agent(args.question, backend, make_retriever(args), agent_settings(args)):
        if args.json:
            print(json.dumps(event_to_dict(event), ensure_ascii=False), flush=True)
        else:
            print(render_terminal(event, style), end="", flush=True)
        finished = event
    return 1 if finished is None or finished.stop_reason == "error" else 0


if __name__ == "__main__":
    sys.exit(main())
