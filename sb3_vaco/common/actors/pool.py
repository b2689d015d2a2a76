"""
The learner's side of the actors: publish parameters, take the next ``n_actors`` segments, assemble them into one
``[n_steps, n_actors * n_envs_per_actor]`` batch, merge VecNormalize statistics.

Batching rule: a batch is the next ``n_actors`` segments to arrive, whichever actors and policy versions produced them
(several may come from one fast actor). The learner therefore never waits for the slowest actor; the price is that
a batch does not always hold one segment per actor. Each segment occupies its own block of buffer columns.
"""

import time
from typing import Any

import numpy as np
from stable_baselines3.common.callbacks import ProgressBarCallback
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.vec_env import VecEnv, VecMonitor, VecNormalize, VecTransposeImage
from stable_baselines3.common.vec_env.base_vec_env import VecEnvWrapper

from sb3_vaco.common.actors.base import ActorBackend, ActorSettings, ActorSpec, Observation, Segment, pickle_env_fn
from sb3_vaco.common.actors.worker import make_payload


class ActorProgressBarCallback(ProgressBarCallback):
    """SB3's progress bar, advanced by the transitions each ``on_step()`` call stands for (``model.n_envs``)."""

    def _on_step(self) -> bool:
        self.pbar.update(self.model.n_envs)
        return True


def vec_wrappers_of(env: VecEnv) -> list[tuple[str, dict[str, Any]]]:
    """
    The VecEnv wrappers of the learner's env that actors rebuild, innermost first: ``VecTransposeImage`` and
    ``VecNormalize`` (frozen: the learner's statistics are published with the parameters). ``VecMonitor`` is
    not needed (actors Monitor-wrap each env). Any other wrapper raises: apply it inside the env factory instead.
    """
    wrappers: list[tuple[str, dict[str, Any]]] = []
    while isinstance(env, VecEnvWrapper):
        if isinstance(env, VecNormalize):
            settings = dict(
                norm_obs=env.norm_obs,
                norm_reward=env.norm_reward,
                clip_obs=env.clip_obs,
                clip_reward=env.clip_reward,
                gamma=env.gamma,
                epsilon=env.epsilon,
                norm_obs_keys=env.norm_obs_keys,
            )
            wrappers.append(("normalize", settings))
        elif isinstance(env, VecTransposeImage):
            wrappers.append(("transpose", {}))
        elif not isinstance(env, VecMonitor):
            raise ValueError(
                f"{type(env).__name__} is not rebuilt in the actors (only VecNormalize and VecTransposeImage are): "
                "apply the corresponding gym.Wrapper inside the env factory (actor_backend_kwargs['env_fn']) instead"
            )
        env = env.venv
    return wrappers[::-1]


def _concat_obs(observations: list[Observation], axis: int) -> Observation:
    if isinstance(observations[0], dict):
        return {key: np.concatenate([obs[key] for obs in observations], axis=axis) for key in observations[0]}  # type: ignore[index]
    return np.concatenate(observations, axis=axis)  # type: ignore[arg-type]


class ActorBatch:
    """
    ``n_segments`` segments side by side: time-major ``[n_steps, n_envs]`` arrays in which segment ``k`` fills columns
    ``k * n_envs_per_actor ...``. It reads like one synchronous rollout of ``n_envs`` envs.

    :param segments: the segments, in arrival order
    """

    def __init__(self, segments: list[Segment]) -> None:
        self.segments = segments
        self.observations = _concat_obs([s.observations for s in segments], axis=1)
        self.actions = np.concatenate([s.actions for s in segments], axis=1)
        self.rewards, self.episode_starts, self.dones, self.values, self.log_probs = (
            np.concatenate([getattr(s, name) for s in segments], axis=1)
            for name in ("rewards", "episode_starts", "dones", "values", "log_probs")
        )
        self.versions = np.concatenate([np.full(s.rewards.shape[1], s.version, dtype=np.int64) for s in segments])
        self.last_observations = _concat_obs([s.last_observations for s in segments], axis=0)
        self.last_values = np.concatenate([s.last_values for s in segments]).astype(np.float32)
        self.last_dones = self.dones[-1]
        # (step, column) -> (terminal observation, behavior value) / info of a step that ended an episode
        self.truncations: dict[tuple[int, int], tuple[Observation, float]] = {}
        self.done_infos: dict[tuple[int, int], dict[str, Any]] = {}
        column = 0
        for segment in segments:
            for step, env_idx, obs, value in segment.truncations:
                self.truncations[(step, column + env_idx)] = (obs, value)
            for step, env_idx, info in segment.done_infos:
                self.done_infos[(step, column + env_idx)] = info
            column += segment.rewards.shape[1]
        self.n_envs = column
        self._done_columns: dict[int, list[int]] = {}
        for step, column in self.done_infos:
            self._done_columns.setdefault(step, []).append(column)

    def observations_at(self, step: int) -> Observation:
        """The observations of all columns at ``step``."""
        if isinstance(self.observations, dict):
            return {key: obs[step] for key, obs in self.observations.items()}
        return self.observations[step]

    def infos(self, step: int) -> list[dict[str, Any]]:
        """The ``infos`` a VecEnv would have returned at ``step`` (episode-end infos, terminal observations included)."""
        infos: list[dict[str, Any]] = [{} for _ in range(self.n_envs)]
        for column in self._done_columns.get(step, ()):
            infos[column] = dict(self.done_infos[(step, column)])
            if (step, column) in self.truncations:
                infos[column]["terminal_observation"] = self.truncations[(step, column)][0]
        return infos


class ActorPool:
    """
    Owns the actor backend for the learner: starts it lazily, publishes a new version after every update,
    takes batches of segments. Runtime state only (never saved).

    :param settings: validated actor settings
    :param env_fn: env id or factory the actors build their envs from
    :param env: the learner's env (its VecNormalize, if any, holds the statistics; its other wrappers are checked)
    :param policy: the learner's policy
    :param n_steps: steps per env and segment
    :param use_sde: gSDE exploration
    :param sde_sample_freq: gSDE resampling frequency
    :param seed: seed of the actors' envs (see :class:`~sb3_vaco.common.actors.base.ActorSpec`)
    """

    def __init__(
        self,
        settings: ActorSettings,
        env_fn: Any,
        env: VecEnv,
        policy: ActorCriticPolicy,
        n_steps: int,
        use_sde: bool,
        sde_sample_freq: int,
        seed: int | None,
    ) -> None:
        self.settings = settings
        self.spec = ActorSpec(
            env_fn=pickle_env_fn(env_fn),
            env_kwargs=dict(settings.env_kwargs or {}),
            n_envs=settings.n_envs_per_actor,
            n_steps=n_steps,
            policy_class=type(policy),
            policy_kwargs=policy._get_constructor_parameters(),
            use_sde=use_sde,
            sde_sample_freq=sde_sample_freq,
            vec_wrappers=vec_wrappers_of(env),
            delay=settings.delay,
            num_threads=settings.num_threads,
            max_pending_segments=settings.max_pending_segments,
            seed=seed,
            n_actors=settings.n_actors,
        )
        self.backend: ActorBackend | None = None
        self.version = -1
        self._published_n_updates: int | None = None
        self.version_n_updates: dict[int, int] = {}  # version -> learner's n_updates when it was published
        self.dropped_segments = 0
        self.wait_seconds = 0.0

    def _make_backend(self) -> ActorBackend:
        if self.settings.backend == "ray":
            from sb3_vaco.common.actors.ray_backend import RayActorBackend

            return RayActorBackend(self.spec, self.settings)
        from sb3_vaco.common.actors.process import ProcessActorBackend

        return ProcessActorBackend(self.spec, self.settings)

    def publish(self, policy: ActorCriticPolicy, n_updates: int, vec_normalize: VecNormalize | None) -> None:
        """Publish the learner's parameters as a new version if it was updated since the last one (starts the actors)."""
        if n_updates == self._published_n_updates and self.backend is not None:
            return
        self.version += 1
        self._published_n_updates = n_updates
        self.version_n_updates[self.version] = n_updates
        payload = make_payload(policy, vec_normalize)
        if self.backend is None:
            self.backend = self._make_backend()
            self.backend.start(self.version, payload)
        else:
            self.backend.publish(self.version, payload)

    def collect(self, n_segments: int, vec_normalize: VecNormalize | None) -> ActorBatch:
        """
        Take the next ``n_segments`` segments (dropping those more than ``max_policy_lag`` versions behind) and merge
        their normalization statistics into the learner's VecNormalize, when it is training.
        """
        assert self.backend is not None, "publish() starts the actors"
        start = time.perf_counter()
        segments: list[Segment] = []
        max_lag = self.settings.max_policy_lag
        while len(segments) < n_segments:
            segment = self.backend.next_segment()
            if max_lag is not None and self.version - segment.version > max_lag:
                self.dropped_segments += 1
                continue
            segments.append(segment)
            if vec_normalize is not None and vec_normalize.training:
                _merge_moments(vec_normalize, segment)
        self.wait_seconds = time.perf_counter() - start
        return ActorBatch(segments)

    @property
    def restarts(self) -> int:
        return 0 if self.backend is None else self.backend.restarts

    def pids(self) -> dict[int, int]:
        """``{actor_id: pid}`` of the running actors (empty before the first ``learn()`` step)."""
        return {} if self.backend is None else self.backend.pids()

    def close(self) -> None:
        if self.backend is not None:
            self.backend.close()


def _merge_moments(vec_normalize: VecNormalize, segment: Segment) -> None:
    """Fold an actor's raw observation / return moments into the learner's running statistics (exact parallel merge)."""
    if segment.obs_moments is not None and vec_normalize.norm_obs:
        if isinstance(vec_normalize.obs_rms, dict):
            for key, rms in vec_normalize.obs_rms.items():
                rms.update_from_moments(*segment.obs_moments[key])
        else:
            vec_normalize.obs_rms.update_from_moments(*segment.obs_moments[""])
    if segment.return_moments is not None and vec_normalize.norm_reward:
        vec_normalize.ret_rms.update_from_moments(*segment.return_moments)
