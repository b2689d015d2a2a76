"""
VACO's forms for LLM RL as pure functions of per-token log-probs, advantages and the completion mask of a padded
``(B, T)`` batch (``B`` completions, ``T`` completion positions). Three policies appear:

* ``π_θ``: the policy being optimized (``logps``, with gradient);
* ``π_T``: the learner when the generation batch entered training, the *proximal* policy (``proximal_logps``);
* ``μ``: the policy that generated the completions, the *behavior* policy (``behavior_logps``): a stale snapshot
  under injected lag, or the inference engine (vLLM) whose log-probs differ from the trainer's.

Forms (``VACOGRPOConfig.vaco_form``):

* ``"token"`` (:func:`vaco_token_loss`): the paper's TV filter on ``q = π_θ/μ``, one sample per token;
* ``"sequence"`` (:func:`vaco_sequence_loss`): the co-authors' LLM port ("TVPO"): PPO's clip on ``π_θ/π_T``,
  weighted by the truncated ``ρ = π_T/μ``, with a per-completion TV test on ``ρ``;
* ``"decoupled"`` (:func:`vaco_decoupled_loss`): the TV filter around the proximal policy (``q = π_θ/π_T``),
  weighted by the truncated ``ρ = π_T/μ`` (decoupled PPO, with the filter in place of the clip).

Every loss is a mean over the valid tokens of the micro-batch (what TRL calls ``"bnpo"``); a micro-batch whose
tokens are all dropped, or that has no valid token, gives a loss of exactly 0 with a zero gradient.
"""

import math
from typing import NamedTuple

import torch as th

from sb3_vaco.common.losses import (
    MAX_LOG_RATIO,
    FilteredSurrogate,
    importance_weights,
    safe_ratio,
    tv_filtered_surrogate,
)


class FilteredLoss(NamedTuple):
    """
    :param loss: the loss to minimize (scalar)
    :param mask: 1.0 where a sample is kept, 0.0 where it is filtered out or invalid; shaped like the ratio,
        ``(B, T)`` per token or ``(B, 1)`` per completion
    :param tv_estimate: the TV estimate the filter tested (scalar, no gradient): of the micro-batch (token and
        decoupled forms) or the mean of the completions' estimates (sequence form)
    :param filter_active: the fraction of the filter's units over the budget: the micro-batch (0 or 1) or, in the
        sequence form, the completions
    :param weights: the constant weight of each valid token or completion in the loss (``mask`` included), or None
        when every weight is 1
    :param clip_fraction: fraction of valid tokens whose ratio is clipped (zero gradient), sequence form only
    """

    loss: th.Tensor
    mask: th.Tensor
    tv_estimate: th.Tensor
    filter_active: float
    weights: th.Tensor | None = None
    clip_fraction: float = 0.0


def sequence_mean(values: th.Tensor, token_mask: th.Tensor) -> th.Tensor:
    """Mean of ``values`` over each completion's valid tokens, shape ``(B, 1)`` (0 for a completion with none)."""
    total = th.where(token_mask.bool(), values, 0.0).sum(dim=1, keepdim=True)
    return total / token_mask.sum(dim=1, keepdim=True).clamp(min=1.0)


def loss_mask(inputs: dict[str, th.Tensor]) -> th.Tensor:
    """The tokens a loss counts: TRL's ``completion_mask``, times its ``tool_mask`` when the batch has one."""
    mask = inputs["completion_mask"]
    return mask * inputs["tool_mask"] if "tool_mask" in inputs else mask


def masked_total_variation(log_ratio: th.Tensor, token_mask: th.Tensor) -> th.Tensor:
    """:func:`~sb3_vaco.common.losses.total_variation` over the valid tokens: ``½·Σ m_t·|ρ_t − 1| / Σ m_t``."""
    return 0.5 * (th.abs(safe_ratio(log_ratio) - 1.0) * token_mask).sum() / token_mask.sum().clamp(min=1.0)


def masked_tv_filtered_surrogate(
    ratio: th.Tensor,
    advantages: th.Tensor,
    tv_threshold: float,
    token_mask: th.Tensor,
    weights: th.Tensor | None = None,
) -> FilteredSurrogate:
    """
    VACO's TV filter (arXiv 2603.01365, "Filter" step) over the completion tokens of a padded batch::

        D̂   = ½ · mean_{t valid}( w_t · |q_t − 1| )                    (no gradient)
        m_t = 0  if  D̂ > δ  and  Â_t · (q_t − 1) > 0  else 1
        L   = − mean_{t valid}( m_t · w_t · q_t · Â_t )

    The valid entries are gathered and handed to :func:`~sb3_vaco.common.losses.tv_filtered_surrogate`,
    so the rule is the SB3 side's, with the means over the valid tokens only (the aggregation TRL calls
    ``"bnpo"``). GRPO's advantage of a completion is shared by its tokens.

    With a token-level ratio ``q`` of shape ``(B, T)`` every valid token is one sample. With a sequence-level
    ratio of shape ``(B, 1)`` (e.g. ``exp`` of the mean token log-ratio, as in GSPO) every completion with at
    least one valid token is one sample, so the TV estimate and the mask are per sequence.

    A batch with no valid token, or whose samples are all masked, gives a loss of exactly 0 with a zero gradient.

    :param ratio: ``q``, shape ``(B, T)`` or ``(B, 1)`` (with gradient, finite)
    :param advantages: ``Â``, shape ``(B,)``, ``(B, 1)`` or ``(B, T)``
    :param tv_threshold: the budget ``δ``
    :param token_mask: 1 for the completion tokens that count (not padding, not tool output), shape ``(B, T)``
    :param weights: constant weights ``w``, broadcastable to ``ratio`` (default: all ones)
    :return: loss, mask (shaped like ``ratio``; 0 for filtered and for invalid entries), TV estimate and
        whether the filter was active
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    if ratio.shape[1] == 1:
        valid = token_mask.sum(dim=1, keepdim=True) > 0
    else:
        valid = token_mask.bool()
    advantages = advantages.expand_as(ratio)
    flat_weights = None if weights is None else weights.expand_as(ratio)[valid]

    mask = th.zeros_like(ratio, dtype=th.float32)
    if not bool(valid.any()):
        return FilteredSurrogate(ratio.sum() * 0.0, mask, ratio.new_zeros(()), False)
    filtered = tv_filtered_surrogate(ratio[valid], advantages[valid], tv_threshold, flat_weights)
    mask[valid] = filtered.mask
    return FilteredSurrogate(filtered.loss, mask, filtered.tv_estimate, filtered.filter_active)


def vaco_token_loss(
    logps: th.Tensor,
    behavior_logps: th.Tensor,
    advantages: th.Tensor,
    token_mask: th.Tensor,
    tv_threshold: float,
    sequence_ratio: bool = False,
) -> FilteredLoss:
    """
    The ``"token"`` form, the paper's rule: the TV filter on the ratio to the behavior policy::

        q_t = π_θ(y_t|·) / μ(y_t|·)
        D̂   = ½ · mean_t |q_t − 1|                             (no gradient, over the micro-batch's valid tokens)
        m_t = 0  if  D̂ > δ  and  Â · (q_t − 1) > 0  else 1
        L   = − mean_t( m_t · q_t · Â )

    No clipping, no importance weight: ``q`` carries the whole lag. With ``sequence_ratio=True``,
    ``q = exp(mean_t log q_t)`` per completion (as in GSPO), and the estimate and mask run over completions.

    :param logps: ``log π_θ``, shape ``(B, T)`` (with gradient)
    :param behavior_logps: ``log μ``, shape ``(B, T)``
    :param advantages: ``Â``, shape ``(B,)`` or ``(B, 1)``
    :param token_mask: 1 for the completion tokens that count, shape ``(B, T)``
    :param tv_threshold: the budget ``δ``
    :param sequence_ratio: one ratio per completion instead of one per token
    """
    log_q = logps - behavior_logps.detach()
    if sequence_ratio:
        log_q = sequence_mean(log_q, token_mask)
    filtered = masked_tv_filtered_surrogate(safe_ratio(log_q), advantages, tv_threshold, token_mask)
    return FilteredLoss(filtered.loss, filtered.mask, filtered.tv_estimate, float(filtered.filter_active))


def vaco_decoupled_loss(
    logps: th.Tensor,
    proximal_logps: th.Tensor,
    behavior_logps: th.Tensor,
    advantages: th.Tensor,
    token_mask: th.Tensor,
    tv_threshold: float,
    rho_bar: float = 1.0,
    sequence_ratio: bool = False,
) -> FilteredLoss:
    """
    The ``"decoupled"`` form: the TV filter around the proximal policy ``π_T`` (the learner when the batch entered
    training), each token weighted by the truncated importance weight from ``π_T`` to the behavior policy ``μ``
    (decoupled PPO, Hilton et al. 2022 and AReaL, with VACO's filter in place of the clip)::

        q_t = π_θ / π_T                          w_t = min( exp(clamp(log π_T − log μ, ±20)), ρ̄ )
        D̂   = ½ · mean_t( w_t · |q_t − 1| )      (no gradient)
        m_t = 0  if  D̂ > δ  and  Â · (q_t − 1) > 0  else 1
        L   = − mean_t( m_t · w_t · q_t · Â )

    The budget bounds only the drift since the batch entered training (the forward lag); the backward lag
    ``π_T/μ`` is corrected by ``w``, not filtered. ``ρ̄ = inf``: untruncated weights. With
    ``sequence_ratio=True`` both ratios are per completion (``exp`` of the mean token log-ratio).

    :param logps: ``log π_θ``, shape ``(B, T)`` (with gradient)
    :param proximal_logps: ``log π_T``, shape ``(B, T)``
    :param behavior_logps: ``log μ``, shape ``(B, T)``
    :param advantages: ``Â``, shape ``(B,)`` or ``(B, 1)``
    :param token_mask: 1 for the completion tokens that count, shape ``(B, T)``
    :param tv_threshold: the budget ``δ``
    :param rho_bar: the truncation ``ρ̄`` of the weights (1, as SB3's ``VACO`` decoupled filter)
    :param sequence_ratio: one ratio and one weight per completion instead of one per token
    """
    log_q = logps - proximal_logps.detach()
    log_rho = proximal_logps.detach() - behavior_logps.detach()
    if sequence_ratio:
        log_q, log_rho = sequence_mean(log_q, token_mask), sequence_mean(log_rho, token_mask)
    weights = importance_weights(log_rho, rho_bar)
    filtered = masked_tv_filtered_surrogate(safe_ratio(log_q), advantages, tv_threshold, token_mask, weights)
    weights = weights.expand_as(filtered.mask) * filtered.mask
    return FilteredLoss(filtered.loss, filtered.mask, filtered.tv_estimate, float(filtered.filter_active), weights)


def vaco_sequence_loss(
    logps: th.Tensor,
    proximal_logps: th.Tensor,
    behavior_logps: th.Tensor,
    advantages: th.Tensor,
    token_mask: th.Tensor,
    tv_threshold: float,
    rho_bar: float = 2.0,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    filter_drift: bool = False,
) -> FilteredLoss:
    """
    The ``"sequence"`` form, the co-authors' LLM port of VACO ("TVPO"): PPO's clipped surrogate on the ratio to the
    proximal policy ``π_T``, each token weighted by the truncated importance weight ``ρ = π_T/μ``, and the tokens
    of a completion whose ``ρ`` is already far from 1 dropped when their update would move ``ρ`` further::

        ρ_t = exp( clamp(log π_T − log μ, ±20) )                 (no gradient)
        D_i = ½ · mean_{t ∈ i} |ρ_t − 1|                          (the completion's TV estimate)
        m_t = 0  if  D_i > δ  and  sign(log ρ_t) · Â_i > 0  else 1
        w_t = m_t · min(ρ_t, ρ̄)                                   (truncated importance sampling)
        r_t = π_θ / π_T
        L   = − mean_t( w_t · min( r_t · Â_i, clip(r_t, 1 − ε_low, 1 + ε_high) · Â_i ) )

    The filter tests the lag already present when the batch enters training (``π_T`` vs ``μ``), once per
    completion; the clip bounds the drift during training. With ``filter_drift=True`` the test (``D_i`` and the
    sign) is on ``q_t = π_θ/μ`` instead of ``ρ_t``: the paper's ratio, the lag plus the drift of the learner during
    the update so far, so a completion the learner has already moved away from is dropped too (as off-policy
    sequence masking does on its negative-advantage side, measured against ``π_θ``). The TV estimate carries the ½
    of the total variation, so ``δ`` has the same meaning in every form (open-instruct compares ``mean|ρ − 1|`` with
    its bound ``b``: ``b = 2δ``). A completion whose tokens are all dropped contributes exactly zero gradient.

    :param logps: ``log π_θ``, shape ``(B, T)`` (with gradient)
    :param proximal_logps: ``log π_T``, shape ``(B, T)``
    :param behavior_logps: ``log μ``, shape ``(B, T)``
    :param advantages: ``Â``, shape ``(B,)`` or ``(B, 1)`` (one per completion)
    :param token_mask: 1 for the completion tokens that count, shape ``(B, T)``
    :param tv_threshold: the budget ``δ`` per completion
    :param rho_bar: the truncation ``ρ̄`` of the weights (open-instruct: 2)
    :param epsilon_low: PPO's lower clip range
    :param epsilon_high: PPO's upper clip range
    :param filter_drift: test ``π_θ/μ`` (lag and drift) instead of ``π_T/μ`` (lag only)
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    valid = token_mask.bool()
    n_valid = token_mask.sum().clamp(min=1.0)
    with th.no_grad():

        def log_ratio_to_behavior(numerator: th.Tensor) -> th.Tensor:
            return th.where(valid, th.clamp(numerator - behavior_logps, -MAX_LOG_RATIO, MAX_LOG_RATIO), 0.0)

        log_rho = log_ratio_to_behavior(proximal_logps)
        log_tested = log_ratio_to_behavior(logps.detach()) if filter_drift else log_rho
        sequence_tv = 0.5 * sequence_mean(th.abs(th.exp(log_tested) - 1.0), token_mask)  # (B, 1)
        over_budget = sequence_tv > tv_threshold
        increases_tv = th.sign(log_tested) * advantages > 0
        mask = (valid & ~(over_budget & increases_tv)).float()
        weights = mask * importance_weights(log_rho, rho_bar)
        completions = token_mask.sum(dim=1) > 0
        n_completions = completions.sum().clamp(min=1)
        tv_estimate = sequence_tv.squeeze(1)[completions].sum() / n_completions
        filter_active = float((over_budget.squeeze(1) & completions).sum() / n_completions)
    ratio = safe_ratio(th.where(valid, logps - proximal_logps.detach(), 0.0))  # padding: ratio 1, weight 0
    clipped_ratio = th.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
    surrogate = th.min(ratio * advantages, clipped_ratio * advantages)
    loss = -(weights * surrogate).sum() / n_valid
    with th.no_grad():
        clipped = ((ratio < 1.0 - epsilon_low) & (advantages < 0)) | ((ratio > 1.0 + epsilon_high) & (advantages > 0))
        clip_fraction = float((clipped & valid).sum() / n_valid)
    return FilteredLoss(loss, mask, tv_estimate, filter_active, weights, clip_fraction)


#: ``VACOGRPOConfig.vllm_importance_sampling_mode`` values, TRL's names: constraint (truncate / mask) × granularity
SAMPLER_CORRECTION_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def sampler_importance_ratio(
    old_logps: th.Tensor,
    sampling_logps: th.Tensor,
    token_mask: th.Tensor,
    mode: str = "sequence_mask",
    clip_min: float | None = None,
    clip_max: float | None = 3.0,
) -> th.Tensor:
    """
    TRL's sampler-mismatch correction (``GRPOConfig.vllm_importance_sampling_*``; truncated importance sampling,
    TIS, and masked importance sampling, MIS), as TRL computes it for vLLM's log-probs, for any sampler::

        log ρ_t = (log π_old − log μ) · m_t          (NaN log-probs: no correction, ρ_t = 1)
        ρ       = exp(log ρ_t) per token, or exp(Σ_t log ρ_t) per completion ("sequence_*")
        "*_truncate":  ρ ← clamp(ρ, C_min, C_max)        "*_mask":  ρ ← 0 where ρ ∉ [C_min, C_max]

    :param old_logps: ``log π_old``, the ratio's anchor (the learner when the batch entered training), ``(B, T)``
    :param sampling_logps: ``log μ``, the sampler's log-probs, ``(B, T)``
    :param token_mask: 1 for the completion tokens that count, ``(B, T)``
    :param mode: one of :data:`SAMPLER_CORRECTION_MODES`
    :param clip_min: ``C_min`` (``None``: none)
    :param clip_max: ``C_max`` (``None``: none)
    :return: ``ρ``, shape ``(B, T)`` for the token modes, ``(B, 1)`` for the sequence modes (no gradient)
    """
    if mode not in SAMPLER_CORRECTION_MODES:
        raise ValueError(f"`vllm_importance_sampling_mode` must be one of {SAMPLER_CORRECTION_MODES}, got {mode!r}")
    log_rho = th.nan_to_num((old_logps.detach() - sampling_logps.detach()) * token_mask, nan=0.0)
    if mode.startswith("sequence"):
        log_rho = log_rho.sum(dim=-1, keepdim=True)
    rho = th.exp(log_rho)
    if mode.endswith("truncate"):
        return th.clamp(rho, min=clip_min, max=clip_max)
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    return rho.masked_fill((rho < low) | (rho > high), 0.0)
