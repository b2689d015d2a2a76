from stable_baselines3 import PPO

from sb3_vaco.common.lagged import LaggedOnPolicyAlgorithm


class LaggedPPO(LaggedOnPolicyAlgorithm, PPO):
    """
    SB3's PPO, with its own ``train()`` unchanged, fed by lagged rollouts: the baseline under policy lag.

    The rollouts come from stale policies exactly as for :class:`~sb3_vaco.VACO`. PPO then does what naive
    asynchronous PPO does: the behavior log-probs are its ``old_log_prob`` (the ratio is centred on the stale
    policy) and GAE uses the values of the behavior critics, including their bootstrap of time-limit
    truncations and of the last observation. With ``policy_lag=0`` it is SB3's PPO, bit for bit.

    Every argument of :class:`stable_baselines3.PPO`, with the same defaults, and the lag mixin's:

    :param policy_lag: Injected policy lag ``K`` or ``(K_min, K_max)``; with ``n_actors``, ``actor_backend`` and
        ``actor_backend_kwargs``: the lag mixin's arguments (:class:`~sb3_vaco.common.lagged.LaggedOnPolicyAlgorithm`)
    """
