"""A small byte-level BPE for the nano agent, with Qwen's special tokens and chat template.

Saved as a `PreTrainedTokenizerFast`, so `AutoTokenizer.from_pretrained(dir)` loads it and
`apply_chat_template` builds the Search-R1 prompt as it does for the real checkpoints.
The protocol's tags are added (non-special) tokens: one token each, decoded as text. So is
the fixed instruction before the question: the prompt costs a handful of tokens instead of
~90, which makes training and every question cheaper; the text the model sees is unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable

from agent import protocol

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
# The instruction up to the question, exactly as protocol.INSTRUCTION writes it.
INSTRUCTION_PREFIX = protocol.INSTRUCTION.split("{question}")[0]

# Qwen2.5's template without its default system prompt (the nano agent has no persona).
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4096):
    """Train the BPE on `texts` and wrap it as a transformers fast tokenizer."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(texts, trainer=trainer)
    bpe.add_tokens([AddedToken(t, normalized=False, special=False)
                    for t in (*protocol.PROTOCOL_TAGS, INSTRUCTION_PREFIX)])
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token=IM_END, pad_token=ENDOFTEXT,
        additional_special_tokens=[IM_START], chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False, model_max_length=4096)


def protocol_texts() -> list[str]:
    """The protocol's own strings, so the BPE merges them well."""
    return [protocol.INSTRUCTION, protocol.INVALID_ACTION_MESSAGE,
            protocol.observation(protocol.render_documents(['"Title"\ntext'] * 3))] * 50


def build_tokenizer(records: list[dict], vocab_size: int = 4096):
    texts = [r["contents"] for r in records] + protocol_texts()
    return train_tokenizer(texts, vocab_size)
