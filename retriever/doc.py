"""The one document type every engine, client and front end shares."""

from __future__ import annotations

from dataclasses import dataclass

from agent.protocol import split_title


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
