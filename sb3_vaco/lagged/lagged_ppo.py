from stable_baselines3 import PPO

from sb3_vaco.common.lagged import LaggedOnPolicyAlgorithm


class LaggedPPO(LaggedOnPolicyAlgorithm, PPO):
    """
    SB3's PPO, with its own ``train()`` unchanged, fed by lagged rollouts: the baseline under policy lag.

    The rollouts come from stale policies exactly as for :class:`~sb3_vaco.VACO`. PPO then does what naive
    asynchronous PPO does: the behavior log-probs are its ``old_log_prob`` (the ratio is centred on the stale
    policy) and GAE uses the values of the behavior critics, including their bootstrap of time-limit
    truncations and of the last observation. With ``policy_lag=0`` it is SB3's PPO, bit for bit.

    Every argument of :class:`stable_baselines3.PPO`, with the same defaults, and:

    :param policy_lag: Injected policy lag: every env acts with the learner's parameters from ``K`` updates
        ago, or, for a pair ``(K_min, K_max)``, each env with its own staleness drawn per rollout
    :param n_actors: Number of asynchronous actors collecting the rollouts (0: synchronous collection in ``env``).
        With actors the lag is real (``policy_lag`` must be 0) and the buffer has ``n_actors * n_envs_per_actor`` columns
    :param actor_backend: ``"process"`` (local processes) or ``"ray"`` (local Ray or a cluster)
    :param actor_backend_kwargs: Actor settings: ``env_fn``, ``n_envs_per_actor``, ``delay``, ``actor_timeout``, ...
        (see ``docs/actors.md``)
    """
