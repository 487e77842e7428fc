"""Grow a trained Qwen2 model without changing what it computes.

A wider or deeper model trained from scratch would spend its first hour of CPU relearning
what the shipped one already does (the protocol's format, when to search, which span to
copy). Growing it instead keeps every trained weight and adds capacity that starts silent:

- a wider MLP: the new hidden units get small random input weights and an output weight of
  zero, so they add nothing until training moves that output weight;
- more layers, appended after the last one: each new layer's attention output projection
  and MLP output projection are zero, so the layer adds nothing to the residual stream.

Either way the grown model's logits equal the original's exactly at step 0 (tested), and
the gradient reaches the new weights through the zero projections from the first step.
"""

from __future__ import annotations


def grow(model, layers: int = 0, intermediate: int = 0, seed: int = 0):
    """A new Qwen2ForCausalLM with `layers` decoder layers and MLPs `intermediate` wide
    (0: as they are), computing exactly what `model` computes."""
    import copy

    import torch
    from transformers import Qwen2ForCausalLM

    old = model.config
    layers = layers or old.num_hidden_layers
    intermediate = intermediate or old.intermediate_size
    if layers < old.num_hidden_layers or intermediate < old.intermediate_size:
        raise ValueError(f"growing only adds: the model has {old.num_hidden_layers} layers and "
                         f"an MLP {old.intermediate_size} wide, asked for {layers} and "
                         f"{intermediate}; pass at least as many of each.")
    config = copy.deepcopy(old)
    config.num_hidden_layers, config.intermediate_size = layers, intermediate
    if getattr(config, "layer_types", None) is not None:  # one attention type per layer
        config.layer_types = [old.layer_types[0]] * layers
    torch.manual_seed(seed)
    grown = Qwen2ForCausalLM(config).to(model.dtype)
    source = model.state_dict()
    with torch.no_grad():
        for name, target in grown.state_dict().items():
            index = _layer_index(name)
            if index is not None and index >= old.num_hidden_layers:
                if name.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight")):
                    target.zero_()  # a new layer adds nothing until trained
                continue
            weight = source[name]
            if weight.shape == target.shape:
                target.copy_(weight)
            elif name.endswith(("mlp.gate_proj.weight", "mlp.up_proj.weight")):
                target[: weight.shape[0]] = weight  # new rows keep their random init
            elif name.endswith("mlp.down_proj.weight"):
                target.zero_()
                target[:, : weight.shape[1]] = weight  # new units' outputs start at zero
            else:
                raise ValueError(f"cannot grow {name}: {tuple(weight.shape)} → "
                                 f"{tuple(target.shape)}")
    grown.generation_config = model.generation_config
    return grown


def _layer_index(name: str) -> int | None:
    parts = name.split(".")
    if "layers" in parts:
        return int(parts[parts.index("layers") + 1])
    return None
