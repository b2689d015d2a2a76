from sb3_contrib import TRPO

from sb3_vaco.common.lagged import LaggedOnPolicyAlgorithm


class LaggedTRPO(LaggedOnPolicyAlgorithm, TRPO):
    """
    sb3-contrib's TRPO (Schulman et al., 2015, https://arxiv.org/abs/1502.05477), with its own ``train()`` unchanged,
    fed by lagged rollouts: the classical KL trust region under policy lag.

    The rollouts come from stale policies exactly as for :class:`~sb3_vaco.VACO` and :class:`~sb3_vaco.LaggedPPO`.
    TRPO then does what naive asynchronous TRPO does: its surrogate's ratio is taken to the behavior policy (its
    ``old_log_prob`` is the stale policy's log-prob), its KL trust region is around the learner at the start of the
    update (the distribution it computes itself), and GAE uses the values of the behavior critics. With
    ``policy_lag=0`` it is sb3-contrib's TRPO, bit for bit.

    Every argument of :class:`sb3_contrib.TRPO`, with the same defaults, and the lag mixin's:

    :param policy_lag: Injected policy lag ``K`` or ``(K_min, K_max)``; with ``n_actors``, ``actor_backend`` and
        ``actor_backend_kwargs``: the lag mixin's arguments (:class:`~sb3_vaco.common.lagged.LaggedOnPolicyAlgorithm`)
    """

    def _grad_steps_per_update(self) -> int:
        """One: TRPO counts one policy step per ``train()`` (its ``batch_size`` is the critic's minibatch)."""
        return 1
