from typing import Any

from stable_baselines3 import PPO
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.type_aliases import GymEnv

from sb3_vaco.common.aligned import check_integer
from sb3_vaco.common.lag import LaggedOnPolicyAlgorithm, PolicyLagSpec, parse_policy_lag


class LaggedPPO(LaggedOnPolicyAlgorithm, PPO):
    """
    SB3's PPO, with its own ``train()`` unchanged, fed by lagged rollouts: the baseline under policy lag.

    The rollouts come from stale policies exactly as for :class:`~sb3_vaco.VACO`. PPO then does what naive
    asynchronous PPO does: the behavior log-probs are its ``old_log_prob`` (the ratio is centred on the stale
    policy) and GAE uses the values of the behavior critics, including their bootstrap of time-limit
    truncations and of the last observation. With ``policy_lag=0`` it is SB3's PPO, bit for bit.

    :param policy: The policy model to use (MlpPolicy, CnnPolicy, MultiInputPolicy)
    :param env: The environment to learn from (if registered in Gym, can be str)
    :param args: PPO's positional arguments after ``env``
    :param policy_lag: Injected policy lag: every env acts with the learner's parameters from ``K`` updates
        ago, or, for a pair ``(K_min, K_max)``, each env with its own staleness drawn per rollout
    :param n_actors: Number of asynchronous actors collecting the rollouts (0: synchronous collection in ``env``).
        With actors the lag is real (``policy_lag`` must be 0) and the buffer has ``n_actors * n_envs_per_actor`` columns
    :param actor_backend: ``"process"`` (local processes) or ``"ray"`` (local Ray or a cluster)
    :param actor_backend_kwargs: Actor settings: ``env_fn``, ``n_envs_per_actor``, ``delay``, ``actor_timeout``, ...
        (see ``docs/actors.md``)
    :param kwargs: Every other argument of :class:`stable_baselines3.PPO`, with the same defaults
    """

    def __init__(
        self,
        policy: str | type[ActorCriticPolicy],
        env: GymEnv | str,
        *args: Any,
        policy_lag: PolicyLagSpec = 0,
        n_actors: int = 0,
        actor_backend: str = "process",
        actor_backend_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ):
        parse_policy_lag(policy_lag)
        # PPO's constructor would fail on these with a bare TypeError, or accept 16.5 and fail later
        for name in ("n_steps", "batch_size", "n_epochs"):
            if name in kwargs:
                check_integer(name, kwargs[name])
        # Set before PPO's constructor, which may build the model (and the lag ring with it).
        self.policy_lag = policy_lag
        super().__init__(
            policy,
            env,
            *args,
            n_actors=n_actors,
            actor_backend=actor_backend,
            actor_backend_kwargs=actor_backend_kwargs,
            **kwargs,
        )

    def train(self) -> None:
        """Log ``train/tv_behavior`` (the learner's distance to the acting policies), then run SB3's ``PPO.train()``."""
        self.logger.record("train/tv_behavior", self._learner_tv_to_behavior())
        super().train()
