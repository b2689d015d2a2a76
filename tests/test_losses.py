import pytest
import torch as th

from sb3_vaco.common.losses import (
    MAX_LOG_RATIO,
    behavior_kl,
    clipped_surrogate,
    kl_penalty_surrogate,
    reverse_behavior_kl,
    safe_ratio,
    spo_surrogate,
    tv_filtered_surrogate,
)


def batch(seed: int = 0, scale: float = 0.1, size: int = 64) -> tuple[th.Tensor, th.Tensor]:
    generator = th.Generator().manual_seed(seed)
    log_ratio = scale * th.randn(size, generator=generator)
    advantages = th.randn(size, generator=generator)
    return log_ratio, advantages


def test_nothing_masked_within_budget():
    log_ratio, advantages = batch(scale=0.05)
    ratio = th.exp(log_ratio).requires_grad_()
    result = tv_filtered_surrogate(ratio, advantages, tv_threshold=0.2)
    assert result.tv_estimate <= 0.2 and not result.filter_active
    assert th.all(result.mask == 1.0)
    th.testing.assert_close(result.loss, -(ratio * advantages).mean())


def test_exactly_the_samples_pushing_away_are_masked_above_budget():
    log_ratio, advantages = batch(scale=1.0)
    ratio = th.exp(log_ratio)
    result = tv_filtered_surrogate(ratio, advantages, tv_threshold=0.05)
    assert result.filter_active
    th.testing.assert_close(result.tv_estimate, 0.5 * (ratio - 1).abs().mean())
    pushes_away = advantages * (ratio - 1) > 0
    assert 0 < pushes_away.sum() < len(ratio)
    assert th.equal(result.mask == 0.0, pushes_away)
    th.testing.assert_close(result.loss, -(ratio * advantages * (~pushes_away)).sum() / len(ratio))


def test_gradient_only_flows_through_kept_samples():
    log_ratio, advantages = batch(scale=1.0)
    log_ratio.requires_grad_()
    result = tv_filtered_surrogate(th.exp(log_ratio), advantages, tv_threshold=0.05)
    result.loss.backward()
    assert log_ratio.grad is not None
    assert th.all(log_ratio.grad[result.mask == 0.0] == 0.0)
    assert th.all(log_ratio.grad[result.mask == 1.0] != 0.0)


def test_all_masked_minibatch_gives_zero_loss_and_zero_gradient():
    # Every ratio moved in the direction of its advantage: every sample pushes TV further.
    advantages = th.tensor([1.0, -2.0, 0.5, -0.3])
    log_ratio = (0.8 * th.sign(advantages)).requires_grad_()
    result = tv_filtered_surrogate(th.exp(log_ratio), advantages, tv_threshold=0.1)
    assert th.all(result.mask == 0.0)
    result.loss.backward()
    assert result.loss.item() == 0.0 and th.isfinite(result.loss)
    assert log_ratio.grad is not None and th.all(log_ratio.grad == 0.0)


def test_weighted_estimate_is_tv_to_learner():
    """With q = π_θ/π_T and w = π_T/μ the estimate is ½·mean|r − r^T| and the loss is −mean(m·r·Â)."""
    log_ratio, advantages = batch(scale=0.8, seed=1)  # log π_θ/μ
    learner_log_ratio, _ = batch(scale=0.8, seed=2)  # log π_T/μ
    r, r_learner = th.exp(log_ratio), th.exp(learner_log_ratio)
    result = tv_filtered_surrogate(r / r_learner, advantages, tv_threshold=0.05, weights=r_learner)
    th.testing.assert_close(result.tv_estimate, 0.5 * (r - r_learner).abs().mean())
    assert th.equal(result.mask == 0.0, advantages * (r - r_learner) > 0)
    th.testing.assert_close(result.loss, -(result.mask * r * advantages).mean())


def test_ratio_bound_drops_the_out_of_range_samples_inside_the_budget():
    log_ratio, advantages = batch(scale=0.5, seed=3)
    ratio = th.exp(log_ratio)
    result = tv_filtered_surrogate(ratio, advantages, tv_threshold=10.0, ratio_bound=0.2)
    assert not result.filter_active
    dropped = (advantages * (ratio - 1) > 0) & ((ratio - 1).abs() > 0.2)
    assert 0 < dropped.sum() < len(ratio)
    assert th.equal(result.mask == 0.0, dropped)
    assert result.bound_fraction == pytest.approx(dropped.float().mean().item())
    # Without the bound the same minibatch keeps every sample.
    assert th.all(tv_filtered_surrogate(ratio, advantages, tv_threshold=10.0).mask == 1.0)


def test_ratio_bound_alone_has_the_gradient_of_ppo_clip():
    """Dropping exactly the samples that PPO's clip zeroes gives the same gradient (Schulman et al. 2017, Eq. 7)."""
    log_ratio, advantages = batch(scale=0.5, seed=4)
    grads = []
    for loss_fn in (
        lambda r: tv_filtered_surrogate(r, advantages, tv_threshold=10.0, ratio_bound=0.2).loss,
        lambda r: clipped_surrogate(r, advantages, clip_range=0.2),
    ):
        leaf = log_ratio.clone().requires_grad_()
        loss_fn(th.exp(leaf)).backward()
        grads.append(leaf.grad)
    th.testing.assert_close(grads[0], grads[1])


def test_extreme_ratios_stay_finite():
    log_ratio = th.tensor([1e4, -1e4, 0.0, 300.0], requires_grad=True)
    advantages = th.tensor([1.0, -1.0, 1.0, -1.0])
    ratio = safe_ratio(log_ratio)
    assert th.all(th.isfinite(ratio)) and ratio.max().item() == pytest.approx(float(th.exp(th.tensor(MAX_LOG_RATIO))))
    for loss in (
        tv_filtered_surrogate(ratio, advantages, 0.2).loss,
        clipped_surrogate(ratio, advantages, 0.2),
        spo_surrogate(ratio, advantages, 0.2),
        kl_penalty_surrogate(log_ratio, advantages, 1.0),
    ):
        assert th.isfinite(loss)


def test_clipped_surrogate_is_ppo():
    log_ratio, advantages = batch(scale=0.5)
    ratio = th.exp(log_ratio)
    expected = -th.min(ratio * advantages, th.clamp(ratio, 0.8, 1.2) * advantages).mean()
    th.testing.assert_close(clipped_surrogate(ratio, advantages, 0.2), expected)


def test_spo_penalty_is_zero_at_ratio_one_and_grows():
    _, advantages = batch()
    ones = th.ones_like(advantages)
    th.testing.assert_close(spo_surrogate(ones, advantages, 0.2), -advantages.mean())
    assert spo_surrogate(1.5 * ones, advantages.abs(), 0.2) > spo_surrogate(1.1 * ones, advantages.abs(), 0.2)


def test_behavior_kl_in_closed_form_and_unbiased():
    """``mean((r − 1) − log r)``: 0.25 for r ∈ {2, 1/2}; on samples of μ = N(0, 1) it estimates KL(μ‖N(0.5, 1)) = 1/8."""
    th.testing.assert_close(behavior_kl(th.log(th.tensor([2.0, 0.5]))), th.tensor(0.25))
    actions = th.randn(200_000, generator=th.Generator().manual_seed(0))
    log_ratio = -0.5 * (actions - 0.5) ** 2 + 0.5 * actions**2  # log π(a) − log μ(a)
    assert abs(behavior_kl(log_ratio).item() - 0.125) < 0.005


def test_reverse_behavior_kl_in_closed_form_and_least_at_the_data_std():
    """``mean(r·log r − (r − 1))``: (2·log 2 − 1 + ½ − ½·log 2)/2 for r ∈ {2, 1/2}; on samples of μ = N(0, 1) it
    estimates KL(π‖μ), and against a mean Δm = 1 away it is least at the learner's σ = 1 = σ_μ, where the forward
    KL is least at σ² = 1 + Δm² = 2."""
    th.testing.assert_close(reverse_behavior_kl(th.log(th.tensor([2.0, 0.5]))), th.tensor(0.75 * 0.6931472 - 0.25))
    actions = th.randn(200_000, generator=th.Generator().manual_seed(0), dtype=th.float64)

    def log_ratio(mean: float, std: float) -> th.Tensor:  # log N(a; mean, std) − log N(a; 0, 1)
        return -0.5 * ((actions - mean) / std) ** 2 - th.log(th.tensor(std, dtype=th.float64)) + 0.5 * actions**2

    assert abs(reverse_behavior_kl(log_ratio(0.5, 1.0)).item() - 0.125) < 0.005
    assert abs(reverse_behavior_kl(log_ratio(0.0, 0.8)).item() - (-th.log(th.tensor(0.8)) + 0.32 - 0.5).item()) < 0.005
    stds = th.linspace(0.6, 2.0, 71).tolist()
    least = {kl: stds[min(range(len(stds)), key=lambda i: kl(log_ratio(1.0, stds[i])).item())]
             for kl in (behavior_kl, reverse_behavior_kl)}
    assert abs(least[reverse_behavior_kl] - 1.0) <= 0.06
    assert abs(least[behavior_kl] - 2**0.5) <= 0.06
    per_sample = [reverse_behavior_kl(th.tensor([x])).item() for x in th.linspace(-3.0, 3.0, 13).tolist()]
    assert min(per_sample) == 0.0 == per_sample[6] and all(kl > 0 for i, kl in enumerate(per_sample) if i != 6)


def test_kl_penalty_is_nonnegative_and_vanishes_on_policy():
    log_ratio, advantages = batch(scale=0.5)
    zero = th.zeros_like(log_ratio)
    th.testing.assert_close(kl_penalty_surrogate(zero, advantages, 5.0), -advantages.mean())
    penalty = kl_penalty_surrogate(log_ratio, th.zeros_like(advantages), 1.0)
    assert penalty > 0
