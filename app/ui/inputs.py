"""Checks on what a handler receives, so a wrong-typed call (the Gradio API client can send
anything: temperature "hot", a seed of 1e300) gets a message naming the field.

Sliders, number boxes and checkboxes made here check in their `preprocess`, which Gradio
runs before the handler: a plain exception there reaches API clients as a blank "Error", a
`gr.Error` with its message. The pure checks (`number`, `text`, `flag`) raise `InputError`;
the components and the handlers turn it into `gr.Error`.
"""

from __future__ import annotations

import math
from typing import Any

import gradio as gr


class InputError(ValueError):
    """A value a visitor sent that the field can't take; the message names the field."""


def number(field: str, value: Any, minimum: float | None = None,
           maximum: float | None = None, *, integer: bool = False) -> float | int:
    """`value` as a finite number within [minimum, maximum] (an int when `integer`)."""
    bounds = (f" between {minimum:g} and {maximum:g}"
              if minimum is not None and maximum is not None else "")
    kind = "a whole number" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, int | float):
        parsed = None
        if isinstance(value, str):  # "0.7" from a form or a client is fine
            try:
                parsed = float(value.strip())
            except ValueError:
                pass
        if parsed is None:
            raise InputError(f"{field}: expected {kind}{bounds}, got {_show(value)}.")
        value = parsed
    if not math.isfinite(value):
        raise InputError(f"{field}: expected {kind}{bounds}, got {value}.")
    if integer:
        if value != int(value):
            raise InputError(f"{field}: expected {kind}{bounds}, got {value:g}.")
        value = int(value)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise InputError(f"{field}: {value:g} is out of range; expected {kind}{bounds}.")
    return value


def unencodable(value: str) -> str | None:
    """What in `value` UTF-8 cannot encode (a lone surrogate, which a JSON client can send),
    said without the character itself; None when all of it can be encoded. Such text
    reaches no tokenizer and no page: both encode it as UTF-8 and fail."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        return (f"a character that is not valid Unicode text at position {err.start + 1} "
                f"(a lone surrogate, U+{ord(value[err.start]):04X})")
    return None


def text(field: str, value: Any, *, max_chars: int | None = None) -> str:
    """`value` as text (None is empty), stripped; a number, a list or text with a lone
    surrogate is refused."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InputError(f"{field}: expected text, got {_show(value)}.")
    if problem := unencodable(value):
        raise InputError(f"{field}: {problem}. Please retype it.")
    value = value.strip()
    if max_chars is not None and len(value) > max_chars:
        raise InputError(f"{field}: {len(value):,} characters; the limit is {max_chars:,}.")
    return value


def flag(field: str, value: Any) -> bool:
    """`value` as a checkbox state: true or false, nothing else."""
    if not isinstance(value, bool):
        raise InputError(f"{field}: expected true or false, got {_show(value)}.")
    return value


def _show(value: Any) -> str:
    shown = repr(value)
    return (shown[:40] + "…" if len(shown) > 40 else shown) + f" ({type(value).__name__})"


def _checked(component, check):
    """Run `check(payload)` before the component's own preprocess, as `gr.Error`.

    Installed on the instance: a subclass of a Gradio component would make Gradio write a
    `.pyi` stub beside this module at import time.
    """
    original = component.preprocess

    def preprocess(payload: Any):
        try:
            payload = check(payload)
        except InputError as err:
            raise gr.Error(str(err)) from None
        return original(payload)

    component.preprocess = preprocess
    return component


def Slider(minimum: float, maximum: float, **kwargs: Any) -> gr.Slider:
    """A gr.Slider whose value is checked (type and range), with a message naming it."""
    slider = gr.Slider(minimum, maximum, **kwargs)
    integer = float(slider.step).is_integer() and float(minimum).is_integer()
    return _checked(slider, lambda value: number(slider.label or "value", value, minimum,
                                                 maximum, integer=integer))


def Number(value: float, **kwargs: Any) -> gr.Number:
    """A gr.Number whose value is checked (type, range, whole when precision is 0)."""
    box = gr.Number(value, **kwargs)
    return _checked(box, lambda v: number(box.label or "value", v, box.minimum, box.maximum,
                                          integer=box.precision == 0))


def Checkbox(value: bool, **kwargs: Any) -> gr.Checkbox:
    """A gr.Checkbox that takes true or false only."""
    box = gr.Checkbox(value, **kwargs)
    return _checked(box, lambda v: flag(box.label or "value", v))
