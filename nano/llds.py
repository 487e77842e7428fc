"""The GRPO loss and the LLDS term, as pure tensor functions (no model, no I/O).

Shapes: B responses, R response tokens (padded). `mask` is 1 on tokens the model generated
(state masking: prompt padding, observations and invalid-action notes are 0). The
definitions are those of the LLDS fork of verl: group-normalised outcome advantages
((r - mean) / (std + 1e-6) per group of the same prompt), the PPO clipped ratio,
`low_var_kl` to the frozen reference as a loss, and the LLDS penalty lambda * max(0,
old - new) on the generated tokens of responses with advantage >= 0 whose likelihood fell
(judged per response, or per action: a contiguous run of generated tokens). Two gate
controls that the fork does not have (`tolerance`, `positive`) and the per-step
displacement measures are defined here too; docs/llds.md states every rule.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

EPS = 1e-6
UNITS = ("response", "action")
# Which preserving units the LLDS term penalises:
#   lazy       the fork's rule: A >= 0 and sum(old - new) over the unit > 0;
#   tolerance  A >= 0 and sum(old - new) > gate_tolerance x the unit's generated tokens, so
#              float noise between the old and new passes (1e-6..1e-5 a token) opens nothing;
#   positive   the fork's test, on responses with A > 0 only (no ties, no all-wrong groups).
GATES = ("lazy", "tolerance", "positive")


@dataclass(frozen=True)
class LossConfig:
    clip_ratio: float = 0.2
    kl_coef: float = 0.001  # low_var_kl to the frozen reference, as a loss
    entropy_coef: float = 0.0  # the recipe has no entropy bonus
    llds_lambda: float = 0.0  # `no_reduce_lambda`; 0 is plain GRPO
    answer_lambda: float = 0.0  # `answer_no_reduce_lambda`: the answer span's weight (MA)
    unit: str = "response"  # what the gate judges: "response" (LLDS-R), "action" (LLDS-A)
    gate: str = "lazy"  # which fallen units are penalised (GATES)
    gate_tolerance: float = 1e-4  # per generated token; used by the "tolerance" gate only

    def __post_init__(self):
        if self.unit not in UNITS:
            raise ValueError(f"unit must be 'response' or 'action', not {self.unit!r}")
        if self.gate not in GATES:
            raise ValueError(f"gate must be one of {', '.join(GATES)}, not {self.gate!r}")
        if self.llds_lambda < 0 or self.answer_lambda < 0:
            raise ValueError("the LLDS weights (--lambda, --answer-lambda) must be >= 0")
        if not self.gate_tolerance >= 0:
            raise ValueError(f"--gate-tolerance is {self.gate_tolerance}; it must be >= 0")

    def preserving(self, advantages: torch.Tensor) -> torch.Tensor:
        """The responses the term may hold (bool, B): A >= 0, or A > 0 for "positive"."""
        return advantages > 0 if self.gate == "positive" else advantages >= 0

    @property
    def tolerance(self) -> float:
        """Per generated token, the decrease a unit must exceed to count as fallen."""
        return self.gate_tolerance if self.gate == "tolerance" else 0.0


def group_advantages(rewards: torch.Tensor, groups: Sequence[Hashable]) -> torch.Tensor:
    """(r - mean) / (std + 1e-6) within each group of the same prompt (unbiased std).

    A group of one gets mean 0 and std 1, as verl's GRPO advantage does.
    """
    rewards = rewards.float()
    out = torch.empty_like(rewards)
    members: dict[Hashable, list[int]] = {}
    for i, group in enumerate(groups):
        members.setdefault(group, []).append(i)
    for index in members.values():
        scores = rewards[index]
        if len(index) == 1:
            mean, std = torch.tensor(0.0), torch.tensor(1.0)
        else:
            mean, std = scores.mean(), scores.std()
        out[index] = (scores - mean) / (std + EPS)
    return out


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum()


def low_var_kl(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """The k3 estimator of KL(new || ref) per token, clamped to [-10, 10] as verl does."""
    kl = ref_log_prob - log_prob
    return torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)


def entropy(log_probs: torch.Tensor) -> torch.Tensor:
    """Entropy of each distribution over the last dimension, from its log-probabilities."""
    return -(log_probs.exp() * log_probs).sum(-1)


def action_ids(mask: torch.Tensor) -> torch.Tensor:
    """Per token: 0 outside the mask, k for the k-th contiguous run of masked tokens (an
    action: one generated turn between two inserted pieces)."""
    mask = mask.bool()
    before = F.pad(mask[:, :-1], (1, 0), value=False)
    starts = mask & ~before
    return starts.long().cumsum(dim=1) * mask.long()


def _per_action_sums(values: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """(B, K+1) sums of `values` per action id; column 0 collects the unmasked tokens."""
    width = int(ids.max()) + 1 if ids.numel() else 1
    sums = values.new_zeros((values.shape[0], width))
    return sums.scatter_add(1, ids, values)


def grpo_loss(log_prob: torch.Tensor, old_log_prob: torch.Tensor, ref_log_prob: torch.Tensor,
              advantages: torch.Tensor, mask: torch.Tensor, entropy: torch.Tensor,
              config: LossConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """Plain GRPO (Search-R1): PPO clipped ratio + kl_coef * low_var_kl - entropy bonus."""
    token_adv = advantages[:, None] * mask
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    unclipped = -token_adv * ratio
    clipped = -token_adv * torch.clamp(ratio, 1 - config.clip_ratio, 1 + config.clip_ratio)
    pg_loss = masked_mean(torch.maximum(unclipped, clipped), mask)
    entropy_loss = masked_mean(entropy, mask)
    kl_loss = masked_mean(low_var_kl(log_prob, ref_log_prob), mask)
    loss = pg_loss - config.entropy_coef * entropy_loss + config.kl_coef * kl_loss
    metrics = {
        "actor/pg_loss": pg_loss.item(),
        "actor/pg_clipfrac": masked_mean(torch.gt(clipped, unclipped).float(), mask).item(),
        "actor/ppo_kl": masked_mean(-log_ratio, mask).item(),
        "actor/entropy_loss": entropy_loss.item(),
        "actor/kl_loss": kl_loss.item(),
        "actor/kl_coef": config.kl_coef,
    }
    return loss, metrics


def llds_term(log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantages: torch.Tensor,
              mask: torch.Tensor, config: LossConfig,
              answer_span: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """The LLDS penalty: the masked mean, over all generated tokens, of lambda * max(0,
    old - new) on the tokens of preserving responses whose likelihood fell, judged per
    response (unit "response") or per action (unit "action"), by the rule `config.gate`
    (see GATES; "lazy" is the fork's).

    `answer_span` (1 on the answer's tokens) gets the lower weight min(answer_lambda,
    lambda) in the MA variant; None means no answer span is singled out.
    """
    rows = config.preserving(advantages)
    drop = old_log_prob.detach() - log_prob  # > 0 where the likelihood fell
    decrease = torch.clamp(drop, min=0)
    kept = mask * rows.float()[:, None]
    with torch.no_grad():  # the gate is a decision, not part of the gradient
        if config.unit == "action":
            ids = action_ids(kept)
            sums = _per_action_sums(drop * kept, ids)
            fell = (sums > config.tolerance * _per_action_sums(kept, ids)).float()
            fell[:, 0] = 0  # the bin of tokens outside every action
            gate = fell.gather(1, ids)
            penalised_actions = fell.sum(-1)
        else:
            fell = ((drop * kept).sum(-1) > config.tolerance * kept.sum(-1)).float()
            gate = fell[:, None] * kept
            penalised_actions = fell * action_ids(kept).amax(-1).float()
    weight = torch.full_like(log_prob, config.llds_lambda)
    if answer_span is not None:
        lower = min(config.answer_lambda, config.llds_lambda)
        weight = torch.where(answer_span.bool(), torch.full_like(weight, lower), weight)
    penalty = masked_mean(weight * gate * decrease, mask)
    metrics = {
        "actor/loss_noreduce": penalty.item(),
        "actor/loss_noreduce_coef": config.llds_lambda,
        "actor/answer_weight": config.answer_lambda,
        "actor/mean_reduce_chunk": (penalised_actions[rows].mean().item() if rows.any()
                                    else 0.0),
    }
    # The fork's "lowest_prob" pair: current probabilities of the answer-span tokens.
    span = (answer_span * mask) if answer_span is not None else None
    if span is not None and span.sum() > 0:
        probs = log_prob.detach().exp()
        metrics["actor/lowest_prob_avg_mean"] = masked_mean(probs, span).item()
        metrics["actor/lowest_prob_avg_min"] = probs[span.bool()].min().item()
    else:
        metrics["actor/lowest_prob_avg_mean"] = metrics["actor/lowest_prob_avg_min"] = 0.0
    return penalty, metrics


def likelihood_metrics(old_log_prob: torch.Tensor, ref_log_prob: torch.Tensor,
                       advantages: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """The fork's pos/neg averages: masked_mean(old * [A >= 0], mask) over ALL generated
    tokens (so they also move with the share of positive tokens), likewise [A < 0]."""
    pos = (advantages >= 0).float()[:, None]
    neg = 1 - pos
    return {
        "actor/pos_avg_old_log_prob": masked_mean(old_log_prob * pos, mask).item(),
        "actor/neg_avg_old_log_prob": masked_mean(old_log_prob * neg, mask).item(),
        "actor/pos_avg_ref_log_prob": masked_mean(ref_log_prob * pos, mask).item(),
        "actor/neg_avg_ref_log_prob": masked_mean(ref_log_prob * neg, mask).item(),
    }


def displacement_metrics(old_log_prob: torch.Tensor, ref_log_prob: torch.Tensor,
                         advantages: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Over every response of a step (all micro-batches): the mean per-token old log-prob of
    the generated tokens of responses with A > 0, A = 0 and A < 0 separately (a key is left
    out when no such response has a generated token), how many responses each class holds,
    and the mean per-token old - ref log-prob over all of them (log pi - log pi_ref).

    Unlike the fork's pos/neg pair, each mean divides by its own class's tokens, so it does
    not move with the share of each class in the batch.
    """
    mask = mask.to(old_log_prob.dtype)
    metrics: dict[str, float] = {}
    classes = (("pos", advantages > 0), ("zero", advantages == 0), ("neg", advantages < 0))
    for name, rows in classes:
        tokens = mask[rows].sum()
        if tokens > 0:
            metrics[f"displacement/{name}_logp"] = (
                (old_log_prob[rows] * mask[rows]).sum() / tokens).item()
    if mask.sum() > 0:
        metrics["displacement/ref_log_ratio"] = masked_mean(old_log_prob - ref_log_prob,
                                                            mask).item()
    for name, rows in classes:
        metrics[f"displacement/n_{name}"] = float(rows.sum())
    return metrics


def total_loss(log_prob: torch.Tensor, old_log_prob: torch.Tensor, ref_log_prob: torch.Tensor,
               advantages: torch.Tensor, mask: torch.Tensor, entropy: torch.Tensor,
               config: LossConfig, answer_span: torch.Tensor | None = None,
               ) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO + the LLDS term (0 when lambda is 0), with every metric of one micro-batch."""
    mask = mask.to(log_prob.dtype)
    loss, metrics = grpo_loss(log_prob, old_log_prob, ref_log_prob, advantages, mask, entropy,
                              config)
    penalty, llds_metrics = llds_term(log_prob, old_log_prob, advantages, mask, config,
                                      answer_span)
    if config.llds_lambda > 0:  # lambda 0: the GRPO graph untouched, bit for bit
        loss = loss + penalty
    metrics.update(llds_metrics)
    metrics.update(likelihood_metrics(old_log_prob, ref_log_prob, advantages, mask))
    return loss, metrics
