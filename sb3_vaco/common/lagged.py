"""
The lag mixin: an SB3 on-policy algorithm whose rollouts come from stale policies, injected
(:class:`~sb3_vaco.common.policy_lag.PolicyLag`) or real (the asynchronous actors, :mod:`sb3_vaco.actors`).
Here: the one marked copy of SB3's ``collect_rollouts`` and the checkpoint that keeps the lag state where SB3's
loaders do not trip on it.
"""

import io
import pathlib
import warnings
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.save_util import open_path
from stable_baselines3.common.type_aliases import GymEnv, MaybeCallback
from stable_baselines3.common.utils import obs_as_tensor
from stable_baselines3.common.vec_env import VecEnv

from sb3_vaco.actors.base import ActorSettings, parse_actor_settings
from sb3_vaco.actors.pool import ActorPool
from sb3_vaco.common.buffers import LaggedDictRolloutBuffer, LaggedRolloutBuffer, Observation
from sb3_vaco.common.checkpoint import add_lag_state, read_lag_state
from sb3_vaco.common.checks import check_hyperparameters
from sb3_vaco.common.collect import RolloutWriter
from sb3_vaco.common.lag_spec import PolicyLagSpec, parse_policy_lag
from sb3_vaco.common.losses import total_variation
from sb3_vaco.common.policy_lag import PolicyLag
from sb3_vaco.common.steps import env_actions

SelfLaggedOnPolicyAlgorithm = TypeVar("SelfLaggedOnPolicyAlgorithm", bound="LaggedOnPolicyAlgorithm")
# Rows per forward pass when the learner re-evaluates a whole rollout.
_EVAL_CHUNK = 4096


class LaggedOnPolicyAlgorithm(OnPolicyAlgorithm):
    """
    An SB3 on-policy algorithm whose rollouts come from stale policies (injected policy lag), as a mixin in front of a
    host algorithm: ``class LaggedPPO(LaggedOnPolicyAlgorithm, PPO)``, ``class LaggedTRPO(LaggedOnPolicyAlgorithm,
    TRPO)``; VACO and the peers subclass it through :class:`~sb3_vaco.common.aligned.AlignedOnPolicyAlgorithm`.

    What the mixin does: it takes ``policy_lag`` and the actor settings, chooses a :class:`LaggedRolloutBuffer` (which
    also stores the behavior log-probs and policy versions, and the observations a re-estimation needs), replaces
    SB3's ``collect_rollouts`` by the one marked copy in which :class:`PolicyLag`'s acting policies (or the actors)
    collect, and logs the measured lag (``rollout/policy_lag_*``) and the learner's distance to its data
    (``train/tv_behavior``, before the host's ``train()``).

    What a host must provide (SB3's ``PPO`` and sb3-contrib's ``TRPO`` do, unchanged):

    * it is an :class:`~stable_baselines3.common.on_policy_algorithm.OnPolicyAlgorithm` with an
      :class:`~stable_baselines3.common.policies.ActorCriticPolicy` (``policy(obs)`` returns actions, values and
      log-probs, ``evaluate_actions`` and ``predict_values`` exist);
    * its collection is SB3's ``collect_rollouts`` (the mixin's marked copy replaces it), or SB3's plus per-step
      inputs of the policy that the buffer stores: such a host names its buffers in ``lagged_buffer_classes`` (its own
      buffer class combined with :class:`LaggedRolloutBuffer`) and returns the inputs from ``_policy_inputs`` and
      ``_evaluation_inputs`` (``LaggedMaskablePPO``: the action masks);
    * its ``train()`` reads the buffer only through ``rollout_buffer.get()`` and ``RolloutBufferSamples`` fields:
      under lag ``old_log_prob`` is then the behavior policy's log-prob and the advantages are GAE with the behavior
      critics, which is what the naive asynchronous version of the host does.

    ``bootstrap_at_train_time`` chooses how time-limit truncations are bootstrapped: ``False`` adds
    ``γ·V_μ(terminal obs)`` of the *behavior* critic to the reward at collection time (SB3's way, what naive
    asynchronous PPO does); ``True`` keeps the terminal observation in the buffer so the learner's critic can
    bootstrap at train time (VACO and the peers).

    With ``n_actors > 0`` the rollouts come from asynchronous actors instead (``model._actors``, an
    :class:`~sb3_vaco.actors.pool.ActorPool`; see ``docs/actors.md``).

    :param policy: the policy model to use
    :param env: the environment to learn from (with actors: also what the actors build, if it is an env id)
    :param args: the host algorithm's positional arguments
    :param policy_lag: Injected policy lag: every env acts with the learner's parameters from ``K`` updates
        ago, or, for a pair ``(K_min, K_max)``, each env with its own staleness drawn per rollout
    :param n_actors: 0: synchronous collection (with injected ``policy_lag``); ``> 0``: that many asynchronous actors
    :param actor_backend: ``"process"`` (local processes) or ``"ray"``
    :param actor_backend_kwargs: actor settings (:class:`~sb3_vaco.actors.base.ActorSettings`)
    :param kwargs: the host algorithm's keyword arguments
    """

    bootstrap_at_train_time: bool = False
    #: The rollout buffers (flat observations, Dict observations) that the mixin gives the host when it names none
    lagged_buffer_classes: ClassVar[tuple[type[LaggedRolloutBuffer], type[LaggedRolloutBuffer]]] = (
        LaggedRolloutBuffer,
        LaggedDictRolloutBuffer,
    )
    policy_lag: PolicyLagSpec
    rollout_buffer: LaggedRolloutBuffer
    _policy_lag: PolicyLag

    def __init__(
        self,
        policy: Any,
        env: GymEnv | str,
        *args: Any,
        policy_lag: PolicyLagSpec = 0,
        n_actors: int = 0,
        actor_backend: str = "process",
        actor_backend_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        parse_policy_lag(policy_lag)
        # Before the host's constructor, which would fail on some with a bare TypeError and accept others silently
        check_hyperparameters(kwargs)
        # Set before the parent constructor, which may build the model (and the lag ring with it).
        self.policy_lag = policy_lag
        self.n_actors = n_actors
        self.actor_backend = actor_backend
        self.actor_backend_kwargs = actor_backend_kwargs
        self._actor_settings: ActorSettings = parse_actor_settings(n_actors, actor_backend, actor_backend_kwargs)
        self._actor_env_id = env if isinstance(env, str) else None  # what the actors build by default
        self._actors: ActorPool | None = None
        super().__init__(policy, env, *args, **kwargs)

    def _setup_model(self) -> None:
        if self.rollout_buffer_class is None:
            flat_buffer, dict_buffer = self.lagged_buffer_classes
            self.rollout_buffer_class = dict_buffer if isinstance(self.observation_space, spaces.Dict) else flat_buffer
        self._setup_actors()
        super()._setup_model()
        if not issubclass(self.rollout_buffer_class, LaggedRolloutBuffer):
            raise ValueError(
                f"`rollout_buffer_class` must be a subclass of LaggedRolloutBuffer, got {self.rollout_buffer_class.__name__}"
            )
        self._policy_lag = PolicyLag(self.policy_lag, self.policy, seed=self.seed)

    def _setup_actors(self) -> None:
        """With ``n_actors > 0``: the actors (checked now, started by ``learn()``); the buffer's columns are their envs."""
        self._actor_settings = parse_actor_settings(self.n_actors, self.actor_backend, self.actor_backend_kwargs)
        self._actors = None
        if self.n_actors == 0:
            return
        if parse_policy_lag(self.policy_lag) != (0, 0):
            raise ValueError(
                f"`policy_lag` must be 0 when n_actors > 0 (the actors' lag is real, not injected), got {self.policy_lag!r}"
            )
        self._actors = ActorPool(self._actor_settings, self._actor_env_id)
        self._actors.check_env(self.env)
        self.n_envs = self._actors.n_envs

    def _rollout_n_envs(self) -> int:
        """Columns of the rollout buffer: the envs of all actors with actors, else the env's."""
        if self.n_actors > 0:
            return self._actor_settings.n_envs
        assert self.env is not None
        return self.env.num_envs

    def _learner_tv_to_behavior(self) -> float:
        """``TV(π_T, μ)`` over the rollout: how far the learner is from the policies that acted."""
        if not self._policy_lag.enabled and self.n_actors == 0:
            return 0.0
        buffer = self.rollout_buffer
        self.policy.set_training_mode(False)
        with th.no_grad():
            _, learner_log_probs = self._evaluate_rollout(buffer.flat_observations(), buffer.flat_actions())
        self.policy.set_training_mode(True)
        log_rhos = buffer.flat_to_time_major(learner_log_probs) - buffer.time_major("log_probs")
        return total_variation(th.as_tensor(log_rhos)).item()

    def _evaluate_rollout(self, observations: Observation, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Learner values and log-probs of every stored sample, in chunks, without gradient."""
        n_samples = len(actions)
        values, log_probs = np.zeros(n_samples, dtype=np.float32), np.zeros(n_samples, dtype=np.float32)
        for start in range(0, n_samples, _EVAL_CHUNK):
            rows = slice(start, start + _EVAL_CHUNK)
            obs = {key: o[rows] for key, o in observations.items()} if isinstance(observations, dict) else observations[rows]
            chunk_actions = th.as_tensor(actions[rows].astype(np.float32, copy=False), device=self.device)
            if isinstance(self.action_space, spaces.Discrete):
                chunk_actions = chunk_actions.long().flatten()
            chunk_obs, inputs = obs_as_tensor(obs, self.device), self._evaluation_inputs(rows)
            chunk_values, chunk_log_probs, _ = self.policy.evaluate_actions(chunk_obs, chunk_actions, **inputs)
            values[rows] = chunk_values.flatten().cpu().numpy()
            log_probs[rows] = chunk_log_probs.cpu().numpy()
        return values, log_probs

    # ----- what a host with more per-step inputs (MaskablePPO's action masks) overrides --------------------------------

    def _policy_inputs(self, env: VecEnv) -> dict[str, np.ndarray]:
        """More inputs of the acting policies' forward pass at this step, stored with it in the buffer (none)."""
        return {}

    def _evaluation_inputs(self, rows: slice) -> dict[str, Any]:
        """More inputs of ``policy.evaluate_actions`` for the stored samples ``rows`` (flat layout) of the rollout."""
        return {}

    # ----- save / load: SB3's checkpoint, and the lag state in a member that SB3's loaders skip -------------------

    def _excluded_save_params(self) -> list[str]:
        # The lag state is saved apart (save()); the actors are runtime state: a loaded model starts new ones at its
        # next learn(). The rollout buffer class the mixin chose is not saved, so that the host's own load()
        # (PPO.load) of the checkpoint builds the host's buffer.
        excluded = [*super()._excluded_save_params(), "_policy_lag", "_actors", "_actor_settings"]
        if self.rollout_buffer_class in self.lagged_buffer_classes:
            excluded.append("rollout_buffer_class")
        return excluded

    def save(
        self,
        path: str | pathlib.Path | io.BufferedIOBase,
        exclude: Any = None,
        include: Any = None,
        include_lag_state: bool = True,
    ) -> None:
        """
        SB3's ``save()``; the host algorithm's ``load()`` reads the file (``PPO.load`` a ``LaggedPPO`` checkpoint).

        The lag state (the snapshot ring, the versions and the staleness generator) goes into a zip member of its own,
        so that training resumed with ``load()`` and ``learn(..., reset_num_timesteps=False)`` continues under the same
        lag. At lag ``K`` the ring holds ``K + 1`` copies of the policy's parameters (not its optimizer): a checkpoint
        at lag 16 is several times the size of one at lag 0.

        :param path: path to the file where the model should be saved (``.zip`` is added if it has no suffix)
        :param exclude: names of parameters that should be excluded in addition to the default ones
        :param include: names of parameters that might be excluded but should be included anyway
        :param include_lag_state: False: leave the lag state out (a checkpoint of the parent's size; a run resumed from
            it starts the lag afresh, with a warning at load)
        """
        checkpoint = io.BytesIO()
        super().save(checkpoint, exclude=exclude, include=include)
        if include_lag_state:
            add_lag_state(checkpoint, self._policy_lag.state_dict())
        file = open_path(path, "w", verbose=0, suffix="zip")
        try:
            file.write(checkpoint.getvalue())
        finally:
            if not isinstance(path, io.BufferedIOBase):
                file.close()

    @classmethod
    def load(  # type: ignore[override]
        cls: type[SelfLaggedOnPolicyAlgorithm],
        path: str | pathlib.Path | io.BufferedIOBase,
        env: GymEnv | None = None,
        device: th.device | str = "auto",
        custom_objects: dict[str, Any] | None = None,
        print_system_info: bool = False,
        force_reset: bool = True,
        **kwargs: Any,
    ) -> SelfLaggedOnPolicyAlgorithm:
        """SB3's ``load()``, then the lag state of the checkpoint (see :meth:`save`)."""
        model = super().load(path, env, device, custom_objects, print_system_info, force_reset, **kwargs)  # type: ignore[misc]
        state = read_lag_state(path, model.device)
        if state is not None:
            model._policy_lag.load_state_dict(state)
        elif model._policy_lag.enabled:
            warnings.warn(
                f"{path} was saved without its lag state (save(..., include_lag_state=False)): training resumed from it "
                "starts the lag afresh, with the loaded policy acting until the learner has moved policy_lag updates ahead"
            )
        return model

    # ----- collection ---------------------------------------------------------------------------------------------

    def _grad_steps_per_update(self) -> int:
        """
        The policy's gradient steps per count of ``_n_updates``, to log the lag in gradient steps: the minibatches of
        one epoch, as SB3's PPO (and the aligned algorithms) count one update per epoch. A host that counts one policy
        step per ``train()`` (sb3-contrib's TRPO) returns 1.
        """
        rollout_size = self.n_steps * self.n_envs
        return int(np.ceil(rollout_size / (getattr(self, "batch_size", None) or rollout_size)))

    def collect_rollouts(
        self,
        env: VecEnv,
        callback: BaseCallback,
        rollout_buffer: RolloutBuffer,
        n_rollout_steps: int,
    ) -> bool:
        """
        ``OnPolicyAlgorithm.collect_rollouts`` with the acting policy chosen by :class:`PolicyLag`.
        Copied from SB3 2.9 because SB3 offers no hook for the acting policy; the changes are marked ``lag:``.
        With ``policy_lag=0`` it makes exactly the same calls, in the same order, as SB3's.
        Each step is stored through a :class:`~sb3_vaco.common.collect.RolloutWriter`; with ``n_actors > 0`` the
        rollout comes from the actors instead (:meth:`ActorPool.collect_rollouts`, through the same writer).
        """
        assert isinstance(rollout_buffer, LaggedRolloutBuffer)
        writer = RolloutWriter(self, callback, rollout_buffer, self.bootstrap_at_train_time, self._grad_steps_per_update())
        if self._actors is not None:
            return self._actors.collect_rollouts(self, writer)
        assert self._last_obs is not None, "No previous observation was provided"
        lag: PolicyLag = self._policy_lag
        # Switch to eval mode (this affects batch norm / dropout)
        self.policy.set_training_mode(False)
        # lag: choose the acting policy of each env for this rollout
        lag.start_rollout(self._n_updates, env.num_envs)

        n_steps = 0
        rollout_buffer.reset()
        # Sample new weights for the state dependent exploration
        if self.use_sde:
            lag.reset_noise()

        callback.on_rollout_start()

        while n_steps < n_rollout_steps:
            if self.use_sde and self.sde_sample_freq > 0 and n_steps % self.sde_sample_freq == 0:
                # Sample a new noise matrix
                lag.reset_noise()

            with th.no_grad():
                # Convert to pytorch tensor or to TensorDict
                obs_tensor = obs_as_tensor(self._last_obs, self.device)  # type: ignore[arg-type]
                policy_inputs = self._policy_inputs(env)  # lag: e.g. MaskablePPO's action masks
                action_tensor, values, log_probs = lag.act(obs_tensor, **policy_inputs)  # lag: behavior policies act
            actions = action_tensor.cpu().numpy()

            # Rescale and perform action (lag: SB3's rescaling / clipping, shared with the actors)
            clipped_actions = env_actions(self.policy, actions)

            new_obs, rewards, dones, infos = env.step(clipped_actions)

            # lag: the rest of SB3's step (callbacks, episode infos, truncations, add) is shared with the actors' replay
            if not writer.step(
                locals(),
                self._last_obs,  # type: ignore[arg-type]
                actions,
                rewards,
                self._last_episode_starts,  # type: ignore[arg-type]
                dones,
                infos,
                values,
                log_probs,
                lag.env_versions,  # lag: which policy version acted
                lag.terminal_value,  # lag: the critic of the policy that acted in the env
                policy_inputs,
            ):
                return False
            n_steps += 1
            self._last_obs = new_obs  # type: ignore[assignment]
            self._last_episode_starts = dones

        with th.no_grad():
            # Compute value for the last timestep
            values = lag.predict_values(obs_as_tensor(new_obs, self.device))  # type: ignore[arg-type]  # lag: behavior critics

        rollout_buffer.compute_returns_and_advantage(last_values=values, dones=dones)
        rollout_buffer.set_bootstrap(new_obs, dones)  # type: ignore[arg-type]  # lag: for re-estimation at train time
        writer.record_lag(lag.version, lag.version - lag.env_versions, lag.env_lag_epochs)  # lag

        callback.update_locals(locals())

        callback.on_rollout_end()

        return True

    def train(self) -> None:
        """Log ``train/tv_behavior`` (the learner's distance to the acting policies), then run the host's ``train()``."""
        self.logger.record("train/tv_behavior", self._learner_tv_to_behavior())
        super().train()

    # ----- asynchronous actors (n_actors > 0): the hooks SB3 offers, delegating to ActorPool -------------------------

    def close_actors(self) -> None:
        """Stop the actors, if any are running (``learn()`` does it when it returns or raises)."""
        if self._actors is not None:
            self._actors.close()

    def learn(self: SelfLaggedOnPolicyAlgorithm, *args: Any, **kwargs: Any) -> SelfLaggedOnPolicyAlgorithm:
        """
        The parent's ``learn()``, with the class name as the default ``tb_log_name`` (tensorboard runs ``LaggedPPO_1``,
        ``IMPALA_1``, ...); actors (if any) are shut down when it returns or raises, Ctrl-C included.
        """
        if len(args) < 4 and "tb_log_name" not in kwargs:  # learn(total_timesteps, callback, log_interval, tb_log_name)
            kwargs["tb_log_name"] = type(self).__name__
        try:
            return super().learn(*args, **kwargs)
        finally:
            self.close_actors()

    def set_env(self, env: GymEnv, force_reset: bool = True) -> None:
        if self._actors is None:
            super().set_env(env, force_reset)
            return
        with self._actors.learner_env(self, env):
            super().set_env(env, force_reset)

    def _init_callback(self, callback: MaybeCallback, progress_bar: bool = False) -> BaseCallback:
        if progress_bar and self._actors is not None:
            callback, progress_bar = self._actors.progress_bar_callback(callback), False
        return super()._init_callback(callback, progress_bar)
