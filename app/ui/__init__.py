"""The Gradio front end: `build_app(backend_factory, retriever)` and its pure helpers."""

from app.ui.blocks import Studio, build_app, launch_options
from app.ui.session import ModelPool, make_backend_factory
from retriever.client import open_retriever as make_retriever

__all__ = ["ModelPool", "Studio", "build_app", "launch_options", "make_backend_factory",
           "make_retriever"]
