"""
The actor loop body shared by every backend: build the envs and a copy of the policy, load published parameters,
collect one :class:`~sb3_vaco.actors.base.Segment`. Also the (de)serialization of published parameters.
"""

import time
from collections.abc import Callable
from typing import Any

import cloudpickle
import numpy as np
import torch as th
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.running_mean_std import RunningMeanStd
from stable_baselines3.common.utils import obs_as_tensor
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv, VecNormalize, VecTransposeImage

from sb3_vaco.actors.base import ActorSpec, Observation, Payload, Segment
from sb3_vaco.common.steps import env_actions, time_limit_truncations

# ---------------------------------------------------------------------------------------------------------------------
# Published parameters: {"policy/<state_dict key>": array, "obs_rms/mean" (or "obs_rms/<key>/mean"): array, ...}.


def _rms_entries(prefix: str, rms: RunningMeanStd) -> Payload:
    return {f"{prefix}/mean": rms.mean, f"{prefix}/var": rms.var, f"{prefix}/count": np.asarray(rms.count, dtype=np.float64)}


def _load_rms(payload: Payload, prefix: str, rms: RunningMeanStd) -> None:
    rms.mean = payload[f"{prefix}/mean"].copy()
    rms.var = payload[f"{prefix}/var"].copy()
    rms.count = float(payload[f"{prefix}/count"])


def make_payload(policy: ActorCriticPolicy, vec_normalize: VecNormalize | None) -> Payload:
    """The learner's parameters, and its VecNormalize statistics if any, as numpy arrays."""
    payload = {f"policy/{name}": tensor.detach().cpu().numpy().copy() for name, tensor in policy.state_dict().items()}
    if vec_normalize is not None:
        if isinstance(vec_normalize.obs_rms, dict):
            for key, rms in vec_normalize.obs_rms.items():
                payload.update(_rms_entries(f"obs_rms/{key}", rms))
        else:
            payload.update(_rms_entries("obs_rms", vec_normalize.obs_rms))
        payload.update(_rms_entries("ret_rms", vec_normalize.ret_rms))
    return payload


def load_payload(payload: Payload, policy: ActorCriticPolicy, vec_normalize: VecNormalize | None) -> None:
    """Inverse of :func:`make_payload`: parameters into ``policy``, statistics into ``vec_normalize``."""
    # load_state_dict copies into the parameters (casting to their dtype), so writable arrays (the process backend's
    # private copy of the shared weights) are wrapped without a copy; read-only ones (Ray hands the payload over from
    # its object store) are copied, as th.as_tensor would wrap them with torch's "NumPy array is not writable" warning.
    state_dict = {
        name[len("policy/") :]: th.as_tensor(array) if array.flags.writeable else th.tensor(array)
        for name, array in payload.items()
        if name.startswith("policy/")
    }
    policy.load_state_dict(state_dict)
    if vec_normalize is not None:
        if isinstance(vec_normalize.obs_rms, dict):
            for key, rms in vec_normalize.obs_rms.items():
                _load_rms(payload, f"obs_rms/{key}", rms)
        else:
            _load_rms(payload, "obs_rms", vec_normalize.obs_rms)
        _load_rms(payload, "ret_rms", vec_normalize.ret_rms)


PayloadLayout = list[tuple[str, tuple[int, ...]]]


def payload_layout(payload: Payload) -> PayloadLayout:
    return [(name, tuple(np.shape(array))) for name, array in payload.items()]


def flatten_payload(payload: Payload, layout: PayloadLayout, out: np.ndarray) -> None:
    """Write a payload into one float64 vector (shared memory), in ``layout`` order. float32/int → float64 is exact."""
    offset = 0
    for name, shape in layout:
        size = int(np.prod(shape))
        out[offset : offset + size] = np.ravel(payload[name])
        offset += size


def unflatten_payload(flat: np.ndarray, layout: PayloadLayout) -> Payload:
    payload, offset = {}, 0
    for name, shape in layout:
        size = int(np.prod(shape))
        payload[name] = flat[offset : offset + size].reshape(shape)
        offset += size
    return payload


def payload_size(layout: PayloadLayout) -> int:
    return sum(int(np.prod(shape)) for _, shape in layout)


# ---------------------------------------------------------------------------------------------------------------------


def _moments(batch: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    return np.mean(batch, axis=0), np.var(batch, axis=0), len(batch)


def _stack_obs(observations: list[Any]) -> Observation:
    if isinstance(observations[0], dict):
        return {key: np.stack([obs[key] for obs in observations]) for key in observations[0]}
    return np.stack(observations)


class ActorWorker:
    """
    One actor: ``spec.n_envs`` envs in a ``DummyVecEnv`` (Monitor-wrapped, as ``make_vec_env`` does) and a CPU copy of
    the learner's policy. :meth:`collect` is SB3's ``collect_rollouts`` loop (acting and truncation rule shared with the
    learner: :mod:`sb3_vaco.common.steps`), storing what a :class:`Segment` holds.

    With VecNormalize the actor normalizes with the statistics the learner published (frozen: ``training=False``)
    and reports the moments of the raw observations and discounted returns it saw, which the learner merges into
    its own VecNormalize (the one place statistics are updated).

    :param spec: what to build
    :param actor_id: index of the actor
    :param incarnation: how many times this actor was replaced before (changes the seeds)
    """

    def __init__(self, spec: ActorSpec, actor_id: int, incarnation: int = 0) -> None:
        th.set_num_threads(spec.num_threads)
        self.spec = spec
        self.actor_id = actor_id
        seed = spec.actor_seed(actor_id, incarnation)
        if seed is not None:
            th.manual_seed(seed)
        self.rng = np.random.default_rng(seed)
        env_fn = cloudpickle.loads(spec.env_fn)
        env: VecEnv = make_vec_env(env_fn, n_envs=spec.n_envs, seed=seed, env_kwargs=spec.env_kwargs, vec_env_cls=DummyVecEnv)
        self.vec_normalize: VecNormalize | None = None
        for name, kwargs in spec.vec_wrappers:
            if name == "transpose":
                env = VecTransposeImage(env)
            else:
                env = self.vec_normalize = VecNormalize(env, training=False, **kwargs)
        self.env = env
        self.policy: ActorCriticPolicy = spec.policy_class(**spec.policy_kwargs)
        self.policy.set_training_mode(False)
        self.policy.requires_grad_(False)
        self.version = -1
        self._last_obs: Observation | None = None
        self._last_episode_starts = np.ones(spec.n_envs, dtype=bool)
        self._returns = np.zeros(spec.n_envs)  # raw discounted returns, for the learner's ret_rms

    def set_weights(self, version: int, payload: Payload) -> None:
        """Act with the published ``payload`` of ``version`` from the next segment on."""
        load_payload(payload, self.policy, self.vec_normalize)
        self.version = version

    def sleep_delay(self, still_running: Callable[[], bool] = lambda: True) -> None:
        """Wait the emulated link delay, in small steps so that a stop request is seen."""
        low, high = self.spec.delay
        if high <= 0:
            return
        end = time.monotonic() + self.rng.uniform(low, high)
        while still_running() and time.monotonic() < end:
            time.sleep(min(0.05, max(0.0, end - time.monotonic())))

    def collect(self, on_step: Callable[[], None] | None = None) -> Segment:
        """
        Step the envs ``n_steps`` times with the current parameters (``OnPolicyAlgorithm.collect_rollouts``).

        :param on_step: called after every env step (the process backend's heartbeat)
        """
        start = time.perf_counter()
        env, policy, n_steps, n_envs = self.env, self.policy, self.spec.n_steps, self.spec.n_envs
        if self._last_obs is None:
            self._last_obs = env.reset()  # type: ignore[assignment]
        normalize = self.vec_normalize
        raw_obs: list[Observation] = []
        raw_returns: list[np.ndarray] = []
        rows: dict[str, list[Any]] = {key: [] for key in ("obs", "actions", "rewards", "starts", "dones", "values", "logp")}
        truncated: list[tuple[int, int, Observation]] = []
        done_infos: list[tuple[int, int, dict[str, Any]]] = []

        if self.spec.use_sde:
            policy.reset_noise(n_envs)
        for step in range(n_steps):
            if self.spec.use_sde and self.spec.sde_sample_freq > 0 and step % self.spec.sde_sample_freq == 0:
                policy.reset_noise(n_envs)
            with th.no_grad():
                action_tensor, values, log_probs = policy(obs_as_tensor(self._last_obs, policy.device))  # type: ignore[arg-type]
            actions = action_tensor.cpu().numpy()
            clipped_actions = env_actions(policy, actions)
            new_obs, rewards, dones, infos = env.step(clipped_actions)

            rows["obs"].append(self._last_obs)
            rows["actions"].append(actions)
            rows["rewards"].append(rewards)
            rows["starts"].append(self._last_episode_starts)
            rows["dones"].append(dones)
            rows["values"].append(values.flatten().cpu().numpy())
            rows["logp"].append(log_probs.cpu().numpy())
            if normalize is not None:
                self._track_raw_statistics(normalize, dones, raw_obs, raw_returns)
            truncated.extend((step, idx, terminal_obs) for idx, terminal_obs in time_limit_truncations(dones, infos))
            for idx in np.flatnonzero(dones):  # the learner rebuilds the infos from these (ActorBatch.infos)
                info = {key: value for key, value in infos[idx].items() if key != "terminal_observation"}
                done_infos.append((step, int(idx), info))
            self._last_obs = new_obs  # type: ignore[assignment]
            self._last_episode_starts = dones
            if on_step is not None:
                on_step()

        with th.no_grad():
            last_values = policy.predict_values(obs_as_tensor(self._last_obs, policy.device))  # type: ignore[arg-type]
            truncation_values = np.zeros(0, dtype=np.float32)
            if truncated:
                terminal_batch = _stack_obs([obs for _, _, obs in truncated])
                truncation_values = policy.predict_values(obs_as_tensor(terminal_batch, policy.device)).flatten().cpu().numpy()  # type: ignore[arg-type]

        assert self._last_obs is not None
        obs_moments = None
        if raw_obs:
            stacked = _stack_obs(raw_obs)
            if isinstance(stacked, dict):
                obs_moments = {key: _moments(value.reshape(-1, *value.shape[2:])) for key, value in stacked.items()}
            else:
                obs_moments = {"": _moments(stacked.reshape(-1, *stacked.shape[2:]))}
        return Segment(
            actor_id=self.actor_id,
            version=self.version,
            observations=_stack_obs(rows["obs"]),
            actions=np.stack(rows["actions"]),
            rewards=np.stack(rows["rewards"]).astype(np.float32),
            episode_starts=np.stack(rows["starts"]).astype(np.float32),
            dones=np.stack(rows["dones"]).astype(np.float32),
            values=np.stack(rows["values"]).astype(np.float32),
            log_probs=np.stack(rows["logp"]).astype(np.float32),
            last_observations=self._last_obs,
            last_values=last_values.flatten().cpu().numpy(),
            truncations=[
                (step, idx, obs, float(value)) for (step, idx, obs), value in zip(truncated, truncation_values, strict=True)
            ],
            done_infos=done_infos,
            obs_moments=obs_moments,
            return_moments=_moments(np.concatenate(raw_returns)) if raw_returns else None,
            collect_seconds=time.perf_counter() - start,
        )

    def _track_raw_statistics(
        self, normalize: VecNormalize, dones: np.ndarray, raw_obs: list[Observation], raw_returns: list[np.ndarray]
    ) -> None:
        """Keep the raw observations and discounted returns of a step, as ``VecNormalize.step_wait`` would use them."""
        if normalize.norm_obs:
            raw_obs.append(normalize.get_original_obs())
        if normalize.norm_reward:
            self._returns = self._returns * normalize.gamma + normalize.get_original_reward()
            raw_returns.append(self._returns.copy())
            self._returns[dones] = 0.0

    def close(self) -> None:
        self.env.close()
