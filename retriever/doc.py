"""The one document type every engine, client and front end shares, and the wiki-18 format.

A wiki-18 `contents` string is `"Title"\ntext`. `render_documents` is how Search-R1 shows
retrieved documents to the model; the agent's protocol (`agent.protocol`) uses it from here,
so the format is written once and this package imports nothing from the agent.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


def split_title(contents: str) -> tuple[str, str]:
    """Split wiki-18 `contents` into (title line, rest). The title keeps its quotes."""
    title, _, text = contents.partition("\n")
    return title, text


def render_documents(contents: Iterable[str]) -> str:
    """Documents as the model saw them in training: `Doc {i}(Title: {title}) {text}\\n`."""
    parts = []
    for i, doc in enumerate(contents, start=1):
        title, text = split_title(doc)
        parts.append(f"Doc {i}(Title: {title}) {text}\n")
    return "".join(parts)


@dataclass(frozen=True)
class Doc:
    """A retrieved passage in the wiki-18 format: `contents` is `"Title"\\ntext`."""

    id: str
    contents: str
    score: float = 0.0

    @property
    def title(self) -> str:
        """The first line without its quotes (the rendered prompt keeps them)."""
        return split_title(self.contents)[0].strip().strip('"')

    @property
    def text(self) -> str:
        return split_title(self.contents)[1]

    def document(self) -> dict:
        """The `document` object of the Search-R1 `/retrieve` answer."""
        return {"id": self.id, "contents": self.contents}

    def to_dict(self) -> dict:
        return {"id": self.id, "title": self.title, "text": self.text,
                "contents": self.contents, "score": self.score}
