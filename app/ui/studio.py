"""The studio: `build_app(backend_factory, retriever)` makes the `Studio` and mounts each
tab on it, in order. Tests pass a scripted backend factory and a real in-process retriever.
"""

from __future__ import annotations

import gradio as gr

from agent.models import DEFAULT_BASELINE, DEFAULT_MODEL
from app.capacity import Capacity
from app.ui import ask_tab, compare_tab, curves_tab, evaluate_tab
from app.ui.access import Access
from app.ui.context import Studio
from app.ui.model_pool import BackendFactory, ModelPool
from app.ui.serving import DEFAULT_MAX_BATCH

MAX_FILE_SIZE = "200mb"  # uploads (training logs); passed to launch()
EXPORT_CACHE_LIFETIME = (3600, 86400)  # Gradio's delete_cache: (every s, older than s)
TABS = (ask_tab, compare_tab, evaluate_tab, curves_tab)  # each has `mount(studio)`
_FONTS = "static/fonts"  # Gradio serves its bundled fonts here (its own CSS uses this path)
# Gradio ships SourceSansPro-SemiBold.woff2 and IBMPlexMono-SemiBold.woff2 as subsets of 55
# and 75 glyphs (the space, "A", "B", some Cyrillic): weight-600 text (the page title,
# labels, bold Markdown, table headers) took its "A" from Source Sans and every other letter
# from a fallback font ("Search-Agent" with an odd "A"), and bold monospace fell back to a
# wider font. The studio's own families use the full Regular and Bold files for every
# weight. Table headers use the proportional one: a column sized for its values then fits
# its header's words whole ("likelihood peak step" broke as "likelihoo d"). Compare's row
# names keep to one line: long model labels squeezed them into "Answe / r" at 1000 px.
STUDIO_CSS = f"""
@font-face {{ font-family: "Studio Sans"; font-weight: 100 500; font-style: normal;
  src: url("{_FONTS}/SourceSansPro/SourceSansPro-Regular.woff2") format("woff2"); }}
@font-face {{ font-family: "Studio Sans"; font-weight: 501 900; font-style: normal;
  src: url("{_FONTS}/SourceSansPro/SourceSansPro-Bold.woff2") format("woff2"); }}
@font-face {{ font-family: "Studio Mono"; font-weight: 100 500; font-style: normal;
  src: url("{_FONTS}/IBMPlexMono/IBMPlexMono-Regular.woff2") format("woff2"); }}
@font-face {{ font-family: "Studio Mono"; font-weight: 501 900; font-style: normal;
  src: url("{_FONTS}/IBMPlexMono/IBMPlexMono-Bold.woff2") format("woff2"); }}
:root, .gradio-container {{
  --font: "Studio Sans", ui-sans-serif, system-ui, sans-serif !important;
  --font-mono: "Studio Mono", ui-monospace, Consolas, monospace !important;
}}
.gradio-container table th, .gradio-container table th .header {{
  font-family: var(--font); overflow-wrap: break-word; word-break: normal;
}}
#compare-table td:first-child {{ white-space: nowrap; }}
"""


def build_app(backend_factory: BackendFactory, retriever, *,
              default_model: str = DEFAULT_MODEL, baseline_model: str = DEFAULT_BASELINE,
              concurrency: int = 32, per_model: int = 1, max_loaded: int = 2,
              max_batch: int = DEFAULT_MAX_BATCH,
              pool: ModelPool | None = None, access: Access | None = None,
              compare_pair: tuple[str, str] | None = None,
              capacity: Capacity | None = None) -> gr.Blocks:
    """The studio as a gr.Blocks, queue configured; call `.launch(**launch_options())`.

    access: what visitors may load (`Access.for_launch`); the pool refuses the rest.
    compare_pair: the Compare tab's (A, B); default (baseline_model, default_model).
    capacity: what this machine holds (`Capacity.for_launch`); models that don't fit are
    shown unavailable and refused, and loads drop idle models to make room.
    """
    access = access or Access()
    pool = pool or ModelPool(backend_factory, per_model, max_loaded, max_batch=max_batch)
    if capacity is not None:
        pool.capacity = capacity
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
            for tab in TABS:
                tab.mount(studio)
    demo.queue(default_concurrency_limit=concurrency)
    demo.studio = studio  # type: ignore[attr-defined]  # for tests and extra tooling
    return demo


def launch_options(host: str = "127.0.0.1", port: int | None = 7860, share: bool = False,
                   **extra) -> dict:
    """Keyword arguments for `demo.launch`: loopback by default, the upload size limit and
    guard, the studio's CSS (Gradio 6 takes it at launch)."""
    from starlette.middleware import Middleware

    from app.ui.uploads import UploadGuard

    return {"server_name": host, "server_port": port, "share": share,
            "max_file_size": MAX_FILE_SIZE, "css": STUDIO_CSS,
            # Each upload capped and removed once read (app/ui/uploads.py).
            "app_kwargs": {"middleware": [Middleware(UploadGuard)]}, **extra}
