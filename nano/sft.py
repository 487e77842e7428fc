"""Supervised training of the nano agent from scratch on teacher trajectories.

The objective is Search-R1's state masking: loss on the model's own tokens (its turns and
the end-of-turn token after its answer), none on the prompt, the inserted observations or
invalid-action notes. A model trained only that way learns the format fast but is slow to
learn to copy a title or a name out of the documents, so for the first part of training an
auxiliary language-model loss on the inserted documents (weight `doc_weight`, fading to 0)
teaches copying: a document's text repeats its title, as the answer repeats the document.
Continuing a name once started takes an induction circuit, which a model this small does
not grow from these trajectories on a CPU budget; `wire_induction` writes one into the fresh
weights (nano/wire.py).
"""

from __future__ import annotations

import json
import math
import random
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from nano import checkpoint
from nano.options import check_bounds, option

PROMPT, OWN, INSERTED, CONTENT = 0, 1, 2, 3  # what each token is, for the loss weights


@dataclass(frozen=True)
class TrainConfig:
    data: Path = option(Path("nano-data/train.jsonl"),
                        "train.jsonl of trajectories (python -m nano data)")
    tokenizer: Path = option(Path("nano-data/tokenizer"), "the tokenizer directory")
    out: Path = option(Path("nano-run"), "where the checkpoint and the model go")
    init: Path | None = option(None, "start from this saved model instead of from scratch")
    # More capacity without relearning what --init already does (nano/grow.py).
    grow_layers: int = option(0, "with --init: append layers that start silent, up to this "
                                 "many in all (0: as saved)")
    grow_intermediate: int = option(0, "with --init: widen every MLP to this many units, the "
                                       "new ones silent at first (0: as saved)")
    resume: bool = option(False, "go on from OUT/checkpoint (an existing one is refused "
                                 "without this flag)")
    hidden: int = option(256, "width of the residual stream")
    layers: int = option(4, "transformer layers")
    heads: int = option(4, "attention heads (they divide --hidden)")
    kv_heads: int = option(2, "key/value heads (they divide --heads)")
    intermediate: int = option(768, "width of the MLP")
    max_len: int = option(2048, "longer trajectories are cut (the loss needs no more)")
    batch_tokens: int = option(4096, "padded tokens per step")
    steps: int = option(1800, "optimizer steps")
    minutes: float = option(0.0, "when > 0, also a time budget: the schedule follows "
                                 "whichever ends first")
    lr: float = option(2e-3, "peak learning rate (cosine to a tenth of it)")
    warmup: int = option(50, "linear warm-up steps")
    weight_decay: float = option(0.01, "AdamW weight decay")
    doc_weight: float = option(0.5, "weight of the auxiliary LM loss on inserted text ...")
    doc_fade_start: float = option(0.4, "... at full weight until this fraction of the run ...")
    doc_fade_end: float = option(0.7, "... and 0 from here on (state masking alone)")
    limit: int | None = option(None, "at most this many trajectories")
    # The same tokens as the start of each trajectory, ten times cheaper, so copying the
    # question into the query is seen far more often per second of training.
    first_turns: bool = option(False, "also train on each run's first turn alone")
    # The fixed wording around the query and the answer is learnt in a few hundred steps.
    content_weight: float = option(1.0, "weight of the tokens inside <search>/<answer> "
                                        "against the model's other tokens")
    # Answers are names cut into several tokens, copied out of a document: that takes
    # induction heads (find the token before, copy what came after it), and repeated text
    # is the classic way to grow them. At this model size they form only slowly.
    copy_drills: int = option(0, "extra sequences: a window of a training document, then "
                                 "the same window again, with the document loss on the repeat")
    # Only an induction head lowers the loss on these batches. With wire_induction the
    # circuit is there from step 0 and these batches keep it.
    induction_steps: int = option(0, "a first stage of this many steps on random-token "
                                     "sequences and spans copied out of them")
    # Without them the trajectories' gradients erase what the stage grew within a few
    # hundred steps.
    induction_every: int = option(0, "after the stage, every this-many-th step is such a "
                                     "batch again (0: never)")
    # A name the question's words do not predict, so only copying it out of the documents
    # lowers the loss.
    swap_answers: float = option(0.0, "this fraction of the runs gets its answer replaced, "
                                      "in documents and answer alike, by another run's "
                                      "answer of the same family")
    # rope_theta becomes 1e6 so the matching head's rotary pairs barely turn.
    wire_induction: bool = option(False, "write an induction circuit into the fresh weights "
                                         "before training (nano/wire.py); not with --init")
    seed: int = option(0, "seeds the weights, the batch order and the drills")
    threads: int = option(2, "torch threads")
    # A lent GPU trains the same model many times faster; the weights it saves run on CPU.
    device: str = option("cpu", "where to train: cpu, cuda or cuda:N")
    save_every: int = option(100, "steps between checkpoints")
    log_every: int = option(25, "steps between log lines")

    def __post_init__(self) -> None:
        """Values that cannot train, refused with what to pass instead."""
        check_bounds(self, at_least_one=("hidden", "layers", "heads", "kv_heads",
                                         "intermediate", "max_len", "batch_tokens", "threads",
                                         "save_every", "log_every"),
                     not_negative=("steps", "minutes", "warmup", "weight_decay", "doc_weight",
                                   "copy_drills", "induction_steps", "induction_every",
                                   "content_weight", "grow_layers", "grow_intermediate"))
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"--limit is {self.limit}; give at least 1 (or leave it out).")
        if not self.lr > 0:
            raise ValueError(f"--lr is {self.lr}; it must be above 0.")
        if not 0 <= self.swap_answers <= 1:
            raise ValueError(f"--swap-answers is {self.swap_answers}; it is a fraction, 0 to 1.")
        if not 0 <= self.doc_fade_start <= self.doc_fade_end <= 1:
            raise ValueError(f"--doc-fade-start {self.doc_fade_start} and --doc-fade-end "
                             f"{self.doc_fade_end} are fractions of the run, start <= end.")
        if self.hidden % self.heads:
            raise ValueError(f"--heads {self.heads} does not divide --hidden {self.hidden}: "
                             "each head gets hidden/heads dimensions; pick a divisor.")
        if self.heads % self.kv_heads:
            raise ValueError(f"--kv-heads {self.kv_heads} does not divide --heads "
                             f"{self.heads}; pick a divisor.")
        if self.wire_induction and self.init is not None:
            raise ValueError(f"--wire-induction writes a circuit into fresh weights, and --init "
                             f"{self.init} gives trained ones that would be used as they are: "
                             "pass one of the two.")
        if not re.fullmatch(r"cpu|cuda(?::\d+)?", self.device):
            raise ValueError(f"--device is {self.device!r}; pass cpu, cuda or cuda:N.")
        if (self.grow_layers or self.grow_intermediate) and self.init is None:
            raise ValueError("--grow-layers and --grow-intermediate grow a trained model: pass "
                             "it with --init (a fresh one takes --layers and --intermediate).")


def _has_tokenizer(path: Path) -> bool:
    return (path / "tokenizer.json").is_file() or (path / "tokenizer_config.json").is_file()


def check_paths(config: TrainConfig) -> None:
    """The files the run reads exist and OUT can take it: a ValueError saying what to pass,
    before anything is loaded or written."""
    if not Path(config.data).is_file():
        raise ValueError(f"--data {config.data}: no such file; write the trajectories with "
                         "`python -m nano data` or pass the path of a train.jsonl.")
    if not _has_tokenizer(Path(config.tokenizer)):
        raise ValueError(f"--tokenizer {config.tokenizer}: no tokenizer there (no "
                         "tokenizer.json); pass the tokenizer/ directory `python -m nano "
                         "data` wrote.")
    if config.init is not None and not (Path(config.init) / "config.json").is_file():
        raise ValueError(f"--init {config.init}: no saved model there (no config.json); pass "
                         "the directory of a model this trainer saved.")
    checkpoint.check_out(Path(config.out), config.resume)


def encode_record(record: dict, tokenizer, turns: int | None = None
                  ) -> tuple[list[int], list[int]]:
    """Token ids and their kinds, segment by segment as the backend tokenizes a context.

    With `turns`, only the prompt and that many segments after it (a prefix of the run).
    """
    ids, kinds = [], []
    segments = record["segments"] if turns is None else record["segments"][:turns + 1]
    for n, (text, generated) in enumerate(segments):
        piece = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids += piece
        if generated:
            kinds += _own_kinds(piece, tokenizer)
        else:
            kinds += [PROMPT if n == 0 else INSERTED] * len(piece)
    if turns is not None and turns + 1 < len(record["segments"]):
        return ids, kinds
    ids.append(tokenizer.convert_tokens_to_ids("<|im_end|>"))  # the answer ends the turn
    kinds.append(OWN)
    return ids, kinds


def _own_kinds(piece: list[int], tokenizer) -> list[int]:
    """OWN for a turn's tokens, CONTENT for those inside its <search> or <answer> tags."""
    opening = {tokenizer.convert_tokens_to_ids(t) for t in ("<search>", "<answer>")}
    closing = {tokenizer.convert_tokens_to_ids(t) for t in ("</search>", "</answer>")}
    kinds, inside = [], False
    for token in piece:
        if token in closing:
            inside = False
        kinds.append(CONTENT if inside else OWN)
        if token in opening:
            inside = True
    return kinds


def swap_answer(record: dict, new: str) -> dict | None:
    """The run with its answer replaced by `new` wherever it stands as a whole word after the
    prompt (titles, document text, the answer); None when that cannot be done cleanly: the
    prompt names the answer, or no document holds it."""
    old = record["answers"][0]
    pattern = re.compile(r"(?<!\w)" + re.escape(old) + r"(?!\w)")
    prompt, *rest = record["segments"]
    if pattern.search(prompt[0]) or not any(pattern.search(t) for t, g in rest if not g):
        return None
    segments = [prompt] + [[pattern.sub(lambda _: new, t), g] for t, g in rest]
    return {**record, "answers": [new], "segments": segments}


_NUMBER = re.compile(r"[\d,.]+|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve")
_YEAR = re.compile(r"\d{3,4}(?: BC| AD| BCE| CE)?|\d{1,4} (?:BC|AD|BCE|CE)")


def answer_kind(answer: str) -> str:
    """year, number or name: a swapped answer is drawn from the same kind, so that a "who"
    question is never taught a year."""
    if _YEAR.fullmatch(answer):
        return "year"
    return "number" if _NUMBER.fullmatch(answer.lower()) else "name"


def read_trajectories(config: TrainConfig) -> list[dict]:
    """The runs, a `swap_answers` fraction of them with the answer of another run of the same
    family and answer kind swapped in."""
    with open(config.data, encoding="utf-8") as lines:
        records = [json.loads(line) for line in lines if line.strip()]
    records = records[:config.limit] if config.limit else records
    if not config.swap_answers:
        return records
    rng = random.Random(config.seed + 1)
    pools: dict[str, list[str]] = {}
    for record in records:
        key = (record.get("family", ""), answer_kind(record["answers"][0]))
        pools.setdefault(key, []).append(record["answers"][0])
    out = []
    for record in records:
        pool = pools[(record.get("family", ""), answer_kind(record["answers"][0]))]
        new = rng.choice(pool)
        if rng.random() < config.swap_answers and new != record["answers"][0]:
            record = swap_answer(record, new) or record
        out.append(record)
    return out


def load_examples(config: TrainConfig, tokenizer) -> list[tuple[list[int], list[int]]]:
    examples, documents = [], []
    for record in read_trajectories(config):
        ids, kinds = encode_record(record, tokenizer)
        examples.append((ids[:config.max_len], kinds[:config.max_len]))
        if config.first_turns:
            examples.append(encode_record(record, tokenizer, turns=1))
        if config.copy_drills and len(documents) < 4 * config.copy_drills:
            documents.append([t for t, k in zip(ids, kinds, strict=True) if k == INSERTED])
    if not examples:
        raise ValueError(f"{config.data} holds no trajectories: run `python -m nano data` first.")
    return examples + copy_drills(documents, config.copy_drills, random.Random(config.seed))


def copy_drills(documents: list[list[int]], count: int, rng: random.Random,
                shortest: int = 24, longest: int = 96) -> list[tuple[list[int], list[int]]]:
    """`count` sequences: a window of an inserted observation, then the same window again;
    only the repeat carries loss (as inserted text), so the loss rewards copying. Every
    other window is shuffled first: with no language to predict it from, the repeat can
    only be copied, not predicted."""
    documents = [d for d in documents if len(d) > shortest]
    drills = []
    for n in range(count if documents else 0):
        doc = rng.choice(documents)
        size = rng.randint(shortest, min(longest, len(doc)))
        start = rng.randrange(len(doc) - size + 1)
        window = doc[start:start + size]
        if n % 2:
            rng.shuffle(window)
        drills.append((window + window, [PROMPT] * size + [INSERTED] * size))
    return drills


def induction_examples(rng: random.Random, low: int, high: int, rows: int = 12,
                       context: tuple[int, int] = (64, 320), probes: int = 3,
                       span: tuple[int, int] = (8, 48)) -> list[tuple[list[int], list[int]]]:
    """`rows` sequences of random ordinary tokens, then `probes` spans copied out of them
    from random places: each span's first token is given, the rest carry the loss (as
    inserted text). Random lengths and places matter: a repeat at a fixed distance is solved
    by a head that looks a fixed number of tokens back, which cannot continue a name read
    anywhere in a document; here only a head that finds the token just written earlier in
    the context and copies what followed it (an induction head) lowers the loss, and
    continuing a name read in a document is exactly that."""
    out = []
    for _ in range(rows):
        length = rng.randint(*context)
        text = [rng.randrange(low, high) for _ in range(length)]
        ids, kinds = list(text), [PROMPT] * length
        for _ in range(probes):
            size = rng.randint(*span)
            start = rng.randrange(length - size + 1)
            ids += text[start:start + size]
            kinds += [PROMPT] + [INSERTED] * (size - 1)
        out.append((ids, kinds))
    return out


def make_batches(lengths: list[int], batch_tokens: int, rng: random.Random) -> list[list[int]]:
    """Batches of similar length (little padding), each at most batch_tokens padded tokens."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], rng.random()))
    batches, current, width = [], [], 0
    for i in order:
        new_width = max(width, lengths[i])
        if current and new_width * (len(current) + 1) > batch_tokens:
            batches.append(current)
            current, new_width = [], lengths[i]
        current.append(i)
        width = new_width
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


def progress(config: TrainConfig, step: int, seconds: float) -> float:
    """How far through the run (0..1): by steps, or by the time budget if that is nearer."""
    frac = step / config.steps if config.steps > 0 else 1.0
    if config.minutes > 0:
        frac = max(frac, seconds / (60 * config.minutes))
    return min(1.0, frac)


def doc_weight_at(config: TrainConfig, frac: float) -> float:
    if frac <= config.doc_fade_start:
        return config.doc_weight
    if frac >= config.doc_fade_end:
        return 0.0
    span = config.doc_fade_end - config.doc_fade_start
    return config.doc_weight * (config.doc_fade_end - frac) / span


def lr_at(config: TrainConfig, step: int, frac: float) -> float:
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def model_config(config: TrainConfig, tokenizer):
    from transformers import Qwen2Config

    eos = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    return Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=config.hidden, num_hidden_layers=config.layers,
        num_attention_heads=config.heads, num_key_value_heads=config.kv_heads,
        intermediate_size=config.intermediate, max_position_embeddings=4096,
        tie_word_embeddings=True, rope_theta=1e6 if config.wire_induction else 10000.0,
        bos_token_id=eos[1],
        eos_token_id=eos[0], pad_token_id=tokenizer.pad_token_id)


def batch_loss(model, examples, indices, doc_weight: float, content_weight: float = 1.0):
    """(loss to minimise, own-token loss, inserted-text loss, tokens) for one batch."""
    import torch
    import torch.nn.functional as F

    width = max(len(examples[i][0]) for i in indices)
    ids = torch.zeros(len(indices), width, dtype=torch.long)
    kinds = torch.full((len(indices), width), PROMPT, dtype=torch.long)
    for row, i in enumerate(indices):
        seq, kind = examples[i]
        ids[row, :len(seq)] = torch.tensor(seq)
        kinds[row, :len(kind)] = torch.tensor(kind)
    # Right padding with the causal mask: pads only ever see real tokens before them and
    # carry no loss, so no attention mask is needed (and the fast causal kernel is used).
    ids, kinds = ids.to(model.device), kinds.to(model.device)
    body, head = body_and_head(model)
    hidden = body(input_ids=ids).last_hidden_state[:, :-1]
    target, kind = ids[:, 1:], kinds[:, 1:]
    weights = (kind == OWN).float() + content_weight * (kind == CONTENT).float()
    inserted = (kind == INSERTED).float()
    # The vocabulary projection is a quarter of this model's compute: run it only where a
    # loss is counted (the model's own tokens, and the documents while they carry weight).
    counted = (weights > 0) | (inserted > 0) if doc_weight > 0 else weights > 0
    logits = head(hidden[counted])
    ce = F.cross_entropy(logits.float(), target[counted], reduction="none")
    mine, docs = weights[counted], inserted[counted]
    own_loss = (ce * mine).sum() / mine.sum().clamp(min=1)
    doc_loss = (ce * docs).sum() / docs.sum().clamp(min=1)
    loss = own_loss + doc_weight * doc_loss if doc_weight > 0 else own_loss
    return loss, own_loss.item(), doc_loss.item(), ids.numel()


def body_and_head(model):
    """(the transformer, its output layer): Qwen2's `model` and `lm_head`; a BERT causal
    LM's `bert` and `cls` (transform and decoder, from `python -m nano warm`)."""
    if hasattr(model, "lm_head"):
        return model.model, model.lm_head
    return model.bert, model.cls


def save_model(model, tokenizer, directory: Path) -> None:
    from transformers import GenerationConfig

    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(directory), safe_serialization=True)
    tokenizer.save_pretrained(str(directory))
    eos = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    GenerationConfig(eos_token_id=eos, pad_token_id=tokenizer.pad_token_id, do_sample=False,
                     bos_token_id=eos[1]).save_pretrained(str(directory))


def _save_checkpoint(model, optimizer, step: int, history: list, config: TrainConfig,
                     elapsed: float) -> None:
    import torch

    def write_files(path: Path) -> None:
        model.save_pretrained(str(path), safe_serialization=True)
        (path / "train_config.json").write_text(json.dumps(asdict(config), default=str,
                                                           indent=1))

    checkpoint.save(config.out / "checkpoint", write_files,
                    {"optimizer": optimizer.state_dict(), "step": step, "history": history,
                     "elapsed": elapsed, "torch_rng": torch.get_rng_state()})


def train(config: TrainConfig, log=print) -> dict:
    """Train (or, with config.resume, go on from OUT/checkpoint) and save the model to
    config.out; returns the run's summary."""
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2ForCausalLM

    check_paths(config)
    if config.device != "cpu" and not torch.cuda.is_available():
        raise ValueError(f"--device {config.device}: torch sees no CUDA GPU on this machine; "
                         "train with --device cpu (the default).")
    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    tokenizer = AutoTokenizer.from_pretrained(str(config.tokenizer))
    examples = load_examples(config, tokenizer)
    lengths = [len(e[0]) for e in examples]
    ckpt = config.out / "checkpoint"
    step, history, elapsed_before = 0, [], 0.0
    if config.resume and checkpoint.exists(ckpt):
        state = checkpoint.load_state(ckpt)  # first: it completes an interrupted rotation
        model = AutoModelForCausalLM.from_pretrained(str(ckpt))
        step, history, elapsed_before = state["step"], state["history"], state["elapsed"]
        torch.set_rng_state(state["torch_rng"])
        log(f"resuming from {ckpt} at step {step}")
    elif config.init is not None:
        model = AutoModelForCausalLM.from_pretrained(str(config.init))  # Qwen2 or BERT
        if model.config.vocab_size != len(tokenizer):
            raise ValueError(f"--init {config.init} has a vocabulary of "
                             f"{model.config.vocab_size}, the tokenizer {len(tokenizer)}: "
                             "give the tokenizer the model was trained with.")
        state = None
        log(f"starting from the weights in {config.init}")
        if config.grow_layers or config.grow_intermediate:
            from nano.grow import grow

            model = grow(model, config.grow_layers, config.grow_intermediate, seed=config.seed)
            log(f"grown to {model.config.num_hidden_layers} layers, MLP "
                f"{model.config.intermediate_size} wide (new parts silent; nano/grow.py)")
    else:
        model = Qwen2ForCausalLM(model_config(config, tokenizer))
        if config.wire_induction:
            from nano.wire import wire_induction

            wire_induction(model, seed=config.seed)
            log("wrote the induction circuit into the fresh weights (nano/wire.py)")
        state = None
    model.to(config.device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(0.9, 0.98),
                                  weight_decay=config.weight_decay)
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
    params = sum(p.numel() for p in model.parameters())
    log(f"{len(examples)} sequences (runs, first turns, drills), {sum(lengths)} tokens, "
        f"{params / 1e6:.2f}M parameters, {config.steps} steps of ≤{config.batch_tokens} tokens")
    # The batch order is a function of the seed and the epoch: a resumed run sees the same.
    epoch_batches: dict[int, list[list[int]]] = {}

    def batch_for(n: int) -> list[int]:
        epoch, seen = 0, 0
        while True:
            if epoch not in epoch_batches:
                epoch_batches[epoch] = make_batches(lengths, config.batch_tokens,
                                                    random.Random(config.seed * 1000 + epoch))
            if n < seen + len(epoch_batches[epoch]):
                return epoch_batches[epoch][n - seen]
            seen += len(epoch_batches[epoch])
            epoch += 1

    start = time.perf_counter()
    tokens, copy_loss = 0, float("nan")
    bar = tqdm(total=config.steps, initial=step, desc="sft", mininterval=5)
    frac = progress(config, step, elapsed_before)
    while frac < 1.0:
        for group in optimizer.param_groups:
            group["lr"] = lr = lr_at(config, step, frac)
        weight = doc_weight_at(config, frac)
        if step < config.induction_steps or (
                config.induction_every and step % config.induction_every == 0):
            drills = induction_examples(random.Random(config.seed * 100_003 + step),
                                        low=3, high=tokenizer.vocab_size)
            loss, own, doc, n = batch_loss(model, drills, range(len(drills)), 1.0)
            copy_loss = doc
        else:
            batch = batch_for(step)
            loss, own, doc, n = batch_loss(model, examples, batch, weight, config.content_weight)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step += 1
        tokens += n
        history.append((step, round(own, 4), round(doc, 4)))
        bar.update(1)
        bar.set_postfix(own=f"{own:.3f}", doc=f"{doc:.3f}")
        elapsed = time.perf_counter() - start
        frac = progress(config, step, elapsed_before + elapsed)
        if step % config.log_every == 0 or frac >= 1.0:
            log(f"step {step} own {own:.4f} doc {doc:.4f} copy {copy_loss:.3f} doc_w {weight:.2f} "
                f"lr {lr:.2e} {tokens / elapsed:.0f} tok/s "
                f"{(elapsed_before + elapsed) / 60:.1f} min ({100 * frac:.0f}%)")
        if step % config.save_every == 0 or frac >= 1.0:
            _save_checkpoint(model, optimizer, step, history, config, elapsed_before + elapsed)
    bar.close()
    total = elapsed_before + time.perf_counter() - start
    model.to("cpu").eval()  # the saved weights are the CPU model's
    save_model(model, tokenizer, config.out)
    summary = {"steps": step, "seconds": round(total, 1), "parameters": params,
               "sequences": len(examples), "first_own_loss": history[0][1] if history else None,
               "last_own_loss": history[-1][1] if history else None,
               "config": {k: str(v) for k, v in asdict(config).items()}}
    (config.out / "train_summary.json").write_text(json.dumps(summary, indent=1))
    log(f"done: {step} steps in {total / 60:.1f} min, saved to {config.out}")
    return summary
