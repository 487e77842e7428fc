"""A hand-wired induction circuit, written into a fresh model's weights before training.

Continuing a name read in a document needs an induction circuit: a head that copies each
token's predecessor into it (layer 0), and a head that finds the place where the current
token was written before and copies what followed it (layer 1). Language models grow it
only after far more tokens than a CPU run of this model sees, so this module writes it in,
as interpretability work builds circuits by hand, and training starts from there.

The residual stream gets three parts: `TOKEN` dims hold a random code of the current token
(in the embedding, which the output head shares), `PREVIOUS` dims receive the previous
token's code from layer 0's head 0, and the rest is left to training. Qwen2's rotary
position embedding is used as it is: layer 0's head scores positions only through its
biases, with the high-frequency rotary pairs peaked at one token back; layer 1's head
matches codes in the low-frequency pairs, which barely turn over a few thousand tokens
(hence rope_theta 1e6).
"""

from __future__ import annotations

import math

CODE = 64  # dims of the token code, at the start of the residual stream
MATCH = 32  # of which the first this-many are matched (the low-frequency rotary pairs)
TOKEN = slice(0, CODE)  # the current token's code
PREVIOUS = slice(CODE, CODE + MATCH)  # the previous token's matched code, from layer 0


def wire_induction(model, seed: int = 0, sharpness: float = 40.0, gain: float = 6.0) -> None:
    """Overwrite the embedding and layers 0-1's head 0 of a fresh Qwen2 model (in place)."""
    import torch

    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    half = head_dim // 2
    layers = config.num_hidden_layers
    if config.hidden_size < CODE + MATCH + 32 or head_dim < 2 * MATCH or layers < 2:
        raise ValueError("wire_induction needs hidden >= 128, head_dim >= 64 and 2+ layers")
    theta = _rope_theta(config)
    freqs = theta ** (-torch.arange(half, dtype=torch.float64) / half)  # pair i: dims i, i+half
    group = config.num_attention_heads // config.num_key_value_heads
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        emb = model.model.embed_tokens.weight
        code = torch.randn(emb.shape[0], CODE, generator=g)
        # Each half unit-norm: the matched half scores exactly 1 against itself.
        code[:, :MATCH] /= code[:, :MATCH].norm(dim=1, keepdim=True)
        code[:, MATCH:] /= code[:, MATCH:].norm(dim=1, keepdim=True)
        emb[:, TOKEN] = code / math.sqrt(2)
        emb[:, CODE:] *= 0.5  # the rest: small, so the code sets the norm

        # Layer 0, head 0: attend one token back, whatever the tokens are.
        attn = model.model.layers[0].self_attn
        high = [i for i in range(half) if freqs[i] > 0.05]  # pairs that turn fast
        q_bias = torch.zeros(head_dim, dtype=torch.float64)
        k_bias = torch.zeros(head_dim, dtype=torch.float64)
        for i in high:
            q_bias[i] = 1.0
            k_bias[i], k_bias[i + half] = math.cos(freqs[i]), math.sin(freqs[i])
        scale = math.sqrt(sharpness * math.sqrt(head_dim) / _peak_gap(freqs, high))
        rms = math.sqrt(config.hidden_size)  # a unit-norm code comes out of the norm at this size
        _blank_head0(attn, head_dim, group)
        attn.q_proj.bias[:head_dim] = (scale * q_bias).float()
        attn.k_proj.bias[:head_dim] = (scale * k_bias).float()
        attn.v_proj.weight[:MATCH, :MATCH] = torch.eye(MATCH)  # the matched half of the code
        attn.o_proj.weight[PREVIOUS, :MATCH] = torch.eye(MATCH) / rms

        # Layer 1, head 0: match the current token's code against each place's previous
        # token, then write the code of the token found there into the TOKEN dims.
        attn = model.model.layers[1].self_attn
        low = list(range(half - MATCH // 2, half))  # the slowest pairs
        rows = [d for i in low for d in (i, i + half)]
        strength = math.sqrt(sharpness * math.sqrt(head_dim)) / rms
        _blank_head0(attn, head_dim, group)
        attn.q_proj.weight[rows, :MATCH] = torch.eye(MATCH) * strength
        attn.k_proj.weight[rows, PREVIOUS] = torch.eye(MATCH) * strength
        attn.v_proj.weight[:CODE, TOKEN] = torch.eye(CODE)
        attn.o_proj.weight[TOKEN, :CODE] = torch.eye(CODE) * gain / rms


def _blank_head0(attn, head_dim: int, group: int) -> None:
    """Zero head 0's query, KV head 0's key and value, and the output of every head that
    shares that KV head, so only what the caller writes next flows through them."""
    for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
        proj.weight[:head_dim] = 0
        proj.bias[:head_dim] = 0
    attn.o_proj.weight[:, :head_dim * group] = 0


def _rope_theta(config) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def _peak_gap(freqs, pairs: list[int], reach: int = 4096) -> float:
    """How much higher the score one token back is than at any other distance up to reach."""
    import torch

    d = torch.arange(reach, dtype=torch.float64)
    score = torch.cos((d[:, None] - 1) * freqs[pairs][None, :]).sum(1)
    return float(score[1] - torch.cat([score[:1], score[2:]]).max())
