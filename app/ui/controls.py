"""What several tabs share: the model picker, the decoding settings (one set of widgets,
shown in the Ask tab and read by Compare too), the question check, and the check that the
picked model's vocabulary can read the question (`reading_check`).
"""

from __future__ import annotations

import threading
import unicodedata
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import gradio as gr

from agent.backends.base import ModelLoadError
from agent.loop import AgentSettings
from agent.models import label, resolve
from app.ui import inputs
from app.ui.transcript import escape

MAX_QUESTION_CHARS = 2000
# The decoding controls: (label, minimum, maximum, step, default); the sliders and the
# handlers' own checks read the same bounds.
CONTROLS = {"temperature": ("Temperature", 0.05, 1.5, 0.05, 0.7),
            "top_p": ("Top-p", 0.05, 1.0, 0.05, 1.0),
            "max_turns": ("Max turns (with search)", 1, 8, 1, 4),
            "topk": ("Documents per search (top-k)", 1, 10, 1, 3),
            "max_new_tokens": ("Max new tokens per turn", 32, 1024, 1, 500)}
GREEDY_LABEL = "Greedy (the paper's evaluation)"
SAMPLING = ("temperature", "top_p")  # what greedy decoding ignores
GREEDY_NOTE = "Not used while Greedy is ticked."
# The studio's repetition stop (AgentSettings.stop_repeats): a turn that has written one
# short unit this many times in a row ends there, saying so. Not the published protocol
# (the evaluator and app.infer never stop early), hence a box to untick.
REPEAT_STOP = 64
REPEAT_LABEL = f"Stop a turn that repeats one word {REPEAT_STOP} times (not the protocol)"


def _checked(name: str, value, integer: bool = False):
    label, low, high, _, _ = CONTROLS[name]
    return inputs.number(label, value, low, high, integer=integer)


def validate_question(question: str | None) -> str | None:
    """Why the question can't be asked (a message for the user), or None when it can."""
    text = (question or "").strip()
    if not text:
        return "Please type a question first."
    if len(text) > MAX_QUESTION_CHARS:
        return (f"That question is {len(text):,} characters long; the limit is "
                f"{MAX_QUESTION_CHARS:,}. Please shorten it.")
    problem = inputs.unencodable(text)
    if problem:
        return f"The question has {problem}, which no model can read. Please retype it."
    return None


# Reading check ---------------------------------------------------------------------------
# A byte-level vocabulary (Qwen's, the nano agent's) encodes every character: one it holds
# no token for becomes raw byte pieces. Whether its model can read those depends on what it
# was trained on, and the vocabulary says that too: one that holds fewer than this many
# non-ASCII characters whole was built from text with little else (the nano agent's holds
# 15, from its English corpus), and its model has hardly seen byte pieces: a rocket emoji
# reaches it as four tokens it never learnt. Qwen's holds over 17,000, and Qwen was trained
# on the byte pieces of rarer characters too: for it every character is readable.
NARROW_ALPHABET = 1000
_DECODE_CHUNK = 4096  # token ids decoded at a time while counting (it stops at the bar)
_SHOWN_CHARACTERS = 8  # how many unreadable characters a message names


def _alphabet_is_narrow(tokenizer: Any) -> bool:
    """The vocabulary holds fewer than NARROW_ALPHABET non-ASCII characters whole."""
    seen: set[str] = set()
    size = len(tokenizer)
    for first in range(0, size, _DECODE_CHUNK):
        ids = range(first, min(size, first + _DECODE_CHUNK))
        texts = tokenizer.batch_decode([[i] for i in ids])
        seen.update(c for text in texts if "\ufffd" not in text for c in text if not c.isascii())
        if len(seen) >= NARROW_ALPHABET:  # wide enough: no need to read the rest
            return False
    return True


_NARROW: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_NARROW_LOCK = threading.Lock()


def alphabet_is_narrow(tokenizer: Any) -> bool:
    """`_alphabet_is_narrow`, worked out once per tokenizer object (Qwen's takes a second)."""
    with _NARROW_LOCK:
        try:
            if tokenizer not in _NARROW:
                _NARROW[tokenizer] = _alphabet_is_narrow(tokenizer)
            return _NARROW[tokenizer]
        except TypeError:  # not weak-referenceable: work it out each time
            return _alphabet_is_narrow(tokenizer)


def unreadable_characters(text: str, tokenizer: Any, narrow: bool | None = None) -> list[str]:
    """The characters of `text` (in order, once each) that `tokenizer`'s model cannot read:
    lost or made an unknown token in a round trip through the tokenizer (a vocabulary
    without byte fallback), or, in a narrow vocabulary (`alphabet_is_narrow`), held by no
    token, so they reach the model as raw byte pieces (each decodes to U+FFFD alone).
    `narrow` None: work it out from the tokenizer."""
    if narrow is None:
        narrow = alphabet_is_narrow(tokenizer)
    found = []
    # NFC first, as the tokenizers do: "e" + a combining accent is read as one "é".
    for char in dict.fromkeys(unicodedata.normalize("NFC", text)):
        if char.isspace():
            continue
        ids = tokenizer.encode(char, add_special_tokens=False)
        # An unknown token decodes to its name ("<unk>"), so a round trip catches it too.
        lost = tokenizer.decode(ids).strip() != char
        bytes_only = narrow and any("\ufffd" in tokenizer.decode([i]) for i in ids)
        if lost or bytes_only:
            found.append(char)
    return found


def _tokenizer_source(model: str) -> str | None:
    """Where `model`'s tokenizer can be read without a download: a shipped model's or a
    local directory, or a hub id whose tokenizer is in the local cache; None otherwise."""
    try:
        path = resolve(model)
    except ModelLoadError:
        return None
    local = Path(path).expanduser()
    if local.is_dir():
        names = ("tokenizer.json", "tokenizer_config.json")
        return str(local) if any((local / name).is_file() for name in names) else None
    if model.count("/") != 1 or model.startswith((".", "/", "~")):
        return None
    from huggingface_hub import try_to_load_from_cache

    cached = [try_to_load_from_cache(model, name)
              for name in ("tokenizer.json", "tokenizer_config.json")]
    return model if any(isinstance(c, str) for c in cached) else None


@lru_cache(maxsize=8)
def _load_tokenizer(source: str) -> Any:
    """A tokenizer from local files only (never a download); None when it won't load."""
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(source, local_files_only=True)
    except Exception:  # a check we can skip must never stop a question
        return None


def model_tokenizer(pool: Any, model: str) -> Any:
    """`model`'s tokenizer where it is at hand: from its files when they are local (a
    shipped or local model, a hub id in the cache), loaded alone (cheap: no weights), else
    the loaded backend's (a served model's, say); None where neither is, or where the
    studio refuses the model (its run says why). Never downloads, never loads a model."""
    model = model.strip()
    try:
        pool.refuse_if_not_allowed(model)  # an exposed studio reads no visitor's path
    except ModelLoadError:
        return None
    source = _tokenizer_source(model)
    tokenizer = _load_tokenizer(source) if source else None
    if tokenizer is None and pool.is_loaded(model):
        # Loaded a moment ago, so `get` returns it (it would load a model dropped since:
        # rare, and the run that follows loads it anyway).
        tokenizer = getattr(pool.get(model), "tokenizer", None)
    return tokenizer


def _named(chars: list[str]) -> str:
    """Characters as a message names them: each with its code point (an emoji may show as
    an empty box where the browser has no emoji font)."""
    names = [f"{escape(char)} (U+{ord(char):04X})" for char in chars[:_SHOWN_CHARACTERS]]
    more = len(chars) - _SHOWN_CHARACTERS
    return ", ".join(names) + (f" and {more} more" if more > 0 else "")


@dataclass(frozen=True)
class Reading:
    """What the reading check found: `refusal` (the model can read nothing of the
    question: don't run it) or `warning` (it can read some: run, and say what it can't)."""

    refusal: str | None = None
    warning: str | None = None


def reading_check(question: str, model: str, pool: Any) -> Reading:
    """Whether `model`'s vocabulary can read `question`, decided by its tokenizer before
    any model runs. Skipped (an empty Reading) for ASCII, which every byte-level vocabulary
    reads, and where the tokenizer is not at hand without a download."""
    if question.isascii():
        return Reading()
    tokenizer = model_tokenizer(pool, model)
    if tokenizer is None:
        return Reading()
    try:
        chars = unreadable_characters(question, tokenizer)
    except Exception:  # a tokenizer that can't encode: the run reports it
        return Reading()
    if not chars:
        return Reading()
    what = (f"The vocabulary of this model ({escape(label(model.strip()))}) has no token for "
            f"{_named(chars)}: it learnt only the characters of its training text, so they "
            "would reach it as bytes it was never trained on.")
    # Letters or digits it can read: the question still says something to this model.
    if any(c.isalnum() for c in unicodedata.normalize("NFC", question) if c not in chars):
        return Reading(warning=f"**Note:** {what} It may misread that part of the "
                               "question; write it in plain letters for a better answer.")
    return Reading(refusal=f"**This model cannot read the question.** {what} Please ask "
                           "in words (letters and digits), or pick a model whose vocabulary "
                           "reads them (a Qwen2.5-based checkpoint reads any text).")


def settings_from_controls(greedy: bool, temperature: float, top_p: float, max_turns: int,
                           topk: int, max_new_tokens: int,
                           stop_repeats: bool = True) -> AgentSettings:
    """The decoding controls' values as agent settings; InputError names a field out of its
    range or of the wrong type (the API client can send anything)."""
    return AgentSettings(max_turns=_checked("max_turns", max_turns, integer=True),
                         topk=_checked("topk", topk, integer=True),
                         max_new_tokens=_checked("max_new_tokens", max_new_tokens,
                                                 integer=True),
                         greedy=inputs.flag("Greedy", greedy),
                         temperature=_checked("temperature", temperature),
                         top_p=_checked("top_p", top_p),
                         stop_repeats=REPEAT_STOP if inputs.flag("Stop on repetition", stop_repeats)
                         else 0)


class Decoding:
    """The decoding and search widgets, made unrendered: the Ask tab shows them
    (`render`), and every tab that runs the agent passes `components` to its handler,
    whose values go to `settings_from_controls` in this order."""

    def __init__(self):
        self.greedy = inputs.Checkbox(True, label=GREEDY_LABEL, render=False,
                                      elem_id="ask-greedy")
        self.sliders = []
        for name in CONTROLS:
            label, low, high, step, default = CONTROLS[name]
            self.sliders.append(inputs.Slider(
                low, high, value=default, step=step, label=label, render=False,
                interactive=name not in SAMPLING, elem_id=f"ask-{name.replace('_', '-')}",
                info=GREEDY_NOTE if name in SAMPLING else None))
        self.stop_repeats = inputs.Checkbox(True, label=REPEAT_LABEL, render=False,
                                            elem_id="ask-stop-repeats")

    @property
    def sampling(self) -> list:
        """The sliders greedy decoding ignores (temperature, top-p)."""
        return [s for s, name in zip(self.sliders, CONTROLS, strict=True) if name in SAMPLING]

    def greedy_changed(self, greedy: bool) -> dict:
        """Greedy ticked: the sampling sliders are greyed out (they don't apply)."""
        info = GREEDY_NOTE if greedy else None
        return {slider: gr.update(interactive=not greedy, info=info) for slider in self.sampling}

    def wire(self) -> None:
        self.greedy.change(self.greedy_changed, self.greedy, self.sampling, queue=False,
                           api_visibility="private")

    @property
    def components(self) -> list:
        return [self.greedy, *self.sliders, self.stop_repeats]

    def render(self) -> None:
        for component in self.components:
            component.render()


class RunButton:
    """A button that starts a run (Ask, Compare), disabled while its run goes with the
    reason on it, so a click then is neither lost in silence nor a second run. Enabled
    again when the run ends: answered, stopped or failed."""

    def __init__(self, button: gr.Button, label: str, busy_label: str, busy_message: str):
        self.button, self.label = button, label
        self.busy_label, self.busy_message = busy_label, busy_message

    def busy(self, shown: str | None) -> dict:
        """Disable the button for a run; refused, with a visible message, while a run is
        already going (the textbox's Enter and the examples reach here with the button
        disabled). Gradio's `.success` then does not start a second run."""
        if shown == self.busy_label:
            raise gr.Error(self.busy_message, print_exception=False)
        return gr.update(value=self.busy_label, interactive=False)

    def idle(self) -> dict:
        """The button back, for the next run."""
        return gr.update(value=self.label, interactive=True)

    def guard(self, start: Callable[..., Any], fn: Callable, inputs: list, outputs: list,
              **kwargs: Any) -> Any:
        """Wire a run: `start` (the trigger's listener, e.g. `button.click`, `box.submit`
        or an event's `.then`) disables the button, then `fn` runs (with `kwargs`: its
        api_name, concurrency), then the button comes back. Returns the run's event (for
        `cancels=`)."""
        private = {"queue": False, "api_visibility": "private"}
        # Queued, unlike `idle`: Gradio shows a handler's gr.Error (the refusal) only for
        # queued events; an unqueued one fails with a bare HTTP 500 and no message.
        guard = start(self.busy, [self.button], [self.button], api_visibility="private",
                      show_progress="hidden")
        run = guard.success(fn, inputs, outputs, **kwargs)
        run.then(self.idle, None, [self.button], **private)
        return run


def model_picker(choices: list[tuple[str, str]], value: str, label: str, elem_id: str,
                 restricted: bool) -> gr.Dropdown:
    """The model dropdown: free text on loopback, the list only when the studio is exposed
    (`restricted`; the pool refuses other names anyway)."""
    info = ("Pick one of this studio's models." if restricted
            else "Pick one, or type any hub id or local path.")
    return gr.Dropdown(choices, value=value, label=label, info=info,
                       allow_custom_value=not restricted, elem_id=elem_id)
