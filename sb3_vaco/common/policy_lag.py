"""
Injected policy lag: which policy acts in each env.

``policy_lag=K`` makes every env act with the learner's parameters from K updates ago;
``policy_lag=(K_min, K_max)`` gives each env (actor) its own staleness, drawn uniformly per rollout,
so one batch mixes several policy versions, as independent actors with random delays would.
"""

from typing import Any

import numpy as np
import torch as th
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.type_aliases import PyTorchObs

from sb3_vaco.common.buffers import Observation
from sb3_vaco.common.lag_spec import PolicyLagSpec, parse_policy_lag
from sb3_vaco.common.ring import SnapshotRing


def frozen_copy(policy: ActorCriticPolicy) -> ActorCriticPolicy:
    """A new module of ``policy``'s class and settings, in eval mode and without gradient (load weights into it)."""
    copy = policy.__class__(**policy._get_constructor_parameters()).to(policy.device)
    copy.set_training_mode(False)
    copy.requires_grad_(False)
    return copy


def _index_obs(obs: PyTorchObs, env_indices: th.Tensor) -> PyTorchObs:
    if isinstance(obs, dict):
        return {key: value[env_indices] for key, value in obs.items()}
    return obs[env_indices]


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
            self._behavior_pool.append(frozen_copy(self.learner))
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

    def act(self, obs: PyTorchObs, **policy_inputs: np.ndarray) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
        """
        Actions, behavior values and behavior log-probs for all envs, each env acting with its version.

        :param obs: the observations of all envs
        :param policy_inputs: more per-env inputs of the policy's forward pass, first axis the env (MaskablePPO's
            ``action_masks``)
        """
        if len(self.groups) == 1:
            return self.groups[0][0](obs, **policy_inputs)
        n_envs = len(self.env_versions)
        actions: th.Tensor | None = None
        values = th.zeros((n_envs, 1), device=self.groups[0][1].device)
        log_probs = th.zeros(n_envs, device=values.device)
        for policy, env_indices in self.groups:
            group_inputs = {name: value[env_indices.cpu().numpy()] for name, value in policy_inputs.items()}
            group_actions, group_values, group_log_probs = policy(_index_obs(obs, env_indices), **group_inputs)
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
