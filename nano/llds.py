"""The GRPO loss and the LLDS term, as pure tensor functions (no model, no I/O).

Shapes: B responses, R response tokens (padded). `mask` is 1 on tokens the model generated
(state masking: prompt padding, observations and invalid-action notes are 0). The
definitions are those of the LLDS fork of verl: group-normalised outcome advantages
((r - mean) / (std + 1e-6) per group of the same prompt), the PPO clipped ratio,
`low_var_kl` to the frozen reference as a loss, and the LLDS penalty lambda * max(0,
old - new) on the generated tokens of responses with advantage >= 0 whose likelihood fell
(judged per response, or per action: a contiguous run of generated tokens).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

EPS = 1e-6


@dataclass(frozen=True)
class LossConfig:
    clip_ratio: float = 0.2
    kl_coef: float = 0.001  # low_var_kl to the frozen reference, as a loss
    entropy_coef: float = 0.0  # the recipe has no entropy bonus
    llds_lambda: float = 0.0  # `no_reduce_lambda`; 0 is plain GRPO
    answer_lambda: float = 0.0  # `answer_no_reduce_lambda`: the answer span's weight (MA)
    gate: str = "response"  # "response" (LLDS-R) or "action" (LLDS-A, `chunk_noreduce`)

    def __post_init__(self):
        if self.gate not in ("response", "action"):
            raise ValueError(f"gate must be 'response' or 'action', not {self.gate!r}")
        if self.llds_lambda < 0 or self.answer_lambda < 0:
            raise ValueError("the LLDS weights (--lambda, --answer-lambda) must be >= 0")


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
    old - new) on the tokens of preserving (A >= 0) responses whose likelihood fell, judged
    per response (gate "response") or per action (gate "action").

    `answer_span` (1 on the answer's tokens) gets the lower weight min(answer_lambda,
    lambda) in the MA variant; None means no answer span is singled out.
    """
    preserving = (advantages >= 0).float()[:, None]
    drop = old_log_prob.detach() - log_prob  # > 0 where the likelihood fell
    decrease = torch.clamp(drop, min=0)
    kept = mask * preserving
    with torch.no_grad():  # the gate is a decision, not part of the gradient
        if config.gate == "action":
            ids = action_ids(kept)
            fell = (_per_action_sums(drop * kept, ids) > 0).float()
            fell[:, 0] = 0  # the bin of tokens outside every action
            gate = fell.gather(1, ids)
            penalised_actions = fell.sum(-1)
        else:
            fell = ((drop * kept).sum(-1) > 0).float()
            gate = fell[:, None] * kept
            penalised_actions = fell * action_ids(kept).amax(-1).float()
    weight = torch.full_like(log_prob, config.llds_lambda)
    if answer_span is not None:
        lower = min(config.answer_lambda, config.llds_lambda)
        weight = torch.where(answer_span.bool(), torch.full_like(weight, lower), weight)
    penalty = masked_mean(weight * gate * decrease, mask)
    rows = advantages >= 0
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
