"""The Gradio front end: `build_app(backend_factory, retriever)`, one module per tab."""

from app.ui.context import Studio
from app.ui.model_pool import ModelPool
from app.ui.studio import build_app, launch_options

__all__ = ["ModelPool", "Studio", "build_app", "launch_options"]
