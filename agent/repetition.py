"""Degeneration: a turn that has become one short unit written over and over.

A collapsed GRPO model writes `</think> answer answer answer …` until the turn's token
budget runs out (~2,000 tokens over four turns). The published protocol lets it; the studio
may stop such a turn early (`AgentSettings.stop_repeats`) and says so. The evaluator and
`app.infer` never do: their numbers keep the protocol.
"""

from __future__ import annotations

MAX_UNIT = 16  # characters: "answer ", "0", "</answer>" fit; a sentence does not


def repeated_tail(text: str, min_count: int, max_unit: int = MAX_UNIT) -> tuple[str, int] | None:
    """(unit, count) when `text` ends with one unit of 1..max_unit characters, not whitespace
    alone, written at least `min_count` times in a row (the shortest such unit); else None."""
    if min_count < 2:
        raise ValueError(f"min_count is {min_count}: a repeat needs at least 2 units")
    for size in range(1, max_unit + 1):
        if len(text) < size * min_count:
            break
        unit = text[-size:]
        if not unit.strip() or not text.endswith(unit * min_count):
            continue
        start = len(text) - size * min_count
        while start >= size and text[start - size:start] == unit:
            start -= size
        return unit, (len(text) - start) // size
    return None


def describe(unit: str, count: int) -> str:
    """The stop's reason in words, for the transcript and the Compare table."""
    return (f"stopped: `{unit.strip()}` repeated {count} times in a row; the published "
            "protocol would run on to the turn limit")
