"""The studio: `build_app(backend_factory, retriever)` puts the tabs together.

Each tab lives in its own module (`ask_tab`, `compare_tab`, `curves_tab`, `evaluate_tab`)
and gets the `Studio`: the model pool, the retriever, the run registry and the defaults.
`build_app` takes the backend factory and the retriever, so tests inject a scripted backend
and a real in-process retriever.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import gradio as gr

from agent.models import DEFAULT_BASELINE, DEFAULT_MODEL, label, lookup, registry
from app.ui.access import Access
from app.ui.model_pool import BackendFactory, ModelPool
from app.ui.run_registry import RunRegistry

MAX_FILE_SIZE = "200mb"  # uploads (training logs); passed to launch()
EXPORT_CACHE_LIFETIME = (3600, 86400)  # Gradio's delete_cache: (every s, older than s)


@dataclass
class Studio:
    """What a tab needs from the app; extra tabs (`build_app(extra_tabs=...)`) get this."""

    pool: ModelPool
    retriever: object
    runs: RunRegistry = field(default_factory=RunRegistry)
    default_model: str = DEFAULT_MODEL
    baseline_model: str = DEFAULT_BASELINE
    concurrency: int = 4
    access: Access = field(default_factory=Access)
    compare_pair: tuple[str, str] | None = None  # (A, B); default (baseline, default model)

    def model_choices(self) -> list[tuple[str, str]]:
        """The registry's models that are here (a shipped model whose files are missing is
        left out), and the models the operator named."""
        choices = [(m.label, m.id) for m in registry() if m.available]
        named = [self.default_model, self.baseline_model, *(self.compare_pair or ()),
                 *sorted(self.access.named)]
        for extra in dict.fromkeys(reversed(named)):
            if extra not in {c[1] for c in choices}:
                choices.insert(0, (label(extra), extra))
        return choices

    def model_info(self, model: str) -> str:
        """A line on what `model` is (the registry's description), for beside the picker."""
        info = lookup((model or "").strip())
        if info is None:
            return ""
        return f"_{info.method} · {info.size or '?'}_ — {info.description}"


def session_of(request: gr.Request | None) -> str:
    """The browser session a request comes from (its runs are stopped by its Stop button)."""
    return getattr(request, "session_hash", None) or "anonymous"


def build_app(backend_factory: BackendFactory, retriever, *,
              default_model: str = DEFAULT_MODEL, baseline_model: str = DEFAULT_BASELINE,
              concurrency: int = 4, per_model: int = 1, max_loaded: int = 2,
              extra_tabs: Sequence[Callable[[Studio], None]] = (),
              pool: ModelPool | None = None, access: Access | None = None,
              compare_pair: tuple[str, str] | None = None) -> gr.Blocks:
    """The studio as a gr.Blocks, queue configured; call `.launch(**launch_options())`.

    extra_tabs: functions called inside the tab strip, after Compare, each given the
    `Studio` (model pool, retriever, defaults) so it can add its own `gr.Tab`.
    access: what visitors may load (`Access.for_launch`); the pool refuses the rest.
    compare_pair: the Compare tab's (A, B); default (baseline_model, default_model).
    """
    from app.ui.ask_tab import ask_tab
    from app.ui.compare_tab import compare_tab
    from app.ui.curves_tab import curves_tab

    access = access or Access()
    pool = pool or ModelPool(backend_factory, per_model, max_loaded)
    pool.check = access.model_problem
    studio = Studio(pool=pool, retriever=retriever, default_model=default_model,
                    baseline_model=baseline_model, concurrency=concurrency, access=access,
                    compare_pair=compare_pair)
    # Gradio copies every file a handler returns (the Ask tab's exports) into its cache;
    # this keeps that cache from growing for ever: hourly, files older than a day go.
    with gr.Blocks(title="LLDS Search-Agent Studio",
                   delete_cache=EXPORT_CACHE_LIFETIME) as demo:
        gr.Markdown("# LLDS Search-Agent Studio\nSearch-R1 style agents: watch them think, "
                    "search and answer.")
        with gr.Tabs():
            with gr.Tab("Ask"):
                controls = ask_tab(studio)
            with gr.Tab("Compare"):
                compare_tab(studio, controls)
            for add_tab in extra_tabs:
                add_tab(studio)
            curves_tab()
    demo.queue(default_concurrency_limit=concurrency)
    demo.studio = studio  # type: ignore[attr-defined]  # for tests and extra tooling
    return demo


def launch_options(host: str = "127.0.0.1", port: int | None = 7860, share: bool = False,
                   **extra) -> dict:
    """Keyword arguments for `demo.launch`: loopback by default, the upload size limit."""
    return {"server_name": host, "server_port": port, "share": share,
            "max_file_size": MAX_FILE_SIZE, **extra}
