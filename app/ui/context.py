"""`Studio`: what every tab's `mount(studio)` reads: the model pool, the retriever, the run
registry, the defaults, the access policy and the shared decoding widgets."""

from __future__ import annotations

from dataclasses import dataclass, field

import gradio as gr

from agent.models import (
    DEFAULT_BASELINE,
    DEFAULT_MODEL,
    has_gpu,
    is_nano,
    label,
    lookup,
    parameter_count,
    registry,
)
from app.ui.access import Access
from app.ui.controls import Decoding, model_picker
from app.ui.examples import load_compare_example, load_examples
from app.ui.model_pool import ModelPool
from app.ui.run_registry import RunRegistry

CORPUS_EXAMPLES = [
    "Who directed 2001: A Space Odyssey?",
    "What is the speed of light?",
    "Who painted the Mona Lisa?",
    "When did the Berlin Wall fall?",
    "Who wrote Pride and Prejudice?",
]


@dataclass
class Studio:
    pool: ModelPool
    retriever: object
    runs: RunRegistry = field(default_factory=RunRegistry)
    default_model: str = DEFAULT_MODEL
    baseline_model: str = DEFAULT_BASELINE
    concurrency: int = 32
    access: Access = field(default_factory=Access)
    compare_pair: tuple[str, str] | None = None  # (A, B); default (baseline, default model)
    decoding: Decoding = field(default_factory=Decoding)

    @property
    def pair(self) -> tuple[str, str]:
        """The Compare tab's two models (A, B)."""
        return self.compare_pair or (self.baseline_model, self.default_model)

    @property
    def nano(self) -> bool:
        """The studio is set up around the nano agents (default model or Compare pair)."""
        return any(is_nano(m) for m in (self.default_model, *(self.compare_pair or ())))

    def model_choices(self) -> list[tuple[str, str]]:
        """The registry's models that are here (a shipped model whose files are missing is
        left out), and the models the operator named; a model this machine can't hold is
        labelled unavailable, with the reason (the pool refuses to load it)."""
        gpu = has_gpu()  # with a GPU the checkpoints run there: no GGUF entries
        choices = [(unavailable_label(m.label, self.pool.hardware_problem(m.id)), m.id)
                   for m in registry() if m.available and not (gpu and m.quantized)]
        named = [self.default_model, self.baseline_model, *(self.compare_pair or ()),
                 *sorted(self.access.named)]
        for extra in dict.fromkeys(reversed(named)):
            if extra not in {c[1] for c in choices}:
                choices.insert(0, (label(extra), extra))
        return choices

    def model_info(self, model: str) -> str:
        """A line on what `model` is (the registry's description), for beside the picker."""
        model = (model or "").strip()
        info = lookup(model)
        if info is None:
            return ""
        count = parameter_count(model)
        size = f"{count / 1e6:.1f}M parameters" if count else (
            f"{info.size} parameters" if info.size else "")
        problem = self.pool.hardware_problem(model)
        warning = f"**Unavailable on this machine:** {problem}.\n\n" if problem else ""
        return (f"{warning}_{' · '.join(p for p in (info.method, size) if p)}_ — "
                f"{info.description}")

    def model_picker(self, value: str, label: str, elem_id: str) -> gr.Dropdown:
        return model_picker(self.model_choices(), value, label, elem_id,
                            restricted=self.access.restricted)

    def nano_examples(self) -> list[str]:
        """Held-out questions the nano agent answers (assets/ask_examples.json) in a nano
        studio; [] otherwise."""
        return load_examples() if self.nano else []

    def first_example(self) -> str:
        """The first question the studio suggests."""
        return (self.nano_examples() or CORPUS_EXAMPLES)[0]

    def compare_example(self) -> str:
        """The Compare tab's starting question: for the pair it was measured on, the stored
        one (assets/compare_example.json: one B answers and A does not, as they really
        do); else the first suggested question."""
        stored = load_compare_example(self.pair)
        return str(stored["question"]) if stored else self.first_example()


def unavailable_label(name: str, problem: str | None) -> str:
    """A picker entry's label: the model's, or marked unavailable with the reason."""
    return f"{name} — unavailable: {problem}" if problem else name


def session_of(request: gr.Request | None) -> str:
    """The browser session a request comes from (its runs are stopped by its Stop button)."""
    return getattr(request, "session_hash", None) or "anonymous"
