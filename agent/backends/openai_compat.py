"""Any OpenAI-compatible completions server (vLLM, SGLang, TGI) as a backend.

The prompt is templated here and sent to `/completions` (not chat), so the server sees the
exact Search-R1 text. The one stop string is `</search>` (protocol.STOP_STRINGS: a turn
generated past `</answer>` runs to EOS, and the loop cuts it). Servers leave the matched stop
string out of the text: we put it back so the trajectory is exactly what the model produced.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

from agent import protocol
from agent.backends.base import ModelLoadError, Sampling, TokenizerText, TurnOutput

UNREPORTED = object()  # the server has no field saying which stop fired


def stop_field(choice) -> object:
    """vLLM's `stop_reason` or SGLang's `matched_stop`; UNREPORTED when neither is sent."""
    extra = choice.model_extra or {}
    for key in ("stop_reason", "matched_stop"):
        if key in extra:
            return extra[key]
    return UNREPORTED


def restore_stop(text: str, finish_reason: str | None, stop_reason) -> tuple[str, str]:
    """(text with its closing tag, finish) from what a server says about why it stopped."""
    if finish_reason == "length":
        return text, "length"
    if isinstance(stop_reason, str) and stop_reason in protocol.STOP_STRINGS:
        return text + stop_reason, "stop"
    if stop_reason is not UNREPORTED:  # reported, and not a stop string: EOS
        return text, "eos"
    # A server that never says which stop fired: an unclosed `<search>` means `</search>`
    # did; otherwise the model ended with EOS.
    opened = text.rfind("<search>")
    if opened >= 0 and "</search>" not in text[opened:]:
        return text + "</search>", "stop"
    return text, "eos"


class OpenAIBackend(TokenizerText):
    name = "openai"

    def __init__(self, model: str, base_url: str = "http://127.0.0.1:8001/v1",
                 api_key: str = "EMPTY", tokenizer: str | None = None, concurrency: int = 16,
                 timeout: float = 300.0):
        import openai

        self.model = model
        self.base_url = base_url
        self.client = openai.OpenAI(base_url=base_url, api_key=api_key, timeout=timeout,
                                    max_retries=1)
        self.concurrency = concurrency
        self.tokenizer = None
        try:  # the chat template and token counts come from the model's own tokenizer
            from transformers import AutoTokenizer

            from agent.models import check_loadable

            check_loadable(tokenizer or model)
            self.tokenizer = AutoTokenizer.from_pretrained(tokenizer or model)
        except (ModelLoadError, OSError, ValueError) as err:
            # Without it: no chat template, and tokens estimated at 4 characters each. The
            # prompt then differs from the protocol's for chat-templated models: say so.
            import warnings

            warnings.warn(f"Could not load the tokenizer of {tokenizer or model!r} ({err}); "
                          "prompts go without a chat template and token counts are "
                          "estimated. Pass --tokenizer ID_OR_PATH.", stacklevel=2)
            self.tokenizer = None

    def _prompt(self, context: Sequence[str], keep_last: int | None) -> str | list[int]:
        """The prompt text; with `keep_last`, the last that many tokens, sent as token ids
        (the completions API takes them), so the cut falls where Search-R1's does."""
        if not keep_last:
            return "".join(context)
        if self.tokenizer is None:
            return "".join(context)[-keep_last * self.CHARS_PER_TOKEN:]
        ids = [i for segment in context for i in self._encode(segment)]
        return ids[-keep_last:]

    def _request(self, context: Sequence[str], max_new_tokens: int, sampling: Sampling,
                 stream: bool, keep_last: int | None = None):
        import openai

        try:
            return self.client.completions.create(
                model=self.model, prompt=self._prompt(context, keep_last),
                max_tokens=max_new_tokens,
                temperature=0.0 if sampling.greedy else sampling.temperature,
                top_p=1.0 if sampling.greedy else sampling.top_p, seed=sampling.seed,
                stop=list(protocol.STOP_STRINGS), stream=stream,
                # vLLM applies a model's generation_config (e.g. an instruct checkpoint's
                # repetition penalty) unless told; Search-R1 decoded without them.
                extra_body={"repetition_penalty": 1.0, "top_k": -1},
                **({"stream_options": {"include_usage": True}} if stream else {}))
        except openai.APIConnectionError as err:
            raise ConnectionError(f"No completions server answered at {self.base_url} "
                                  f"({err}). Start one, e.g. `vllm serve {self.model}`, "
                                  "and pass --base-url.") from err

    def stream(self, context: Sequence[str], max_new_tokens: int, sampling: Sampling,
               cancel: threading.Event | None = None,
               keep_last: int | None = None) -> Iterator[str | TurnOutput]:
        response = self._request(context, max_new_tokens, sampling, stream=True,
                                 keep_last=keep_last)
        text, finish, stop_reason, usage = "", None, None, None
        try:
            for chunk in response:
                if cancel is not None and cancel.is_set():
                    yield TurnOutput(text, self.count_tokens(text), "cancelled")
                    return
                if chunk.usage is not None:
                    usage = chunk.usage.completion_tokens
                for choice in chunk.choices:
                    if choice.text:
                        text += choice.text
                        yield choice.text
                    if choice.finish_reason:
                        finish = choice.finish_reason
                        stop_reason = stop_field(choice)
        finally:
            response.close()
        full, why = restore_stop(text, finish, stop_reason)
        if full != text:
            yield full[len(text):]
        yield TurnOutput(full, usage if usage is not None else self.count_tokens(text), why)

    def _one(self, context: Sequence[str], max_new_tokens: int, sampling: Sampling,
             keep_last: int | None = None) -> TurnOutput:
        choice = self._request(context, max_new_tokens, sampling, stream=False,
                               keep_last=keep_last)
        first = choice.choices[0]
        full, why = restore_stop(first.text, first.finish_reason, stop_field(first))
        tokens = choice.usage.completion_tokens if choice.usage else self.count_tokens(first.text)
        return TurnOutput(full, tokens, why)

    def generate(self, contexts: Sequence[Sequence[str]], max_new_tokens: Sequence[int],
                 sampling: Sampling,
                 keep_last: Sequence[int | None] | None = None) -> list[TurnOutput]:
        """Concurrent requests: the server batches them (continuous batching)."""
        keep_last = keep_last or [None] * len(contexts)
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            return list(pool.map(lambda a: self._one(a[0], a[1], sampling, a[2]),
                                 zip(contexts, max_new_tokens, keep_last, strict=True)))
