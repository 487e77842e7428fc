"""`LLDSGRPOTrainer`: TRL's GRPOTrainer with the LLDS term added to its loss.

TRL computes the policy's per-token log-probabilities once per micro-batch, inside
`_compute_loss`; this subclass keeps that tensor (no second forward pass) and adds
`nano.llds.llds_term` on it, scaled for gradient accumulation as TRL scales its own loss.

"old" is the log-probability when the completions were generated (TRL's
`old_per_token_logps`). TRL leaves it out when each generation batch is used for one
update only (`num_iterations=1` and `steps_per_generation <= gradient_accumulation_steps`):
the policy has not moved yet, old equals new, and the term is zero by construction. LLDS
acts where a batch is reused, as in verl's PPO mini-batches: set `num_iterations` >= 2 (or
`steps_per_generation` > `gradient_accumulation_steps`).
"""

from __future__ import annotations

import torch
from trl import GRPOTrainer

from nano.llds import LossConfig, displacement_metrics, likelihood_metrics, llds_term


class LLDSGRPOTrainer(GRPOTrainer):
    """GRPOTrainer + LLDS. `llds_lambda`: the term's weight (0: plain GRPO, with the
    displacement metrics still logged); `llds_unit`: "response" (LLDS-R) or "action" (LLDS-A:
    each contiguous run of generated tokens, e.g. between tool results, judged alone)."""

    def __init__(self, *args, llds_lambda: float = 0.1, llds_unit: str = "response",
                 **kwargs):
        self.llds = LossConfig(llds_lambda=llds_lambda, unit=llds_unit)  # checks the values
        self._policy_logps: torch.Tensor | None = None
        super().__init__(*args, **kwargs)

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        found = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        self._policy_logps = found[0]  # the last call in _compute_loss: the policy's, with grad
        return found

    def _compute_loss(self, model, inputs):
        self._policy_logps = None
        loss = super()._compute_loss(model, inputs)
        log_prob = self._policy_logps
        if log_prob is None:  # a TRL that computes them elsewhere: say so, don't guess
            raise RuntimeError("LLDSGRPOTrainer: this trl version computed no per-token "
                               "log-probabilities in _compute_loss; use trl 1.16")
        penalty, metrics = self.llds_penalty(log_prob, inputs)
        mode = "train" if self.model.training else "eval"
        if self.llds.llds_lambda > 0:
            scale = self.current_gradient_accumulation_steps if mode == "train" else 1.0
            loss = loss + penalty / scale
        for key, value in metrics.items():
            self._metrics[mode][key].append(value)
        return loss

    def llds_penalty(self, log_prob: torch.Tensor,
                     inputs: dict) -> tuple[torch.Tensor, dict[str, float]]:
        """The LLDS term of one micro-batch and its metrics, from TRL's inputs."""
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        mask = mask.to(log_prob.dtype)
        advantages = inputs["advantages"]
        if advantages.dim() > 1:  # per-token advantages: the response's first token's
            advantages = advantages[:, 0]
        old = inputs.get("old_per_token_logps")
        old = log_prob.detach() if old is None else old
        ref = inputs.get("ref_per_token_logps")
        penalty, metrics = llds_term(log_prob, old, advantages, mask, self.llds)
        # Per micro-batch; TRL logs their mean over the logging interval.
        metrics.update(likelihood_metrics(old, old if ref is None else ref, advantages, mask))
        metrics.update(displacement_metrics(old, old if ref is None else ref, advantages,
                                            mask))
        if ref is None:  # beta 0: no reference model, so no reference-model figures
            for key in ("actor/pos_avg_ref_log_prob", "actor/neg_avg_ref_log_prob",
                        "displacement/ref_log_ratio"):
                metrics.pop(key, None)
        return penalty, metrics
