"""
VACO's total-variation filter at token (or sequence) level: the minibatch rule of
:func:`sb3_vaco.common.losses.tv_filtered_surrogate` applied to the valid completion tokens of a padded batch.
"""

import torch as th

from sb3_vaco.common.losses import FilteredSurrogate, tv_filtered_surrogate


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
