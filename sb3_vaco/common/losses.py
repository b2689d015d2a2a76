"""
Policy surrogates as pure functions of ratios and advantages: VACO's TV filter ("Filter" step),
the baselines the paper and its reviewers compare against (PPO clip, SPO, KL penalty) and the peers' surrogates
(decoupled PPO, IMPALA, APPO).

Every function returns a loss to *minimize* (the negated surrogate) averaged over the whole minibatch.
"""

import math
from typing import NamedTuple

import torch as th

#: Reference policies of VACO's TV filter: the behavior policy μ (the paper's rule), the learner π_T at the start of
#: the update with the samples weighted by min(1, π_T/μ) (decoupled), or μ with the budget counted from the learner's
#: distance to μ at the start of the update (behavior_relative).
TV_REFERENCES = ("behavior", "decoupled", "behavior_relative")

# exp(20) ≈ 4.9e8: far beyond any useful ratio, far below float32 overflow.
MAX_LOG_RATIO = 20.0


def safe_ratio(log_ratio: th.Tensor) -> th.Tensor:
    """``exp(log_ratio)`` with the log-ratio clamped to ``±MAX_LOG_RATIO`` so it never overflows to inf."""
    return th.exp(th.clamp(log_ratio, -MAX_LOG_RATIO, MAX_LOG_RATIO))


def total_variation(log_ratio: th.Tensor) -> th.Tensor:
    """
    ``TV(π, μ) = ½·E_μ|π/μ − 1|`` estimated on samples of μ from ``log_ratio = log π − log μ`` (the paper's Eq. 5):
    the distance of the learner ``π`` to the policies that acted, in [0, 1] in expectation under any lag.
    """
    return 0.5 * th.mean(th.abs(safe_ratio(log_ratio) - 1.0))


def importance_weights(log_rho: th.Tensor, rho_bar: float = math.inf) -> th.Tensor:
    """
    Truncated importance weights, no gradient::

        w = min( exp(clamp(log ρ, ±MAX_LOG_RATIO)), ρ̄ )          e.g. log ρ = log π_T − log μ

    :param log_rho: ``log ρ``, any shape
    :param rho_bar: the truncation ``ρ̄`` (``inf``: none)
    """
    rho = safe_ratio(log_rho.detach())
    return rho if math.isinf(rho_bar) else th.clamp(rho, max=rho_bar)


def clip_fraction(ratio: th.Tensor, clip_range: float) -> float:
    """PPO's ``clip_fraction``: the fraction of samples whose ratio lies outside ``[1 − ε, 1 + ε]``."""
    return th.mean((th.abs(ratio - 1) > clip_range).float()).item()


class FilteredSurrogate(NamedTuple):
    """
    :param loss: ``−mean_i(m_i · w_i · q_i · Â_i)``
    :param mask: ``m_i`` (1.0 = sample kept, 0.0 = filtered out)
    :param tv_estimate: ``D̂ = ½·mean_i(w_i·|q_i − 1|)``, no gradient
    :param filter_active: whether ``D̂`` exceeded the threshold in this minibatch
    :param bound_fraction: fraction of samples dropped by the per-sample ``ratio_bound`` alone (inside the budget)
    """

    loss: th.Tensor
    mask: th.Tensor
    tv_estimate: th.Tensor
    filter_active: bool
    bound_fraction: float = 0.0


def tv_filtered_surrogate(
    ratio: th.Tensor,
    advantages: th.Tensor,
    tv_threshold: float,
    weights: th.Tensor | None = None,
    ratio_bound: float | None = None,
) -> FilteredSurrogate:
    """
    VACO's total-variation filter for one minibatch (arXiv 2603.01365, "Filter" step)::

        D̂   = ½ · mean_i( w_i · |q_i − 1| )                        (no gradient)
        m_i = 0  if  Â_i · (q_i − 1) > 0  and  ( D̂ > δ  or  |q_i − 1| > ε )  else 1
        L   = − mean_i( m_i · w_i · q_i · Â_i )

    (``ε = ∞`` unless ``ratio_bound`` is given; the paper's filter has no per-sample term.)

    ``q`` is the ratio of the policy being optimized to the reference policy of the trust region and ``w``
    a constant importance weight from the reference to the behavior policy. With ``w = 1`` and ``q = π_θ/μ``
    this is the paper's rule (TV to the behavior policy); ``q = π_θ/π_T`` with ``w = π_T/μ`` measures the
    drift from the learner at the start of the update (``½·mean|r − r^T|``), and a truncated
    ``w = min(ρ̄, π_T/μ)`` gives the decoupled form (Hilton et al., 2022; Queeney et al., 2021).

    Inside the budget every sample contributes. Above it, only the samples whose gradient would move
    ``q`` further from 1 are dropped. The mean runs over the whole minibatch, so an entirely filtered
    minibatch gives a loss of exactly 0 with a zero gradient.

    The budget bounds the minibatch's *average* ``|q − 1|``, so single samples can still move far while the others
    stay near 1. ``ratio_bound = ε`` also drops, inside the budget, each sample already outside ``[1 − ε, 1 + ε]``
    whose gradient would push it further: the per-sample bound of PPO's clip (whose gradient is zero exactly for
    those samples, Schulman et al. 2017, Eq. 7), around the filter's reference.

    :param ratio: ``q_i`` (with gradient)
    :param advantages: ``Â_i`` (normalized or not; the same values are used in the mask and the loss)
    :param tv_threshold: the budget ``δ``
    :param weights: constant weights ``w_i`` (default: all ones)
    :param ratio_bound: the per-sample bound ``ε`` on ``|q_i − 1|`` (default: none)
    :return: loss, mask, TV estimate, whether the filter was active and the fraction dropped by the bound alone
    """
    weights = th.ones_like(ratio) if weights is None else weights.detach()
    with th.no_grad():
        tv_estimate = 0.5 * th.mean(weights * th.abs(ratio - 1.0))
        filter_active = bool(tv_estimate > tv_threshold)
        pushes_away = advantages * (ratio - 1.0) > 0
        out_of_bound = th.zeros_like(pushes_away) if ratio_bound is None else th.abs(ratio - 1.0) > ratio_bound
        dropped = pushes_away & (out_of_bound | filter_active)
        mask = (~dropped).float()
        bound_only = ratio_bound is not None and not filter_active
        bound_fraction = th.mean((pushes_away & out_of_bound).float()).item() if bound_only else 0.0
    loss = -th.mean(mask * weights * ratio * advantages)
    return FilteredSurrogate(loss, mask, tv_estimate, filter_active, bound_fraction)


def clipped_surrogate(
    ratio: th.Tensor, advantages: th.Tensor, clip_range: float, weights: th.Tensor | None = None
) -> th.Tensor:
    """
    PPO's clipped surrogate (Schulman et al., 2017, Eq. 7)::

        L = − mean( w · min( r·Â, clip(r, 1 − ε, 1 + ε)·Â ) )

    With constant per-sample weights ``w`` (default 1) and ``r = π_θ/π_prox`` it is decoupled PPO's objective
    (Hilton et al., 2022, Sec. 3: ``w = π_prox/μ``, the clip around the proximal policy).
    """
    unclipped = ratio * advantages
    clipped = th.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range) * advantages
    surrogate = th.min(unclipped, clipped)
    if weights is not None:
        surrogate = weights.detach() * surrogate
    return -th.mean(surrogate)


def vtrace_policy_gradient_loss(log_prob: th.Tensor, advantages: th.Tensor, pg_rhos: th.Tensor) -> th.Tensor:
    """
    IMPALA's policy gradient (Espeholt et al., 2018, Sec. 4.2)::

        L = − mean( ρ_t · Â_t · log π_θ(a_t|s_t) ),    ρ_t = min(ρ̄, π(a_t|s_t)/μ(a_t|s_t)),  Â_t = r_t + γ·v_{t+1} − V(s_t)

    whose gradient is ``−mean(ρ_t·Â_t·∇log π_θ)``; ``ρ_t`` and ``Â_t`` are constants.
    """
    return -th.mean(pg_rhos.detach() * advantages.detach() * log_prob)


def appo_surrogate(
    log_prob: th.Tensor,
    target_log_prob: th.Tensor,
    behavior_log_prob: th.Tensor,
    advantages: th.Tensor,
    clip_range: float,
    is_ratio_clip: float = 2.0,
) -> th.Tensor:
    """
    APPO's surrogate (RLlib's APPO; IMPACT, Luo et al. 2020): PPO's clip on the ratio to a target policy, reached
    through the behavior policy with a clipped importance ratio::

        r = clip(μ/π_target, 0, c) · π_θ/μ        (= π_θ/π_target while μ/π_target ≤ c)
        L = − mean( min( r·Â, clip(r, 1 − ε, 1 + ε)·Â ) )

    :param log_prob: ``log π_θ`` (with gradient)
    :param target_log_prob: ``log π_target``
    :param behavior_log_prob: ``log μ``
    :param advantages: ``Â`` (APPO: V-trace advantages weighted by ``min(ρ̄, π_target/μ)``)
    :param clip_range: ε
    :param is_ratio_clip: c, the clip of ``μ/π_target`` (RLlib: 2)
    """
    is_ratio = th.clamp(safe_ratio(behavior_log_prob - target_log_prob), 0.0, is_ratio_clip).detach()
    ratio = is_ratio * safe_ratio(log_prob - behavior_log_prob.detach())
    return clipped_surrogate(ratio, advantages, clip_range)


def spo_surrogate(ratio: th.Tensor, advantages: th.Tensor, epsilon: float) -> th.Tensor:
    """Simple Policy Optimization (Xie et al., 2024): ``−mean(r·Â − |Â|/(2ε)·(r − 1)²)``."""
    return -th.mean(ratio * advantages - th.abs(advantages) / (2.0 * epsilon) * (ratio - 1.0) ** 2)


def behavior_kl(log_ratio: th.Tensor) -> th.Tensor:
    """
    ``KL(μ‖π_θ)`` estimated on the behavior samples from ``log r = log π_θ/μ`` as ``mean((r − 1) − log r)``
    (non-negative per sample, unbiased; Schulman's k3 estimator with the roles of the two policies as here).
    """
    return th.mean((safe_ratio(log_ratio) - 1.0) - log_ratio)


def reverse_behavior_kl(log_ratio: th.Tensor) -> th.Tensor:
    """
    ``KL(π_θ‖μ)``, the KL penalty as RLHF writes it (Ouyang et al. 2022, Eq. 2), estimated on the behavior samples
    as ``mean(r·log r − (r − 1))``, ``r = π_θ/μ`` (non-negative per sample, unbiased: ``E_μ[r·log r] = KL(π_θ‖μ)``
    and ``E_μ[r − 1] = 0``). Against a Gaussian μ whose mean is ``Δm`` away it is least at the learner's
    ``σ = σ_μ``, where :func:`behavior_kl` is least at ``σ² = σ_μ² + Δm²``: it pulls the learner's mean back
    without widening its actions.
    """
    ratio = safe_ratio(log_ratio)
    return th.mean(ratio * th.clamp(log_ratio, -MAX_LOG_RATIO, MAX_LOG_RATIO) - (ratio - 1.0))


def kl_penalty_surrogate(log_ratio: th.Tensor, advantages: th.Tensor, kl_coef: float) -> th.Tensor:
    """PPO with a fixed KL penalty (Schulman et al., 2017, Eq. 8): ``−mean(r·Â) + β·KL(μ‖π_θ)`` (:func:`behavior_kl`)."""
    return -th.mean(safe_ratio(log_ratio) * advantages) + kl_coef * behavior_kl(log_ratio)
