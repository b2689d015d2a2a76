"""
Injected policy lag: which policy acts in each env. One place, shared by VACO and LaggedPPO (and, for its snapshot
ring, by the LLM trainer ``sb3_vaco.llm.VACOGRPOTrainer``).

``policy_lag=K`` makes every env act with the learner's parameters from K updates ago;
``policy_lag=(K_min, K_max)`` gives each env (actor) its own staleness, drawn uniformly per rollout,
so one batch mixes several policy versions, as independent actors with random delays would.

Here: the snapshot ring (:class:`SnapshotRing`), the staleness draws and acting policies (:class:`PolicyLag`, saved
with the model), and the one marked copy of SB3's ``collect_rollouts`` (:class:`LaggedOnPolicyAlgorithm`).
``n_actors > 0`` replaces the injected lag by real asynchronous actors (``sb3_vaco/common/actors/``, held as
``model._actors``): the lag is then whatever the actors' speed and the learner's update time make it.
"""

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.save_util import load_from_zip_file
from stable_baselines3.common.type_aliases import GymEnv, MaybeCallback, PyTorchObs, TensorDict
from stable_baselines3.common.utils import obs_as_tensor
from stable_baselines3.common.vec_env import VecEnv
from torch import nn

from sb3_vaco.common.actors.base import ActorSettings, parse_actor_settings
from sb3_vaco.common.actors.pool import ActorPool
from sb3_vaco.common.actors.steps import env_actions, time_limit_truncations
from sb3_vaco.common.buffers import LaggedDictRolloutBuffer, LaggedRolloutBuffer, Observation
from sb3_vaco.common.checks import check_integer
from sb3_vaco.common.losses import MAX_LOG_RATIO

PolicyLagSpec = int | tuple[int, int] | list[int]
#: Sizes and counts of SB3's and sb3-contrib's on-policy algorithms, checked before the host's constructor sees them
INTEGER_HYPERPARAMETERS = ("n_steps", "batch_size", "n_epochs", "n_critic_updates", "cg_max_steps", "line_search_max_iter")
SelfLaggedOnPolicyAlgorithm = TypeVar("SelfLaggedOnPolicyAlgorithm", bound="LaggedOnPolicyAlgorithm")
# Rows per forward pass when the learner re-evaluates a whole rollout.
_EVAL_CHUNK = 4096


def parse_policy_lag(policy_lag: PolicyLagSpec) -> tuple[int, int]:
    """
    Validate a lag setting and return it as ``(K_min, K_max)``.

    :param policy_lag: ``K`` (every env K updates stale) or ``(K_min, K_max)`` (per-env staleness range)
    """
    if isinstance(policy_lag, (int, np.integer)) and not isinstance(policy_lag, bool):
        lag_range = (int(policy_lag), int(policy_lag))
    elif (
        isinstance(policy_lag, (tuple, list))
        and len(policy_lag) == 2
        and all(isinstance(k, (int, np.integer)) and not isinstance(k, bool) for k in policy_lag)
    ):
        lag_range = (int(policy_lag[0]), int(policy_lag[1]))
    else:
        raise ValueError(
            f"`policy_lag` must be an int K >= 0 or a pair (K_min, K_max) of ints with 0 <= K_min <= K_max, got {policy_lag!r}"
        )
    if lag_range[0] < 0 or lag_range[0] > lag_range[1]:
        raise ValueError(f"`policy_lag` must satisfy 0 <= K_min <= K_max, got {policy_lag!r}")
    return lag_range


def _index_obs(obs: PyTorchObs, env_indices: th.Tensor) -> PyTorchObs:
    if isinstance(obs, dict):
        return {key: value[env_indices] for key, value in obs.items()}
    return obs[env_indices]


class SnapshotRing:
    """
    Parameter snapshots of a module (its ``state_dict()``: parameters and buffers), keyed by *version*, an int that
    only grows (the SB3 algorithms: one version per update; the LLM trainer: the optimizer step).

    :meth:`select` gives the snapshot to act with for a wanted version: the newest one not newer than it, or the
    oldest one when none is that old (early in training). Old snapshots go when ``capacity`` is exceeded on
    :meth:`push` (SB3: ``K_max + 1`` versions are all that can act) or by :meth:`drop_before` (the LLM trainer, whose
    requests never go back in time).

    :param capacity: keep at most this many snapshots, dropping the oldest on :meth:`push` (None: no limit)
    :param device: where the snapshots are stored; None: on each tensor's own device; ``"cpu"``: a stale copy of an
        accelerator model costs host memory, not accelerator memory
    """

    def __init__(self, capacity: int | None = None, device: str | th.device | None = None) -> None:
        if capacity is not None and capacity < 1:
            raise ValueError(f"`capacity` must be None or >= 1, got {capacity!r}")
        self.capacity = capacity
        self.device = None if device is None else th.device(device)
        self._snapshots: dict[int, dict[str, th.Tensor]] = {}

    @property
    def versions(self) -> list[int]:
        """The stored versions, oldest first."""
        return sorted(self._snapshots)

    def __len__(self) -> int:
        return len(self._snapshots)

    def __contains__(self, version: object) -> bool:
        return version in self._snapshots

    def __getitem__(self, version: int) -> dict[str, th.Tensor]:
        """The snapshot of exactly ``version``."""
        return self._snapshots[version]

    @th.no_grad()
    def push(self, version: int, module: nn.Module) -> None:
        """Store a copy of ``module``'s parameters and buffers as ``version``."""
        self._snapshots[version] = {
            name: tensor.detach().clone() if self.device is None else tensor.detach().to(self.device, copy=True)
            for name, tensor in module.state_dict().items()
        }
        while self.capacity is not None and len(self._snapshots) > self.capacity:
            del self._snapshots[min(self._snapshots)]

    def select(self, target_version: int) -> tuple[int, dict[str, th.Tensor]]:
        """
        The snapshot to act with when the wanted version is ``target_version``: the newest one with a version
        ``<= target_version``, or the oldest one if there is none.

        :return: ``(version, state_dict)``
        """
        if not self._snapshots:
            raise RuntimeError("SnapshotRing.select() called before any snapshot was pushed")
        versions = self.versions
        eligible = [version for version in versions if version <= target_version]
        version = eligible[-1] if eligible else versions[0]
        return version, self._snapshots[version]

    def drop_before(self, version: int) -> None:
        """Drop every snapshot older than ``version``."""
        for old in [v for v in self._snapshots if v < version]:
            del self._snapshots[old]

    def state_dict(self) -> dict[int, dict[str, th.Tensor]]:
        """``{version: state_dict}`` (the stored tensors themselves, not copies)."""
        return dict(self._snapshots)

    def load_state_dict(self, state: dict[int, dict[str, th.Tensor]]) -> None:
        """Replace the snapshots by ``state`` (of :meth:`state_dict`), keeping the newest ``capacity`` ones."""
        self._snapshots = {}
        for version in sorted(state)[-self.capacity :] if self.capacity is not None else sorted(state):
            self._snapshots[int(version)] = {
                name: tensor if self.device is None else tensor.to(self.device) for name, tensor in state[version].items()
            }


class PolicyLag:
    """
    Keeps a :class:`SnapshotRing` of the learner's last ``K_max + 1`` parameter snapshots and decides, per rollout,
    which snapshot acts in each env.

    A new *version* starts each time the learner's parameters have been updated (detected through the
    algorithm's ``_n_updates`` counter) and a rollout begins. A staleness of ``k`` means the env acts with
    version ``current − k``; early in training, when fewer versions exist, the oldest one acts.
    With ``K_max = 0`` the learner itself acts and nothing is copied.

    Saved with the model (:meth:`state_dict`: versions, snapshots, the staleness generator), so that training
    resumed from a saved model continues under the same lag.

    :param policy_lag: ``K`` or ``(K_min, K_max)``
    :param learner: the learner's policy
    :param seed: seed of the staleness draws (independent of the global RNGs, so ``K = 0`` changes nothing)
    """

    def __init__(self, policy_lag: PolicyLagSpec, learner: ActorCriticPolicy, seed: int | None = None) -> None:
        self.min_lag, self.max_lag = parse_policy_lag(policy_lag)
        self.learner = learner
        self.rng = np.random.default_rng(seed)
        self.version = -1
        self._last_n_updates: int | None = None
        self.ring = SnapshotRing(capacity=self.max_lag + 1)
        self.version_n_updates: dict[int, int] = {}  # version -> learner's n_updates at that version, for the ring's
        self._behavior_pool: list[ActorCriticPolicy] = []
        # Per rollout: the acting policies and the envs each one acts in.
        self.groups: list[tuple[ActorCriticPolicy, th.Tensor]] = []
        self.env_versions = np.zeros(0, dtype=np.int64)
        self.env_lag_epochs = np.zeros(0, dtype=np.int64)

    @property
    def enabled(self) -> bool:
        return self.max_lag > 0

    def start_rollout(self, n_updates: int, n_envs: int) -> None:
        """Record the learner's current version and draw which version acts in each env for this rollout."""
        learner = self.learner
        if n_updates != self._last_n_updates:
            self.version += 1
            self._last_n_updates = n_updates
            if self.enabled:
                self.ring.push(self.version, learner)
                self.version_n_updates = {v: self.version_n_updates.get(v, n_updates) for v in self.ring.versions}

        if not self.enabled:
            self.groups = [(learner, th.arange(n_envs, device=learner.device))]
            self.env_versions = np.full(n_envs, self.version, dtype=np.int64)
            self.env_lag_epochs = np.zeros(n_envs, dtype=np.int64)
            return

        staleness = self.rng.integers(self.min_lag, self.max_lag + 1, size=n_envs)
        # The ring holds consecutive versions: the oldest acts where the wanted one is older (SnapshotRing.select).
        self.env_versions = np.maximum(self.version - staleness, self.ring.versions[0])
        self.groups = []
        self.env_lag_epochs = np.zeros(n_envs, dtype=np.int64)
        for slot, version in enumerate(np.unique(self.env_versions)):
            env_indices = np.flatnonzero(self.env_versions == version)
            self.env_lag_epochs[env_indices] = n_updates - self.version_n_updates[int(version)]
            behavior = learner if version == self.version else self._behavior_policy(slot)
            if behavior is not learner:
                behavior.load_state_dict(self.ring[int(version)])
            self.groups.append((behavior, th.as_tensor(env_indices, device=learner.device)))

    def _behavior_policy(self, slot: int) -> ActorCriticPolicy:
        # A separate module per acting version: SB3 policies keep one distribution object per module,
        # so a stale policy cannot be a second call on the learner.
        while len(self._behavior_pool) <= slot:
            policy = self.learner.__class__(**self.learner._get_constructor_parameters()).to(self.learner.device)
            policy.set_training_mode(False)
            policy.requires_grad_(False)
            self._behavior_pool.append(policy)
        return self._behavior_pool[slot]

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to continue under the same lag (tensors, ints and strings only: ``th.save``-able)."""
        return {
            "version": self.version,
            "last_n_updates": self._last_n_updates,
            "snapshots": self.ring.state_dict(),
            "version_n_updates": dict(self.version_n_updates),
            "rng": self.rng.bit_generator.state,
            # Rebuilt at load: building one draws from the global RNG (parameter init), which the uninterrupted run
            # did when it first needed it, not at its next rollout.
            "n_behavior_policies": len(self._behavior_pool),
        }

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        """
        Restore :meth:`state_dict`. With a different ``policy_lag`` than the saved one, the newest ``K_max + 1``
        snapshots are kept.

        :param state: what :meth:`state_dict` returned
        :param strict: unused (SB3's ``set_parameters()`` passes it to every object it loads)
        """
        self.version = int(state["version"])
        self._last_n_updates = None if state["last_n_updates"] is None else int(state["last_n_updates"])
        self.ring.load_state_dict(state["snapshots"])
        self.version_n_updates = {int(v): int(n) for v, n in state["version_n_updates"].items() if int(v) in self.ring}
        self.rng.bit_generator.state = state["rng"]
        if state["n_behavior_policies"] > 0:
            self._behavior_policy(int(state["n_behavior_policies"]) - 1)

    def reset_noise(self) -> None:
        """Resample gSDE exploration noise of every acting policy (each for the envs it acts in)."""
        for policy, env_indices in self.groups:
            policy.reset_noise(len(env_indices))

    def act(self, obs: PyTorchObs) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
        """Actions, behavior values and behavior log-probs for all envs, each env acting with its version."""
        if len(self.groups) == 1:
            return self.groups[0][0](obs)
        n_envs = len(self.env_versions)
        actions: th.Tensor | None = None
        values = th.zeros((n_envs, 1), device=self.groups[0][1].device)
        log_probs = th.zeros(n_envs, device=values.device)
        for policy, env_indices in self.groups:
            group_actions, group_values, group_log_probs = policy(_index_obs(obs, env_indices))
            if actions is None:
                actions = th.zeros((n_envs, *group_actions.shape[1:]), dtype=group_actions.dtype, device=values.device)
            actions[env_indices] = group_actions
            values[env_indices] = group_values
            log_probs[env_indices] = group_log_probs
        assert actions is not None
        return actions, values, log_probs

    def predict_values(self, obs: PyTorchObs, env_indices: th.Tensor | None = None) -> th.Tensor:
        """Values of the behavior critics for ``obs`` of the given envs (all envs by default)."""
        if len(self.groups) == 1:
            return self.groups[0][0].predict_values(obs)
        if env_indices is None:
            env_indices = th.arange(len(self.env_versions), device=self.groups[0][1].device)
        values = th.zeros((len(env_indices), 1), device=env_indices.device)
        for policy, group_envs in self.groups:
            rows = th.isin(env_indices, group_envs)
            if rows.any():
                values[rows] = policy.predict_values(_index_obs(obs, rows))
        return values

    def terminal_value(self, env_idx: int, terminal_observation: Observation) -> th.Tensor:
        """``V_μ(terminal observation)`` of the policy that acts in env ``env_idx`` (SB3's timeout bootstrap)."""
        terminal_obs = self.learner.obs_to_tensor(terminal_observation)[0]
        with th.no_grad():
            return self.predict_values(terminal_obs, th.tensor([env_idx], device=self.learner.device))[0]


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
    * it keeps SB3's ``collect_rollouts`` and stores nothing per step beyond SB3's ``RolloutBuffer`` fields (a host
      that overrides collection to store more, such as MaskablePPO's action masks, needs its own buffer and step);
    * its ``train()`` reads the buffer only through ``rollout_buffer.get()`` and ``RolloutBufferSamples`` fields:
      under lag ``old_log_prob`` is then the behavior policy's log-prob and the advantages are GAE with the behavior
      critics, which is what the naive asynchronous version of the host does.

    ``bootstrap_at_train_time`` chooses how time-limit truncations are bootstrapped: ``False`` adds
    ``γ·V_μ(terminal obs)`` of the *behavior* critic to the reward at collection time (SB3's way, what naive
    asynchronous PPO does); ``True`` keeps the terminal observation in the buffer so the learner's critic can
    bootstrap at train time (VACO and the peers).

    With ``n_actors > 0`` the rollouts come from asynchronous actors instead (``model._actors``, an
    :class:`~sb3_vaco.common.actors.pool.ActorPool`; see ``docs/actors.md``).

    :param policy: the policy model to use
    :param env: the environment to learn from (with actors: also what the actors build, if it is an env id)
    :param args: the host algorithm's positional arguments
    :param policy_lag: Injected policy lag: every env acts with the learner's parameters from ``K`` updates
        ago, or, for a pair ``(K_min, K_max)``, each env with its own staleness drawn per rollout
    :param n_actors: 0: synchronous collection (with injected ``policy_lag``); ``> 0``: that many asynchronous actors
    :param actor_backend: ``"process"`` (local processes) or ``"ray"``
    :param actor_backend_kwargs: actor settings (:class:`~sb3_vaco.common.actors.base.ActorSettings`)
    :param kwargs: the host algorithm's keyword arguments
    """

    bootstrap_at_train_time: bool = False
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
        # The host's constructor would fail on these with a bare TypeError, or accept 16.5 and fail later
        for name in INTEGER_HYPERPARAMETERS:
            if kwargs.get(name) is not None:
                check_integer(name, kwargs[name])
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
            is_dict = isinstance(self.observation_space, spaces.Dict)
            self.rollout_buffer_class = LaggedDictRolloutBuffer if is_dict else LaggedRolloutBuffer
        self._setup_actors()
        super()._setup_model()
        if not issubclass(self.rollout_buffer_class, LaggedRolloutBuffer):
            raise ValueError(
                f"`rollout_buffer_class` must be a subclass of LaggedRolloutBuffer, got {self.rollout_buffer_class.__name__}"
            )
        self._policy_lag = PolicyLag(self.policy_lag, self.policy, seed=self.seed)
        # Mean staleness (in policy versions) of the samples in the current rollout, measured at collection.
        self._rollout_policy_lag = 0.0

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
        """``½·mean|π_T/μ − 1|`` over the rollout: how far the learner is from the policies that acted."""
        if not self._policy_lag.enabled and self.n_actors == 0:
            return 0.0
        buffer = self.rollout_buffer
        self.policy.set_training_mode(False)
        with th.no_grad():
            _, learner_log_probs = self._evaluate_rollout(buffer.flat_observations(), buffer.flat_actions())
        self.policy.set_training_mode(True)
        log_rhos = buffer.flat_to_time_major(learner_log_probs) - buffer.time_major("log_probs")
        return float(0.5 * np.mean(np.abs(np.exp(np.clip(log_rhos, -MAX_LOG_RATIO, MAX_LOG_RATIO)) - 1.0)))

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
            chunk_values, chunk_log_probs, _ = self.policy.evaluate_actions(obs_as_tensor(obs, self.device), chunk_actions)
            values[rows] = chunk_values.flatten().cpu().numpy()
            log_probs[rows] = chunk_log_probs.cpu().numpy()
        return values, log_probs

    # ----- save / load: the lag ring is saved with the model ------------------------------------------------------

    def _get_torch_save_params(self) -> tuple[list[str], list[str]]:
        # The ring is saved like the policy's state_dict (`_policy_lag.pth` in the zip; PolicyLag.state_dict /
        # load_state_dict), so that a run resumed with `reset_num_timesteps=False` continues under the same lag.
        state_dicts, torch_variables = super()._get_torch_save_params()
        return [*state_dicts, "_policy_lag"], torch_variables

    def set_parameters(
        self,
        load_path_or_dict: str | TensorDict,
        exact_match: bool = True,
        device: th.device | str = "auto",
    ) -> None:
        """SB3's ``set_parameters()``; parameters saved without a lag ring (models saved before it was) keep this one."""
        params: dict[str, Any]
        if isinstance(load_path_or_dict, dict):
            params = load_path_or_dict
        else:
            _, params, _ = load_from_zip_file(load_path_or_dict, device=device, load_data=False)
        if "_policy_lag" not in params:
            params = {**params, "_policy_lag": self._policy_lag.state_dict()}
        super().set_parameters(params, exact_match, device)

    def _excluded_save_params(self) -> list[str]:
        # The actors are runtime state: a loaded model starts new ones at its next `learn()`.
        return [*super()._excluded_save_params(), "_policy_lag", "_rollout_policy_lag", "_actors", "_actor_settings"]

    # ----- collection ---------------------------------------------------------------------------------------------

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
        With ``n_actors > 0`` the rollout comes from the actors instead (:meth:`ActorPool.collect_rollouts`).
        """
        assert isinstance(rollout_buffer, LaggedRolloutBuffer)
        if self._actors is not None:
            return self._actors.collect_rollouts(self, callback, rollout_buffer)
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
                action_tensor, values, log_probs = lag.act(obs_tensor)  # lag: behavior policies act
            actions = action_tensor.cpu().numpy()

            # Rescale and perform action (lag: SB3's rescaling / clipping, shared with the actors)
            clipped_actions = env_actions(self.policy, actions)

            new_obs, rewards, dones, infos = env.step(clipped_actions)

            # lag: the rest of SB3's step (callbacks, episode infos, truncations, add) is shared with the actors' replay
            if not self._store_step(
                callback,
                locals(),
                rollout_buffer,
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
        self._record_lag_stats(lag.version, lag.version - lag.env_versions, lag.env_lag_epochs)  # lag

        callback.update_locals(locals())

        callback.on_rollout_end()

        return True

    def _store_step(
        self,
        callback: BaseCallback,
        step_locals: dict[str, Any],
        rollout_buffer: LaggedRolloutBuffer,
        observations: Observation,
        actions: np.ndarray,
        rewards: np.ndarray,
        episode_starts: np.ndarray,
        dones: np.ndarray,
        infos: list[dict[str, Any]],
        values: th.Tensor,
        log_probs: th.Tensor,
        behavior_versions: np.ndarray,
        behavior_terminal_value: Callable[[int, Observation], th.Tensor | float],
    ) -> bool:
        """
        SB3's step loop after ``env.step()`` (``OnPolicyAlgorithm.collect_rollouts``, SB3 2.9, where it is inline),
        for the synchronous rollout and the replay of actor segments alike: count the transitions, call the callbacks,
        update the episode-info buffer, handle time-limit truncations, add the step to the buffer.

        :param callback: the rollout's callback
        :param step_locals: the caller's ``locals()`` (what the callbacks see as ``self.locals``)
        :param rollout_buffer: the buffer
        :param observations: the observations the policies acted on
        :param actions: the actions as sampled
        :param rewards: the env rewards (a time-limit bootstrap is added in place)
        :param episode_starts: whether each observation starts an episode
        :param dones: the ``dones`` of the step
        :param infos: its ``infos``
        :param values: behavior critic values of ``observations``
        :param log_probs: behavior log-probs of ``actions``
        :param behavior_versions: the policy version that acted, per env
        :param behavior_terminal_value: ``(env index, terminal observation) -> V_μ(terminal observation)`` of the
            policy that acted in that env (used when truncations are bootstrapped at collection time)
        :return: False if a callback stopped training
        """
        self.num_timesteps += len(dones)

        # Give access to local variables
        callback.update_locals(step_locals)
        if not callback.on_step():
            return False

        self._update_info_buffer(infos, dones)

        if isinstance(self.action_space, spaces.Discrete):
            # Reshape in case of discrete action
            actions = actions.reshape(-1, 1)

        # Handle timeout by bootstrapping with value function
        # see GitHub issue #633
        for idx, terminal_obs in time_limit_truncations(dones, infos):
            if self.bootstrap_at_train_time:
                # lag: keep the observation, the learner's critic bootstraps it at train time
                rollout_buffer.add_truncation(idx, terminal_obs)
            else:
                rewards[idx] += self.gamma * behavior_terminal_value(idx, terminal_obs)

        rollout_buffer.add(
            observations,  # type: ignore[arg-type]
            actions,
            rewards,
            episode_starts,
            values,
            log_probs,
            behavior_version=behavior_versions,  # lag: which policy version acted
        )
        return True

    def _record_lag_stats(self, version: int, versions_behind: np.ndarray, lag_epochs: np.ndarray) -> None:
        """Log the staleness per env column: in policy versions, and in gradient steps (epochs × minibatches per epoch)."""
        batch_size = getattr(self, "batch_size", None) or self.n_steps * self.n_envs  # None: the whole rollout
        minibatches_per_epoch = int(np.ceil(self.n_steps * self.n_envs / batch_size))
        self._rollout_policy_lag = float(np.mean(versions_behind))
        self.logger.record("rollout/policy_version", version)
        self.logger.record("rollout/policy_lag_mean", float(np.mean(versions_behind)))
        self.logger.record("rollout/policy_lag_max", int(np.max(versions_behind)))
        self.logger.record("rollout/policy_lag_grad_steps_mean", float(np.mean(lag_epochs)) * minibatches_per_epoch)

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
