"""
The learner's side of the actors, what a ``LaggedOnPolicyAlgorithm`` holds as ``model._actors`` when ``n_actors > 0``:
check the setup, start the backend, publish parameters, take the next ``n_actors`` segments, assemble them into one
``[n_steps, n_actors * n_envs_per_actor]`` batch, replay it into the rollout buffer, merge VecNormalize statistics,
stop the backend when ``learn()`` ends.

Batching rule: a batch is the next ``n_actors`` segments to arrive, whichever actors and policy versions produced them
(several may come from one fast actor). The learner therefore never waits for the slowest actor; the price is that
a batch does not always hold one segment per actor. Each segment occupies its own block of buffer columns.
"""

import contextlib
import functools
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch as th
from stable_baselines3.common.callbacks import BaseCallback, CallbackList, ConvertCallback, ProgressBarCallback
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.type_aliases import GymEnv, MaybeCallback
from stable_baselines3.common.vec_env import VecEnv, VecMonitor, VecNormalize, VecTransposeImage
from stable_baselines3.common.vec_env.base_vec_env import VecEnvWrapper

from sb3_vaco.actors.base import ActorBackend, ActorSettings, ActorSpec, Observation, Segment, pickle_env_fn
from sb3_vaco.actors.worker import make_payload
from sb3_vaco.common.collect import RolloutWriter


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

    def truncation_value(self, step: int, column: int, terminal_observation: Observation | None = None) -> float:
        """``V_μ(terminal observation)`` of the truncation at ``(step, column)``, computed by the actor that acted."""
        return self.truncations[(step, column)][1]

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
    The actors of one algorithm. Built by ``LaggedOnPolicyAlgorithm._setup_model()`` (runtime state, never saved);
    the backend starts at the first rollout of each ``learn()`` call (versions count from 0 there) and stops when
    ``learn()`` returns or raises.

    :param settings: validated actor settings
    :param env_id: the algorithm's ``env`` argument if it was an env id (what the actors build unless ``env_fn`` is set)
    """

    def __init__(self, settings: ActorSettings, env_id: str | None) -> None:
        self.settings = settings
        self.env_id = env_id
        self.backend: ActorBackend | None = None
        self.spec: ActorSpec | None = None
        self.version = -1
        self._published_n_updates: int | None = None
        self.version_n_updates: dict[int, int] = {}  # version -> learner's n_updates when it was published
        self.dropped_segments = 0
        self.wait_seconds = 0.0

    @property
    def n_envs(self) -> int:
        """Columns of the rollout buffer: the envs of all actors."""
        return self.settings.n_envs

    @property
    def running(self) -> bool:
        return self.backend is not None

    # ----- setup --------------------------------------------------------------------------------------------------

    def env_fn(self, env: VecEnv | None) -> Any:
        """The env id or factory the actors build their envs from (checked to be picklable)."""
        env_fn = self.settings.env_fn if self.settings.env_fn is not None else self.env_id
        if env_fn is None:
            hint = ""
            try:
                spec = env.get_attr("spec", indices=[0])[0] if env is not None else None
                hint = f", e.g. actor_backend_kwargs={{'env_fn': {spec.id!r}}}" if spec is not None else ""
            except Exception:  # the env has no registered spec: no hint
                pass
            raise ValueError(
                "With n_actors > 0 the actors build their own envs: pass `env` as an env id string, or an env factory as "
                f"actor_backend_kwargs={{'env_fn': ...}} (an env id or a picklable callable returning a gym.Env){hint}"
            )
        pickle_env_fn(env_fn)
        return env_fn

    def check_env(self, env: VecEnv | None) -> None:
        """Fail at construction, not at the first rollout, if the actors cannot rebuild the learner's ``env``."""
        if env is not None:
            self.env_fn(env)
            vec_wrappers_of(env)

    @contextlib.contextmanager
    def learner_env(self, model: OnPolicyAlgorithm, env: GymEnv) -> Iterator[None]:
        """
        Around SB3's ``set_env()``: it requires ``env.num_envs == model.n_envs``, but with actors ``n_envs`` counts
        the actors' envs, not the learner's env (which is not stepped). The new env is checked as at construction.
        """
        model.n_envs = env.num_envs if isinstance(env, VecEnv) else 1
        try:
            yield
            self.check_env(model.env)
        finally:
            model.n_envs = self.n_envs

    def progress_bar_callback(self, callback: MaybeCallback) -> BaseCallback:
        """
        ``callback`` with SB3's progress bar added, advanced by the ``n_envs`` transitions of each ``on_step()`` call
        (SB3's bar advances by the learner env's ``num_envs``).
        """
        if isinstance(callback, list):
            callback = CallbackList(callback)
        if not isinstance(callback, BaseCallback):
            callback = ConvertCallback(callback)
        return CallbackList([callback, ActorProgressBarCallback()])

    # ----- collection ---------------------------------------------------------------------------------------------

    def collect_rollouts(self, model: OnPolicyAlgorithm, writer: RolloutWriter) -> bool:
        """
        ``collect_rollouts`` with asynchronous actors: publish the learner's parameters if it was updated since the
        last batch, take the next ``n_actors`` segments (whichever actors and versions produced them), then replay
        them step by step into the buffer exactly as a synchronous rollout of ``n_actors * n_envs_per_actor`` envs is
        stored, through the same code (``writer.step``: ``num_timesteps``, ``callback.on_step()`` once per step row, the
        episode-info buffer, truncations, ``add()``). The callbacks thus run in a burst once the batch has
        arrived; returning False stops training as usual.
        """
        model.policy.set_training_mode(False)
        vec_normalize = model.get_vec_normalize_env()
        self.publish(model, writer.n_updates, vec_normalize)  # a new version after every train()
        callback, rollout_buffer = writer.callback, writer.rollout_buffer
        rollout_buffer.reset()
        callback.on_rollout_start()
        batch = self.collect(self.settings.n_actors, vec_normalize)

        for step in range(model.n_steps):
            rewards = batch.rewards[step].copy()
            dones = batch.dones[step]
            infos = batch.infos(step)
            actions = batch.actions[step]
            if not writer.step(
                locals(),
                batch.observations_at(step),
                actions,
                rewards,
                batch.episode_starts[step],
                dones,
                infos,
                th.as_tensor(batch.values[step]),
                th.as_tensor(batch.log_probs[step]),
                batch.versions,
                functools.partial(batch.truncation_value, step),
            ):
                return False

        rollout_buffer.compute_returns_and_advantage(last_values=th.as_tensor(batch.last_values), dones=batch.last_dones)
        rollout_buffer.set_bootstrap(batch.last_observations, batch.last_dones)
        lag_epochs = writer.n_updates - np.array([self.version_n_updates[version] for version in batch.versions])
        writer.record_lag(self.version, self.version - batch.versions, lag_epochs)
        model.logger.record("rollout/actor_restarts", self.restarts)
        model.logger.record("rollout/actor_segments_dropped", self.dropped_segments)
        model.logger.record("rollout/actor_wait_time", self.wait_seconds)
        model.logger.record("rollout/actor_collect_time", float(np.mean([s.collect_seconds for s in batch.segments])))
        model.logger.record("rollout/actor_idle_time", float(np.mean([s.idle_seconds for s in batch.segments])))

        callback.update_locals(locals())
        callback.on_rollout_end()
        return True

    def _start(self, model: OnPolicyAlgorithm) -> None:
        """Describe the actors from the model as it is now (its env, policy and settings); versions count from 0."""
        assert model.env is not None
        self.spec = ActorSpec(
            env_fn=pickle_env_fn(self.env_fn(model.env)),
            env_kwargs=dict(self.settings.env_kwargs or {}),
            n_envs=self.settings.n_envs_per_actor,
            n_steps=model.n_steps,
            policy_class=type(model.policy),
            policy_kwargs=model.policy._get_constructor_parameters(),
            use_sde=model.use_sde,
            sde_sample_freq=model.sde_sample_freq,
            vec_wrappers=vec_wrappers_of(model.env),
            delay=self.settings.delay,
            num_threads=self.settings.num_threads,
            max_pending_segments=self.settings.max_pending_segments,
            seed=model.seed,
            n_actors=self.settings.n_actors,
        )
        self.version = -1
        self._published_n_updates = None
        self.version_n_updates = {}
        self.dropped_segments = 0
        self.wait_seconds = 0.0

    def _make_backend(self, spec: ActorSpec) -> ActorBackend:
        if self.settings.backend == "ray":
            from sb3_vaco.actors.ray_backend import RayActorBackend

            return RayActorBackend(spec, self.settings)
        from sb3_vaco.actors.process import ProcessActorBackend

        return ProcessActorBackend(spec, self.settings)

    def publish(self, model: OnPolicyAlgorithm, n_updates: int, vec_normalize: VecNormalize | None) -> None:
        """
        Publish the learner's parameters as a new version if it was updated since the last one (starts the actors).

        :param model: the learner
        :param n_updates: its update counter
        :param vec_normalize: its VecNormalize wrapper, if any (the actors normalize with its statistics)
        """
        if self.backend is not None and n_updates == self._published_n_updates:
            return
        if self.backend is None:
            self._start(model)
        self.version += 1
        self._published_n_updates = n_updates
        self.version_n_updates[self.version] = n_updates
        payload = make_payload(model.policy, vec_normalize)
        if self.backend is None:
            assert self.spec is not None
            self.backend = self._make_backend(self.spec)
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
        """``{actor_id: pid}`` of the running actors (empty when they are not running)."""
        return {} if self.backend is None else self.backend.pids()

    def close(self) -> None:
        """Stop the actors, if they are running (``learn()`` does it when it returns or raises)."""
        if self.backend is not None:
            backend, self.backend = self.backend, None
            backend.close()


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
