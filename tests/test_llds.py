"""The GRPO loss and the LLDS term on hand-built tensors (no model): each case is small
enough to check against arithmetic done here."""

from __future__ import annotations

import math

import pytest
import torch

from nano.llds import (
    LossConfig,
    action_ids,
    displacement_metrics,
    entropy,
    group_advantages,
    grpo_loss,
    likelihood_metrics,
    llds_term,
    total_loss,
)


def test_group_advantages_normalise_within_each_prompt():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.5])
    adv = group_advantages(rewards, [0, 0, 0, 1, 1, 2])
    first = torch.tensor([1.0, 0.0, 0.0])
    std = first.std()  # unbiased, as verl's torch.std
    assert torch.allclose(adv[:3], (first - first.mean()) / (std + 1e-6))
    assert math.isclose(std.item(), math.sqrt(1 / 3), rel_tol=1e-6)
    assert adv[3].item() == 0 and adv[4].item() == 0  # all equal: no signal
    # A group of one: mean 0, std 1.
    assert math.isclose(adv[5].item(), 0.5 / (1 + 1e-6), rel_tol=1e-6)


def test_group_advantages_do_not_depend_on_order_of_groups():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    a = group_advantages(rewards, ["q1", "q2", "q1", "q2"])
    assert a[0] > 0 > a[2] and a[3] > 0 > a[1]
    assert torch.allclose(a[0], a[3]) and torch.allclose(a[1], a[2])


def _two_actions():
    """One preserving response: action 1 (tokens 0-1), an observation (2-3), action 2 (4-6).
    Action 1 lost likelihood (sum old - new = 1.0); action 2 gained 2.0."""
    mask = torch.tensor([[1, 1, 0, 0, 1, 1, 1]], dtype=torch.float)
    old = torch.tensor([[-1.0, -1.0, 0, 0, -3.0, -3.0, -3.0]])
    new = torch.tensor([[-1.5, -1.5, 0, 0, -2.0, -2.5, -2.5]], requires_grad=True)
    return old, new, mask, torch.tensor([1.0])


def test_action_ids_number_contiguous_generated_runs():
    mask = torch.tensor([[1, 1, 0, 0, 1, 1, 1, 0], [0, 1, 0, 1, 0, 1, 0, 0]])
    assert action_ids(mask).tolist() == [[1, 1, 0, 0, 2, 2, 2, 0], [0, 1, 0, 2, 0, 3, 0, 0]]


def test_action_gate_penalises_the_action_that_fell_where_the_response_gate_does_not():
    old, new, mask, adv = _two_actions()
    action = LossConfig(llds_lambda=0.2, unit="action")
    response = LossConfig(llds_lambda=0.2, unit="response")
    pen_a, metrics_a = llds_term(new, old, adv, mask, action)
    pen_r, metrics_r = llds_term(new, old, adv, mask, response)
    # Response sum of old - new = 1.0 - 2.0 < 0: the response gate lets it pass.
    assert pen_r.item() == 0.0
    # Action 1 fell: d = 0.5 on its two tokens, lambda 0.2, mean over 5 generated tokens.
    assert math.isclose(pen_a.item(), 0.2 * (0.5 + 0.5) / 5, rel_tol=1e-6)
    assert metrics_a["actor/mean_reduce_chunk"] == 1.0
    assert metrics_r["actor/mean_reduce_chunk"] == 0.0
    pen_a.backward()  # the gradient raises the fallen tokens only
    assert new.grad[0].tolist() == pytest.approx([-0.04, -0.04, 0, 0, 0, 0, 0])


def test_response_gate_penalises_every_falling_token_of_a_response_that_fell():
    mask = torch.tensor([[1, 1, 0, 1]], dtype=torch.float)
    old = torch.tensor([[-1.0, -1.0, 0.0, -1.0]])
    new = torch.tensor([[-2.0, -0.5, 0.0, -1.2]])  # sum old - new = 1 - 0.5 + 0.2 > 0
    pen, metrics = llds_term(new, old, torch.tensor([0.0]), mask,
                             LossConfig(llds_lambda=0.5, unit="response"))
    assert math.isclose(pen.item(), 0.5 * (1.0 + 0.0 + 0.2) / 3, rel_tol=1e-6)
    assert metrics["actor/mean_reduce_chunk"] == 2.0  # both actions of the response


@pytest.mark.parametrize("unit", ["response", "action"])
def test_llds_term_is_zero_when_likelihood_rose_or_lambda_is_zero(unit):
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 1, 1]], dtype=torch.float)
    old = torch.full((2, 4), -2.0)
    adv = torch.tensor([0.5, 0.0])
    rose, _ = llds_term(old + 0.3, old, adv, mask, LossConfig(llds_lambda=0.2, unit=unit))
    assert rose.item() == 0.0
    fell, _ = llds_term(old - 0.3, old, adv, mask, LossConfig(llds_lambda=0.0, unit=unit))
    assert fell.item() == 0.0
    positive, _ = llds_term(old - 0.3, old, adv, mask, LossConfig(llds_lambda=0.2, unit=unit))
    assert math.isclose(positive.item(), 0.2 * 0.3, rel_tol=1e-5)


def test_negative_advantage_responses_are_never_held():
    old, new, mask, _ = _two_actions()
    for unit in ("response", "action"):
        pen, _ = llds_term(new, old, torch.tensor([-0.1]), mask,
                           LossConfig(llds_lambda=0.2, unit=unit))
        assert pen.item() == 0.0


def test_answer_span_gets_the_lower_ma_weight():
    mask = torch.tensor([[1, 1, 1, 1]], dtype=torch.float)
    span = torch.tensor([[0, 0, 1, 1]], dtype=torch.float)
    old = torch.full((1, 4), -1.0)
    new = old - 1.0
    adv = torch.tensor([1.0])
    config = LossConfig(llds_lambda=0.2, answer_lambda=0.05, unit="action")
    pen, metrics = llds_term(new, old, adv, mask, config, answer_span=span)
    assert math.isclose(pen.item(), (0.2 * 2 + 0.05 * 2) / 4, rel_tol=1e-6)
    assert metrics["actor/answer_weight"] == 0.05
    assert math.isclose(metrics["actor/lowest_prob_avg_mean"], math.exp(-2.0), rel_tol=1e-6)
    capped, _ = llds_term(new, old, adv, mask,
                          LossConfig(llds_lambda=0.2, answer_lambda=0.9, unit="action"), span)
    assert math.isclose(capped.item(), 0.2, rel_tol=1e-6)  # capped at lambda


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand((4, 9), generator=g) > 0.3).float()
    old = -torch.rand((4, 9), generator=g) * 3
    ref = -torch.rand((4, 9), generator=g) * 3
    new = (old + torch.randn((4, 9), generator=g) * 0.3).requires_grad_(True)
    entropy = torch.rand((4, 9), generator=g)
    adv = torch.tensor([1.2, -0.4, 0.0, -0.8])
    return new, old, ref, adv, mask, entropy


@pytest.mark.parametrize("unit", ["response", "action"])
def test_lambda_zero_is_plain_grpo_bit_for_bit(unit):
    new, old, ref, adv, mask, entropy = _batch()
    grpo, _ = grpo_loss(new, old, ref, adv, mask, entropy, LossConfig())
    (grad_grpo,) = torch.autograd.grad(grpo, new)
    config = LossConfig(llds_lambda=0.0, answer_lambda=0.0, unit=unit)
    total, metrics = total_loss(new, old, ref, adv, mask, entropy, config,
                                answer_span=torch.ones_like(mask))
    (grad_total,) = torch.autograd.grad(total, new)
    assert torch.equal(total, grpo) and torch.equal(grad_total, grad_grpo)
    assert metrics["actor/loss_noreduce"] == 0.0
    held, _ = total_loss(new, old, ref, adv, mask, entropy,
                         LossConfig(llds_lambda=0.2, unit=unit))
    assert held.item() > grpo.item()  # this batch has preserving tokens that fell


def test_grpo_loss_matches_the_ppo_clip_formula():
    new, old, ref, adv, mask, entropy = _batch(1)
    loss, metrics = grpo_loss(new, old, ref, adv, mask, entropy, LossConfig(kl_coef=0.0))
    expected, clipped, n = 0.0, 0, 0
    for b in range(4):
        for t in range(9):
            if not mask[b, t]:
                continue
            ratio = math.exp(new[b, t].item() - old[b, t].item())
            a = adv[b].item()
            plain, cut = -a * ratio, -a * min(max(ratio, 0.8), 1.2)
            expected += max(plain, cut)
            clipped += cut > plain
            n += 1
    assert math.isclose(loss.item(), expected / n, rel_tol=1e-5)
    assert math.isclose(metrics["actor/pg_clipfrac"], clipped / n, rel_tol=1e-6)


def test_low_var_kl_is_zero_at_the_reference_and_positive_away_from_it():
    new, old, ref, adv, mask, entropy = _batch(2)
    _, same = grpo_loss(ref.clone(), old, ref, adv, mask, entropy, LossConfig())
    _, apart = grpo_loss(new, old, ref, adv, mask, entropy, LossConfig())
    assert same["actor/kl_loss"] == 0.0 and apart["actor/kl_loss"] > 0


def test_pos_and_neg_averages_divide_by_all_generated_tokens():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.float)
    old = torch.tensor([[-1.0, -3.0, -9.0], [-2.0, -9.0, -9.0]])
    metrics = likelihood_metrics(old, old * 2, torch.tensor([0.0, -1.0]), mask)
    assert metrics["actor/pos_avg_old_log_prob"] == pytest.approx(-4.0 / 3)
    assert metrics["actor/neg_avg_old_log_prob"] == pytest.approx(-2.0 / 3)
    assert metrics["actor/pos_avg_ref_log_prob"] == pytest.approx(-8.0 / 3)


def test_bad_config_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="unit"):
        LossConfig(unit="token")
    with pytest.raises(ValueError, match="gate must be one of lazy, tolerance, positive"):
        LossConfig(gate="strict")
    with pytest.raises(ValueError, match="--gate-tolerance"):
        LossConfig(gate_tolerance=-1e-3)
    with pytest.raises(ValueError, match=">= 0"):
        LossConfig(llds_lambda=-0.1)


def test_entropy_from_log_probs():
    """log V for a uniform distribution over V, 0 for a certain one, and -sum p log p."""
    uniform = torch.log_softmax(torch.zeros(2, 8), -1)
    assert torch.allclose(entropy(uniform), torch.full((2,), math.log(8)))
    certain = torch.log_softmax(torch.tensor([[0.0, -1e4, -1e4]]), -1)
    assert entropy(certain).item() == pytest.approx(0.0, abs=1e-6)
    p = torch.tensor([0.5, 0.25, 0.25])
    assert entropy(p.log()).item() == pytest.approx(-(0.5 * math.log(0.5)
                                                      + 0.5 * math.log(0.25)))


# ------------------------------------------------------------------ the gate controls

def _gate_batch():
    """Four responses of two actions each (tokens 0-1 and 3-4; token 2 is an observation):
    r0  A > 0, action 1 fell by 0.1 a token, action 2 rose by 0.05 a token;
    r1  A = 0, both actions "fell" by float noise only (5e-6 a token);
    r2  A = 0, action 1 rose by noise, action 2 fell by 0.05 a token;
    r3  A < 0, both actions fell by 0.1 a token (never held by any gate)."""
    mask = torch.tensor([[1, 1, 0, 1, 1]] * 4, dtype=torch.float64)
    old = torch.full((4, 5), -1.0, dtype=torch.float64)
    drop = torch.tensor([[0.1, 0.1, 0, -0.05, -0.05],
                         [5e-6, 5e-6, 0, 5e-6, 5e-6],
                         [-5e-6, -5e-6, 0, 0.05, 0.05],
                         [0.1, 0.1, 0, 0.1, 0.1]], dtype=torch.float64)
    new = (old - drop).requires_grad_(True)
    return new, old, torch.tensor([1.0, 0.0, 0.0, -1.0], dtype=torch.float64), mask


def _held_tokens(unit: str, gate: str) -> tuple[set[tuple[int, int]], float]:
    """The (response, token) pairs the LLDS term pushes up, and penalised actions per
    preserving response."""
    new, old, adv, mask = _gate_batch()
    penalty, metrics = llds_term(new, old, adv, mask,
                                 LossConfig(llds_lambda=0.2, unit=unit, gate=gate))
    (grad,) = torch.autograd.grad(penalty, new)
    assert torch.all(grad <= 0)  # the term only ever raises likelihoods
    return ({(b, t) for b, t in torch.nonzero(grad).tolist()},
            metrics["actor/mean_reduce_chunk"])


R0_A1, R1_ALL, R2_A2 = {(0, 0), (0, 1)}, {(1, 0), (1, 1), (1, 3), (1, 4)}, {(2, 3), (2, 4)}


@pytest.mark.parametrize("unit", ["response", "action"])
def test_the_lazy_gate_holds_noise_the_tolerance_gate_does_not_and_positive_holds_no_ties(unit):
    # lazy (the fork's): any positive sum opens the gate, so noise in the A = 0 response r1
    # gets a gradient as large as a real fall's.
    lazy, lazy_chunks = _held_tokens(unit, "lazy")
    assert lazy == R0_A1 | R1_ALL | R2_A2
    # tolerance: r1's noise (sum 1e-5 over 2 or 4 tokens) is below 1e-4 a token; real falls
    # of ties (r2) are still held.
    tolerant, tolerant_chunks = _held_tokens(unit, "tolerance")
    assert tolerant == R0_A1 | R2_A2
    # positive: only A > 0 responses, so neither tie is held, noise or not.
    positive, positive_chunks = _held_tokens(unit, "positive")
    assert positive == R0_A1
    if unit == "action":  # penalised actions per preserving response
        assert (lazy_chunks, tolerant_chunks, positive_chunks) == pytest.approx((4 / 3, 2 / 3, 1))
    else:  # a held response counts all its actions
        assert (lazy_chunks, tolerant_chunks, positive_chunks) == pytest.approx((2, 4 / 3, 2))


def test_the_tolerance_scales_with_the_units_tokens():
    """A fall of 2e-3 a token passes a 1e-3 tolerance and fails a 3e-3 one, whatever the
    unit's length; a tolerance of 0 is the lazy rule exactly."""
    mask = torch.tensor([[1, 1, 1, 1, 0, 1]], dtype=torch.float64)
    old = torch.full((1, 6), -2.0, dtype=torch.float64)
    new = old - 2e-3
    adv = torch.tensor([0.0], dtype=torch.float64)
    for unit in ("response", "action"):
        low, _ = llds_term(new, old, adv, mask, LossConfig(
            llds_lambda=1.0, unit=unit, gate="tolerance", gate_tolerance=1e-3))
        high, _ = llds_term(new, old, adv, mask, LossConfig(
            llds_lambda=1.0, unit=unit, gate="tolerance", gate_tolerance=3e-3))
        assert low.item() == pytest.approx(2e-3) and high.item() == 0.0
    batch = _batch(3)
    for unit in ("response", "action"):
        zero, _ = total_loss(*batch, LossConfig(llds_lambda=0.2, unit=unit, gate="tolerance",
                                                gate_tolerance=0.0))
        lazy, _ = total_loss(*batch, LossConfig(llds_lambda=0.2, unit=unit, gate="lazy"))
        assert torch.equal(zero, lazy)


def test_the_lazy_gate_is_the_default_and_ignores_the_tolerance():
    new, old, adv, mask = _gate_batch()
    default, _ = llds_term(new, old, adv, mask, LossConfig(llds_lambda=0.2, unit="action"))
    lazy, _ = llds_term(new, old, adv, mask, LossConfig(llds_lambda=0.2, unit="action",
                                                        gate="lazy", gate_tolerance=0.5))
    assert torch.equal(default, lazy) and default.item() > 0


# ------------------------------------------------------------------ displacement

def test_displacement_splits_the_three_advantage_classes_each_over_its_own_tokens():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]], dtype=torch.float)
    old = torch.tensor([[-1.0, -3.0, -9.0], [-2.0, -9.0, -9.0], [-4.0, -5.0, -6.0],
                        [-0.5, -1.5, -9.0]])
    ref = old - torch.tensor([[0.1], [0.2], [0.3], [0.4]])
    metrics = displacement_metrics(old, ref, torch.tensor([0.7, 0.0, -0.7, 0.0]), mask)
    assert metrics["displacement/pos_logp"] == pytest.approx(-2.0)  # (-1 - 3) / 2
    assert metrics["displacement/zero_logp"] == pytest.approx(-4.0 / 3)  # (-2 - .5 - 1.5) / 3
    assert metrics["displacement/neg_logp"] == pytest.approx(-5.0)
    # log pi - log pi_ref, per token over all 8 generated tokens.
    assert metrics["displacement/ref_log_ratio"] == pytest.approx(
        (2 * 0.1 + 0.2 + 3 * 0.3 + 2 * 0.4) / 8)
    assert (metrics["displacement/n_pos"], metrics["displacement/n_zero"],
            metrics["displacement/n_neg"]) == (1.0, 2.0, 1.0)
    # The fork's pair on the same batch: ties in "pos", all tokens in the denominator.
    fork = likelihood_metrics(old, ref, torch.tensor([0.7, 0.0, -0.7, 0.0]), mask)
    assert fork["actor/pos_avg_old_log_prob"] == pytest.approx((-4.0 - 2.0 - 2.0) / 8)


def test_displacement_leaves_out_an_empty_class_instead_of_logging_nan():
    mask = torch.tensor([[1, 1], [1, 0], [0, 0]], dtype=torch.float)
    old = torch.tensor([[-1.0, -2.0], [-3.0, 0.0], [0.0, 0.0]])
    metrics = displacement_metrics(old, old, torch.tensor([0.0, 0.0, -1.0]), mask)
    assert "displacement/pos_logp" not in metrics and "displacement/neg_logp" not in metrics
    assert metrics["displacement/zero_logp"] == pytest.approx(-2.0)
    assert metrics["displacement/ref_log_ratio"] == 0.0
    assert (metrics["displacement/n_pos"], metrics["displacement/n_neg"]) == (0.0, 1.0)
    assert all(math.isfinite(v) for v in metrics.values())
    nothing = displacement_metrics(old[:0], old[:0], torch.tensor([]), mask[:0])
    assert nothing == {"displacement/n_pos": 0.0, "displacement/n_zero": 0.0,
                       "displacement/n_neg": 0.0}
