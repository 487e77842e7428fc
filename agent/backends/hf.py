"""The transformers backend: a causal LM from a hub id or a local path.

One question's turns share a KV cache: the next turn feeds only the tokens the cache does
not hold yet (the observation, and whatever re-tokenizing the cut turn changed), where
Search-R1's infer.py re-encodes the whole context every turn.

A batched turn does not wait for its slowest row: once three quarters of the rows have
stopped, the rest go on alone from a copy of their cache (`_StragglerCut`).

Streaming, batched generation and the KV-cache bookkeeping they share live together here,
so that the cache rules are read in one place.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

from agent import protocol
from agent.backends.base import ModelLoadError, Sampling, TokenizerText, TurnOutput


class _BatchCache:
    """The KV cache of the last batched turn, kept so the next round of the same questions
    feeds only what each row added (its observation), not every context again.

    Rows sit in one padded layout. A row's next context is matched to its cached tokens;
    cached columns past the shared prefix (tokens generated after a stop, or a tail that
    re-tokenized differently) are masked out rather than cropped, since rows differ.
    Positions come from the mask, so a masked gap changes nothing for the model.
    """

    def __init__(self, ids, mask, cache, columns: list[list[int]], tokens: list[list[int]]):
        self.ids, self.mask, self.cache = ids, mask, cache
        self.columns, self.tokens = columns, tokens

    @classmethod
    def after(cls, sequences, mask, cache, kept: list[int]) -> _BatchCache:
        import torch

        cached = cache.get_seq_length()  # all but the last generated token
        generated = torch.zeros(sequences.shape[0], sequences.shape[1] - mask.shape[1],
                                dtype=mask.dtype)
        for row, n in enumerate(kept):
            generated[row, :n] = 1
        full_mask = torch.cat([mask.cpu(), generated], dim=1)[:, :cached]
        ids = sequences[:, :cached].cpu()
        columns = [torch.nonzero(m).flatten().tolist() for m in full_mask]
        tokens = [ids[row, cols].tolist() for row, cols in enumerate(columns)]
        return cls(ids, full_mask, cache, columns, tokens)

    def subset(self, picks: list[int], config) -> _BatchCache:
        """The cached state of rows `picks` alone, in a cache of its own (copied, so this one
        stays whole for the next turn)."""
        import torch
        from transformers import DynamicCache

        index = torch.tensor(picks)
        layers = [(layer.keys[index.to(layer.keys.device)],
                   layer.values[index.to(layer.values.device)]) for layer in self.cache.layers]
        return _BatchCache(self.ids[index], self.mask[index], DynamicCache(layers, config=config),
                           [self.columns[p] for p in picks], [self.tokens[p] for p in picks])

    def extend(self, rows: list[list[int]], pad_id: int):
        """(input_ids, mask, cache) continuing the cached rows, or None if they don't fit."""
        import torch

        picks, shared = [], []
        previous = 0
        for ids in rows:  # the questions still running, in the same order as before
            while previous < len(self.tokens):
                known = self.tokens[previous]
                n = next((k for k, (a, b) in enumerate(zip(known, ids, strict=False))
                          if a != b), min(len(known), len(ids)))
                previous += 1
                if n >= max(1, len(known) - 16):  # same question, tail re-tokenized at most
                    picks.append(previous - 1)
                    shared.append(min(n, len(ids) - 1))
                    break
            else:
                return None
        self.cache.batch_select_indices(torch.tensor(picks))
        mask = self.mask[picks].clone()
        for row, (pick, n) in enumerate(zip(picks, shared, strict=True)):
            mask[row, self.columns[pick][n:]] = 0
        added = [ids[n:] for ids, n in zip(rows, shared, strict=True)]
        width = max(len(a) for a in added)
        chunk = torch.tensor([[pad_id] * (width - len(a)) + a for a in added])
        chunk_mask = torch.tensor([[0] * (width - len(a)) + [1] * len(a) for a in added])
        return (torch.cat([self.ids[picks], chunk], dim=1),
                torch.cat([mask, chunk_mask.to(mask.dtype)], dim=1), self.cache)


def like_lengths(lengths: Sequence[int], slack: float = 0.75) -> list[list[int]]:
    """Row indices grouped so that within a group every row is at least `slack` of the
    longest: padding then wastes at most a quarter of a group's computed positions."""
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if groups and lengths[i] >= slack * lengths[groups[-1][0]]:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def pick_device(device: str = "auto") -> str:
    import torch

    if device != "auto":
        return device
    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def auto_dtype(device: str) -> str:
    """The dtype a model is loaded in when none is given: bf16 on CUDA (as Search-R1's
    infer.py loads it), fp32 elsewhere."""
    return "bfloat16" if device == "cuda" else "float32"


def _eos_ids(tokenizer, model) -> list[int]:
    """The tokenizer's and model's EOS ids, plus Qwen2.5's two when the vocabulary has them."""
    ids = set()
    for source in (tokenizer.eos_token_id, model.generation_config.eos_token_id):
        if isinstance(source, int):
            ids.add(source)
        elif source:
            ids.update(source)
    for token in ("<|im_end|>", "<|endoftext|>"):
        token_id = tokenizer.convert_tokens_to_ids(token)
        if isinstance(token_id, int) and token_id != tokenizer.unk_token_id:
            ids.add(token_id)
    return sorted(ids)


class _Cancel:
    """A stopping criterion that ends generation when any of the events is set."""

    def __init__(self, *events: threading.Event | None):
        self.events = [e for e in events if e is not None]

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        hit = any(e.is_set() for e in self.events)
        return torch.full((input_ids.shape[0],), hit, dtype=torch.bool, device=input_ids.device)


class _StragglerCut:
    """Ends a batched turn early once at most a quarter of its rows are still generating.

    A batch decodes every row until the last one stops, so one row that rambles to its
    token budget (an invalid action runs to the whole budget) would keep every finished
    row decoding with it. The rows still running are continued in a batch of their own
    from a copy of their cache (`_BatchCache.subset`); a row is done at EOS, at a stop
    string or at its budget.
    """

    def __init__(self, stops, eos_ids: list[int], width: int, budgets: Sequence[int]):
        self.stops, self.width = stops, width
        self.eos_ids, self.budgets = eos_ids, budgets
        self.done = None

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        device = input_ids.device
        if self.done is None:
            self.done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=device)
            self._eos = torch.tensor(self.eos_ids, device=device)
            self._budgets = torch.tensor(list(self.budgets), device=device)
        steps = input_ids.shape[1] - self.width
        self.done |= (self.stops(input_ids, scores) | torch.isin(input_ids[:, -1], self._eos)
                      | (self._budgets <= steps))
        running = int((~self.done).sum())
        if running and 4 * running <= len(self.done):
            return torch.ones_like(self.done)
        return self.done


def _control_ids(tokenizer) -> set[int]:
    """Special tokens to leave out of generated text (EOS, padding, chat markers), as
    `skip_special_tokens` does, except the protocol's tags: a Qwen3-derived vocabulary may
    flag `<think>` / `</think>` special, and they are the model's text (trajectory, score)."""
    special = set(tokenizer.all_special_ids)
    special.update(i for i, token in tokenizer.added_tokens_decoder.items() if token.special)
    tags = {tokenizer.convert_tokens_to_ids(tag) for tag in protocol.PROTOCOL_TAGS
            if tag in tokenizer.get_added_vocab()}
    return special - tags


def _streamer(tokenizer, control: set[int]):
    """A TextIteratorStreamer that leaves out control tokens (see `_control_ids`). It holds
    text back until a word ends, so a character split over tokens is never shown broken."""
    import torch
    from transformers import TextIteratorStreamer

    class Streamer(TextIteratorStreamer):
        def put(self, value):
            if not self.next_tokens_are_prompt and control:  # the prompt is skipped whole
                value = value.reshape(-1)
                keep = torch.tensor([int(t) not in control for t in value], dtype=torch.bool,
                                    device=value.device)
                value = value[keep]
                if value.numel() == 0:
                    return
            super().put(value)

    return Streamer(tokenizer, skip_prompt=True, skip_special_tokens=False)


# transformers builds a model on the "meta" device and swaps process-wide state while it
# loads: two loads in two threads can leave both models without weights ("Cannot copy out
# of meta tensor") and the loader broken for later loads. Loads take turns.
_LOAD_LOCK = threading.Lock()


class TransformersBackend(TokenizerText):
    name = "transformers"

    def __init__(self, model: str, device: str = "auto", dtype: str = "auto",
                 trust_remote_code: bool = False, reuse_cache: bool = True,
                 stop_strings: Sequence[str] = protocol.STOP_STRINGS):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from agent.models import check_loadable

        check_loadable(model)
        self.device = pick_device(device)
        if dtype == "auto":
            dtype = auto_dtype(self.device)
        try:
            with _LOAD_LOCK:
                self.tokenizer = AutoTokenizer.from_pretrained(
                    model, trust_remote_code=trust_remote_code)
                kwargs = {"dtype": getattr(torch, dtype), "trust_remote_code": trust_remote_code}
                if self.device == "cuda":
                    kwargs["device_map"] = "auto"  # accelerate spreads big models over GPUs
                self.model = AutoModelForCausalLM.from_pretrained(model, **kwargs)
        except (OSError, ValueError) as err:
            raise ModelLoadError(f"Could not load {model!r}: {err}. Pass a hub id that is "
                                 "cached, or a local directory with config.json, weights and "
                                 "tokenizer files (--model /path/to/model).") from err
        if self.device != "cuda":
            self.model.to(self.device)
        self.model.eval()
        self.model_id = model
        self.eos_ids = _eos_ids(self.tokenizer, self.model)
        self.control_ids = _control_ids(self.tokenizer)
        # Only benchmarks/stop_rule.py changes them (to measure a `</answer>` stop too).
        self.stop_strings = tuple(stop_strings)
        self._stop_criteria = None  # built on first use: it indexes the whole vocabulary
        self.pad_id = (self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None
                       else self.eos_ids[0])
        self.reuse_cache = reuse_cache
        self._cached_ids: list[int] = []
        self._cache = None
        self._batch: _BatchCache | None = None
        self._lock = threading.Lock()  # one generation at a time on this model

    def forget_cache(self) -> None:
        """Drop the KV caches kept between turns: after the weights change (a training
        update) they no longer match the model, and reusing them would be silently wrong."""
        with self._lock:
            self._cached_ids, self._cache, self._batch = [], None, None

    def context_ids(self, context: Sequence[str], keep_last: int | None = None) -> list[int]:
        """Segments tokenized one by one and concatenated, as Search-R1 builds rollouts;
        only the last `keep_last` tokens when given (its rolling window)."""
        ids = [i for segment in context for i in self._encode(segment)]
        return ids[-keep_last:] if keep_last else ids

    def decode(self, ids: Sequence[int]) -> str:
        """Generated ids as text: control tokens left out, the protocol's tags kept."""
        return self.tokenizer.decode([i for i in ids if i not in self.control_ids],
                                     skip_special_tokens=False)

    def _stops(self, *extra) -> list:
        """Stopping criteria: the stop strings (built once; passing `stop_strings` to
        generate rebuilds them per call, seconds for Qwen's 151k tokens), then `extra`."""
        from transformers import StopStringCriteria

        if self._stop_criteria is None:
            self._stop_criteria = StopStringCriteria(self.tokenizer, list(self.stop_strings))
        return [self._stop_criteria, *extra]

    def _generation_kwargs(self, max_new_tokens: int, sampling: Sampling) -> dict:
        import torch

        kwargs = {"max_new_tokens": max_new_tokens, "eos_token_id": self.eos_ids,
                  "pad_token_id": self.pad_id, "do_sample": not sampling.greedy,
                  # Instruct checkpoints ship a repetition penalty in generation_config;
                  # Search-R1's rollouts and evaluation used none.
                  "repetition_penalty": 1.0}
        if sampling.greedy:
            kwargs.update(temperature=None, top_p=None, top_k=None)
        else:
            kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=None)
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
        return kwargs

    def _finish(self, new_ids: list[int], text: str, cancelled: bool) -> TurnOutput:
        """Trim after EOS, then classify why the turn ended."""
        for n, token in enumerate(new_ids):
            if token in self.eos_ids:
                return TurnOutput(self.decode(new_ids[:n]), n + 1, "eos")
        if protocol.find_stop(text, self.stop_strings) >= 0:
            return TurnOutput(text, len(new_ids), "stop")
        if cancelled:
            return TurnOutput(text, len(new_ids), "cancelled")
        return TurnOutput(text, len(new_ids), "length")

    # One question, streamed ----------------------------------------------------------------
    def _reusable_prefix(self, ids: list[int]):
        """The cache cropped to the longest prefix it shares with `ids` (at least one new)."""
        from transformers import DynamicCache

        if not self.reuse_cache or self._cache is None:
            return DynamicCache(config=self.model.config)
        shared = 0
        for a, b in zip(self._cached_ids, ids, strict=False):
            if a != b:
                break
            shared += 1
        shared = min(shared, len(ids) - 1, self._cache.get_seq_length())
        if shared == 0:
            return DynamicCache(config=self.model.config)
        self._cache.crop(shared - self._cache.get_seq_length())
        return self._cache

    def stream(self, context: Sequence[str], max_new_tokens: int, sampling: Sampling,
               cancel: threading.Event | None = None,
               keep_last: int | None = None) -> Iterator[str | TurnOutput]:
        import torch
        from transformers import StoppingCriteriaList

        with self._lock:
            ids = self.context_ids(context, keep_last)
            # After a left cut the ids no longer start like the cached ones, so nothing is
            # reused: a cached position is kept only under the very same prefix.
            cache = self._reusable_prefix(ids)
            # Taken: generate extends it in place, so it only comes back if this turn ends
            # normally (an error or an abandoned stream would leave it out of step).
            self._cache = None
            input_ids = torch.tensor([ids], device=self.model.device)
            streamer = _streamer(self.tokenizer, self.control_ids)
            result: dict = {}
            abandoned = threading.Event()  # the consumer stopped reading: stop generating

            def work() -> None:
                try:
                    with torch.inference_mode():
                        result["out"] = self.model.generate(
                            input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                            cache=cache, streamer=streamer,
                            return_dict_in_generate=True,
                            stopping_criteria=StoppingCriteriaList(
                                self._stops(_Cancel(cancel, abandoned))),
                            **self._generation_kwargs(max_new_tokens, sampling))
                except BaseException as err:  # re-raised in the consumer's thread
                    result["error"] = err
                    streamer.end()

            worker = threading.Thread(target=work, daemon=True)
            worker.start()
            try:
                for delta in streamer:
                    if delta:
                        yield delta
            finally:  # also when the consumer closes us early: never leave generate running
                abandoned.set()
                worker.join()
            if "error" in result:
                raise result["error"]
            sequence = result["out"].sequences[0].tolist()
            new_ids = sequence[len(ids):]
            # The cache now holds the context and all but the last generated token.
            self._cached_ids, self._cache = sequence, result["out"].cache
            text = self.decode(new_ids)
            yield self._finish(new_ids, text, cancel is not None and cancel.is_set())

    # Many questions, one turn each -------------------------------------------------------
    def generate(self, contexts: Sequence[Sequence[str]], max_new_tokens: Sequence[int],
                 sampling: Sampling,
                 keep_last: Sequence[int | None] | None = None) -> list[TurnOutput]:
        import torch

        keep_last = keep_last or [None] * len(contexts)
        # A left-cut row starts unlike its cached row, so `extend` finds no match and the
        # batch is encoded afresh (a cached position is only reused under the same prefix).
        rows = [self.context_ids(c, k) for c, k in zip(contexts, keep_last, strict=True)]
        with self._lock, torch.inference_mode():
            # Taken, not borrowed: a failed generate must not leave a half-updated cache.
            batch, self._batch = self._batch, None
            plan = batch.extend(rows, self.pad_id) if batch is not None else None
            input_ids, mask, cache = plan or self._new_batch(rows)
            out, new = self._generate_rows(input_ids, mask, cache, max_new_tokens, sampling)
            self._finish_stragglers(rows, new, out, mask, max_new_tokens, sampling)
        outputs, kept_tokens = [], []
        for new_ids in new:
            # Rows run on until the whole batch stops: end each at its own first EOS or
            # stop string, whichever came first.
            eos_at = next((n for n, t in enumerate(new_ids) if t in self.eos_ids), None)
            kept = new_ids if eos_at is None else new_ids[:eos_at]
            text = self.decode(kept)
            stop = protocol.find_stop(text, self.stop_strings)
            if stop >= 0:  # the text of the tokens up to the stop, as `stream` gives it
                n = self._tokens_until(kept, stop)
                outputs.append(TurnOutput(self.decode(kept[:n]), n, "stop"))
            elif eos_at is not None:
                outputs.append(TurnOutput(text, eos_at + 1, "eos"))
            else:
                outputs.append(TurnOutput(text, len(new_ids), "length"))
            # The cache keeps the tokens the next context starts with: those up to the cut
            # (a turn generated past a `</answer>` that goes on as an invalid action).
            cut = len(protocol.cut_turn(outputs[-1].text))
            kept_tokens.append(outputs[-1].new_tokens if cut == len(outputs[-1].text)
                               else self._tokens_until(kept, cut))
        if self.reuse_cache:  # a row continued on its own is cached up to where it was cut
            self._batch = _BatchCache.after(out.sequences, mask, out.cache, kept_tokens)
        return outputs

    def _new_batch(self, rows: list[list[int]]):
        """(input_ids, mask, cache): left padding puts every next token in one column. Rows
        of unlike lengths (a visitor's first turn beside another's documents) get their
        cache filled in groups of like length, up to the last column; else generate fills
        it, computing every padded position too."""
        import torch
        from transformers import DynamicCache

        width = max(len(r) for r in rows)
        input_ids = torch.tensor([[self.pad_id] * (width - len(r)) + r for r in rows])
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        groups = like_lengths([len(r) - 1 for r in rows])
        if len(groups) == 1:
            return input_ids, mask, DynamicCache(config=self.model.config)
        return input_ids, mask, self._prefill_groups(input_ids, mask, groups)

    def _prefill_groups(self, input_ids, mask, groups: list[list[int]]):
        """A cache of every column but the last, each group of rows computed on its own
        columns only; a row's positions come from its mask, as generate counts them."""
        import torch
        from transformers import DynamicCache

        device, end = self.model.device, input_ids.shape[1] - 1
        keys, values = None, None
        for group in groups:
            span = int(mask[group, :end].sum(dim=1).max())
            if span == 0:  # rows of one token: nothing before their last
                continue
            part = mask[group, end - span:end]
            out = self.model(input_ids=input_ids[group, end - span:end].to(device),
                             attention_mask=part.to(device),
                             position_ids=(part.cumsum(-1) - 1).clamp(min=0).to(device),
                             use_cache=True, logits_to_keep=1)
            layers = out.cache.layers
            if keys is None:
                keys = [layer.keys.new_zeros(len(mask), *layer.keys.shape[1:2], end,
                                             layer.keys.shape[-1]) for layer in layers]
                values = [layer.values.new_zeros(len(mask), *layer.values.shape[1:2], end,
                                                 layer.values.shape[-1]) for layer in layers]
            index = torch.tensor(group, device=keys[0].device)
            for n, layer in enumerate(layers):
                keys[n][index, :, end - span:] = layer.keys
                values[n][index, :, end - span:] = layer.values
        if keys is None:
            return DynamicCache(config=self.model.config)
        return DynamicCache(list(zip(keys, values, strict=True)), config=self.model.config)

    def _generate_rows(self, input_ids, mask, cache, budgets: Sequence[int],
                       sampling: Sampling):
        """One `model.generate` over padded rows: (its output, each row's new ids within
        its budget). Rows still running when the straggler cut fires come back unfinished."""
        from transformers import StoppingCriteriaList

        stops = self._stops()
        cut = _StragglerCut(stops[0], self.eos_ids, input_ids.shape[1], budgets)
        out = self.model.generate(
            input_ids=input_ids.to(self.model.device),
            attention_mask=mask.to(self.model.device), cache=cache,
            return_dict_in_generate=True,
            stopping_criteria=StoppingCriteriaList([*stops[1:], cut]),
            **self._generation_kwargs(max(budgets), sampling))
        new = [row[:budget] for row, budget in
               zip(out.sequences[:, input_ids.shape[1]:].tolist(), budgets, strict=True)]
        return out, new

    def _ended(self, new_ids: list[int], budget: int) -> bool:
        if len(new_ids) >= budget or any(t in self.eos_ids for t in new_ids):
            return True
        return protocol.find_stop(self.decode(new_ids), self.stop_strings) >= 0

    def _finish_stragglers(self, rows: list[list[int]], new: list[list[int]], out, mask,
                           budgets: Sequence[int], sampling: Sampling) -> None:
        """Continue the rows the straggler cut left running, from copies of their cached
        state, until each ends; their new ids are appended to `new` in place."""
        import dataclasses

        sampling = dataclasses.replace(sampling, seed=None)  # seeded once, at the start
        step, step_mask, in_step = out, mask, list(range(len(new)))  # the last generate's rows
        while running := [i for i in in_step if not self._ended(new[i], budgets[i])]:
            generated = step.sequences.shape[1] - step_mask.shape[1]
            state = _BatchCache.after(step.sequences, step_mask, step.cache,
                                      [generated] * len(in_step))
            state = state.subset([in_step.index(i) for i in running], self.model.config)
            contexts = [rows[i] + new[i] for i in running]
            input_ids, step_mask, cache = (state.extend(contexts, self.pad_id)
                                           or self._new_batch(contexts))
            step, more = self._generate_rows(input_ids, step_mask, cache,
                                             [budgets[i] - len(new[i]) for i in running],
                                             sampling)
            for i, ids in zip(running, more, strict=True):
                new[i].extend(ids)
            in_step = running

    def _tokens_until(self, ids: list[int], chars: int) -> int:
        """How many of `ids` it takes for the decoded text to reach `chars` characters."""
        for n in range(1, len(ids) + 1):
            if len(self.decode(ids[:n])) >= chars:
                return n
        return len(ids)
