"""The nano search agent: a few-million-parameter Qwen2 trained by this project on the
embedded corpus with the exact Search-R1 protocol (data, tokenizer, SFT trainer)."""
