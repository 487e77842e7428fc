"""What several tabs share: the model picker, the decoding settings (one set of widgets,
shown in the Ask tab and read by Compare too) and the question check.
"""

from __future__ import annotations

import gradio as gr

from agent.loop import AgentSettings
from app.ui import inputs

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


def settings_from_controls(greedy: bool, temperature: float, top_p: float, max_turns: int,
                           topk: int, max_new_tokens: int) -> AgentSettings:
    """The decoding controls' values as agent settings; InputError names a field out of its
    range or of the wrong type (the API client can send anything)."""
    return AgentSettings(max_turns=_checked("max_turns", max_turns, integer=True),
                         topk=_checked("topk", topk, integer=True),
                         max_new_tokens=_checked("max_new_tokens", max_new_tokens,
                                                 integer=True),
                         greedy=inputs.flag("Greedy", greedy),
                         temperature=_checked("temperature", temperature),
                         top_p=_checked("top_p", top_p))


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
        return [self.greedy, *self.sliders]

    def render(self) -> None:
        for component in self.components:
            component.render()


def model_picker(choices: list[tuple[str, str]], value: str, label: str, elem_id: str,
                 restricted: bool) -> gr.Dropdown:
    """The model dropdown: free text on loopback, the list only when the studio is exposed
    (`restricted`; the pool refuses other names anyway)."""
    info = ("Pick one of this studio's models." if restricted
            else "Pick one, or type any hub id or local path.")
    return gr.Dropdown(choices, value=value, label=label, info=info,
                       allow_custom_value=not restricted, elem_id=elem_id)
