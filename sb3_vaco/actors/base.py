"""
Asynchronous actors: the settings, what an actor sends (:class:`Segment`), what it is built from (:class:`ActorSpec`)
and the protocol every backend implements (:class:`ActorBackend`).

Data flows one way: actors act with the newest parameters the learner *published* and send segments; the learner
assembles the next ``n_actors`` segments into one batch (see :class:`sb3_vaco.actors.pool.ActorPool`).
Nothing here imports torch or ray: this module is safe to import anywhere.
"""

import dataclasses
import time
import warnings
from abc import ABC, abstractmethod
from typing import Any

import cloudpickle
import numpy as np

from sb3_vaco.common import checks

Observation = np.ndarray | dict[str, np.ndarray]
Payload = dict[str, np.ndarray]

ACTOR_BACKENDS = ("process", "ray")


@dataclasses.dataclass(frozen=True)
class ActorSettings:
    """
    The validated ``actor_backend_kwargs`` (see ``docs/actors.md``).

    :param n_actors: Number of actor processes / Ray actors
    :param backend: ``"process"`` (multiprocessing on this machine) or ``"ray"`` (local or a cluster)
    :param n_envs_per_actor: Envs stepped by each actor (a ``DummyVecEnv``); buffer columns = ``n_actors * n_envs_per_actor``
    :param env_fn: Env factory for the actors: a registered env id or a picklable callable returning a ``gym.Env``.
        None: the ``env`` argument of the algorithm if it was a string
    :param env_kwargs: Keyword arguments of the env factory
    :param delay: Seconds an actor waits before sending each segment, fixed or drawn uniformly from ``(low, high)``
        (emulates slow links)
    :param max_pending_segments: Segments an actor may have finished that the learner has not taken yet; the actor
        idles when it has that many (backpressure: bounds the lag)
    :param max_policy_lag: Drop segments more than this many versions behind the learner (None: keep all)
    :param actor_timeout: Seconds without a sign of life after which an actor is considered hung and replaced
    :param startup_timeout: Seconds an actor may take to start (import torch, build its envs) before it is replaced
    :param max_restarts: Replacements allowed per ``learn()`` call before training stops with an error
    :param num_threads: Torch threads in each actor
    :param start_method: multiprocessing start method (``"forkserver"`` where available, else ``"spawn"``; never ``"fork"``)
    :param address: Ray: address of the cluster to join (``"auto"``, ``"ray://host:10001"``); None starts Ray locally
    :param num_cpus: Ray: CPUs of a locally started Ray (default ``n_actors``)
    :param ray_init_kwargs: Ray: more keyword arguments of ``ray.init``
    :param actor_options: Ray: options of each actor (default ``{"num_cpus": 1}``)
    """

    n_actors: int
    backend: str = "process"
    n_envs_per_actor: int = 1
    env_fn: Any = None
    env_kwargs: dict[str, Any] | None = None
    delay: tuple[float, float] = (0.0, 0.0)
    max_pending_segments: int = 1
    max_policy_lag: int | None = None
    actor_timeout: float = 60.0
    startup_timeout: float = 180.0
    max_restarts: int = 20
    num_threads: int = 1
    start_method: str | None = None
    address: str | None = None
    num_cpus: int | None = None
    ray_init_kwargs: dict[str, Any] | None = None
    actor_options: dict[str, Any] | None = None

    @property
    def n_envs(self) -> int:
        """Columns of the rollout buffer: the envs of all actors."""
        return self.n_actors * self.n_envs_per_actor


_COMMON_KEYS = (
    "n_envs_per_actor",
    "env_fn",
    "env_kwargs",
    "delay",
    "max_pending_segments",
    "max_policy_lag",
    "actor_timeout",
    "startup_timeout",
    "max_restarts",
    "num_threads",
)
_BACKEND_KEYS = {"process": ("start_method",), "ray": ("address", "num_cpus", "ray_init_kwargs", "actor_options")}


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def parse_actor_settings(n_actors: int, actor_backend: str, actor_backend_kwargs: dict[str, Any] | None) -> ActorSettings:
    """
    Validate the actor knobs of ``VACO`` / ``LaggedPPO`` and return them as :class:`ActorSettings`.

    :param n_actors: 0 (synchronous collection, optionally with injected lag) or the number of asynchronous actors
    :param actor_backend: ``"process"`` or ``"ray"``
    :param actor_backend_kwargs: see :class:`ActorSettings`
    """
    if not _is_int(n_actors) or n_actors < 0:
        raise ValueError(f"`n_actors` must be an int >= 0 (0: no actors), got {n_actors!r}")
    if actor_backend not in ACTOR_BACKENDS:
        raise ValueError(f"`actor_backend` must be one of {', '.join(map(repr, ACTOR_BACKENDS))}; got {actor_backend!r}")
    if actor_backend_kwargs is not None and not isinstance(actor_backend_kwargs, dict):
        raise ValueError(f"`actor_backend_kwargs` must be a dict or None, got {type(actor_backend_kwargs).__name__}")
    kwargs = dict(actor_backend_kwargs or {})
    valid = (*_COMMON_KEYS, *_BACKEND_KEYS[actor_backend])
    unknown = sorted(set(kwargs) - set(valid))
    if unknown:
        raise ValueError(
            f"`actor_backend_kwargs` has unknown key(s) {unknown} for actor_backend={actor_backend!r}; "
            f"valid: {', '.join(valid)}"
        )

    def require(condition: bool, message: str) -> None:
        checks.require(condition, f"`actor_backend_kwargs`: {message}")

    delay = kwargs.pop("delay", 0.0)
    if isinstance(delay, (int, float, np.floating)) and not isinstance(delay, bool):
        delay = (float(delay), float(delay))
    require(
        isinstance(delay, (tuple, list)) and len(delay) == 2 and 0.0 <= float(delay[0]) <= float(delay[1]),
        f"'delay' must be seconds >= 0 or a pair (low, high) with 0 <= low <= high, got {delay!r}",
    )
    settings = ActorSettings(n_actors=int(n_actors), backend=actor_backend, delay=(float(delay[0]), float(delay[1])), **kwargs)

    for name in ("n_envs_per_actor", "max_pending_segments", "num_threads"):
        value = getattr(settings, name)
        require(_is_int(value) and value >= 1, f"'{name}' must be an int >= 1, got {value!r}")
    require(_is_int(settings.max_restarts) and settings.max_restarts >= 0, "'max_restarts' must be an int >= 0")
    require(
        settings.max_policy_lag is None or (_is_int(settings.max_policy_lag) and settings.max_policy_lag >= 0),
        f"'max_policy_lag' must be None or an int >= 0, got {settings.max_policy_lag!r}",
    )
    for name in ("actor_timeout", "startup_timeout"):
        value = getattr(settings, name)
        require(isinstance(value, (int, float)) and value > 0, f"'{name}' must be > 0 seconds, got {value!r}")
    require(
        settings.start_method in (None, "spawn", "forkserver"),
        f"'start_method' must be 'spawn' or 'forkserver' (fork is unsafe with torch), got {settings.start_method!r}",
    )
    require(
        settings.env_fn is None or isinstance(settings.env_fn, str) or callable(settings.env_fn),
        f"'env_fn' must be an env id or a callable returning a gym.Env, got {settings.env_fn!r}",
    )
    for name in ("env_kwargs", "ray_init_kwargs", "actor_options"):
        value = getattr(settings, name)
        require(value is None or isinstance(value, dict), f"'{name}' must be a dict or None, got {value!r}")
    return settings


def pickle_env_fn(env_fn: Any) -> bytes:
    """Serialize an env factory with cloudpickle (lambdas and closures included), with a clear error if it cannot be."""
    try:
        return cloudpickle.dumps(env_fn)
    except Exception as error:
        raise ValueError(
            f"The actors' env factory {env_fn!r} cannot be pickled ({type(error).__name__}: {error}). "
            "Pass an env id string or a picklable callable as actor_backend_kwargs={'env_fn': ...} "
            "(for example a module-level function or a functools.partial of a gym.Env class)."
        ) from error


@dataclasses.dataclass
class ActorSpec:
    """
    Everything an actor needs to build its envs and its copy of the policy. Sent once, cloudpickled, at start.

    :param env_fn: cloudpickled env id or env factory
    :param env_kwargs: keyword arguments of the env factory
    :param n_envs: envs per actor
    :param n_steps: steps per env and segment (the algorithm's ``n_steps``)
    :param policy_class: the learner's policy class
    :param policy_kwargs: its constructor parameters (``policy._get_constructor_parameters()``)
    :param use_sde: gSDE exploration
    :param sde_sample_freq: resample the gSDE noise every this many steps (-1: once per segment)
    :param vec_wrappers: VecEnv wrappers to rebuild around the actor's envs, innermost first:
        ``("transpose", {})`` (``VecTransposeImage``) and ``("normalize", kwargs)`` (``VecNormalize``, frozen statistics)
    :param delay: ``(low, high)`` seconds to wait before sending a segment
    :param num_threads: torch threads
    :param max_pending_segments: see :class:`ActorSettings`
    :param seed: seed of actor 0, env 0; env ``j`` of actor ``i`` (incarnation ``k``) gets
        ``seed + n_envs * (i + n_actors * k) + j`` (for ``k = 0``: the seeds of ``make_vec_env(seed=seed, n_envs=total)``)
    :param n_actors: number of actors (for the seeds)
    """

    env_fn: bytes
    env_kwargs: dict[str, Any]
    n_envs: int
    n_steps: int
    policy_class: type
    policy_kwargs: dict[str, Any]
    use_sde: bool
    sde_sample_freq: int
    vec_wrappers: list[tuple[str, dict[str, Any]]]
    delay: tuple[float, float]
    num_threads: int
    max_pending_segments: int
    seed: int | None
    n_actors: int

    def actor_seed(self, actor_id: int, incarnation: int) -> int | None:
        if self.seed is None:
            return None
        return self.seed + self.n_envs * (actor_id + self.n_actors * incarnation)


@dataclasses.dataclass
class Segment:
    """
    ``n_steps`` consecutive steps of one actor's ``n_envs`` envs, all acted by one policy version.
    Arrays are time-major ``[n_steps, n_envs, ...]``, numpy only (no tensors cross process boundaries).

    :param actor_id: the actor that collected it
    :param version: the policy version that acted (``behavior_version`` of every sample)
    :param observations: observations the policy acted on (normalized when the learner uses VecNormalize)
    :param actions: actions as sampled by the policy (not clipped)
    :param rewards: env rewards (normalized with VecNormalize), without any bootstrap
    :param episode_starts: SB3's ``episode_starts``: whether each step starts an episode
    :param dones: whether each step ended an episode
    :param values: behavior critic ``V_μ(s_t)``
    :param log_probs: behavior log-probs ``log μ(a_t|s_t)``
    :param last_observations: observation after the last step
    :param last_values: behavior critic at ``last_observations``
    :param truncations: ``(step, env, terminal observation, V_μ(terminal observation))`` of time-limit truncations
    :param done_infos: ``(step, env, info)`` of every step that ended an episode (Monitor's ``"episode"``,
        ``"is_success"``, ``"TimeLimit.truncated"``...; without the terminal observation)
    :param obs_moments: VecNormalize: ``{key: (mean, var, count)}`` of the raw observations (key ``""`` for non-dict)
    :param return_moments: VecNormalize: ``(mean, var, count)`` of the raw discounted returns
    :param collect_seconds: wall time spent stepping the envs for this segment
    :param idle_seconds: wall time the actor waited for the learner to take its earlier segments before starting this
        one (backpressure: ``max_pending_segments``)
    """

    actor_id: int
    version: int
    observations: Observation
    actions: np.ndarray
    rewards: np.ndarray
    episode_starts: np.ndarray
    dones: np.ndarray
    values: np.ndarray
    log_probs: np.ndarray
    last_observations: Observation
    last_values: np.ndarray
    truncations: list[tuple[int, int, Observation, float]]
    done_infos: list[tuple[int, int, dict[str, Any]]]
    obs_moments: dict[str, tuple[np.ndarray, np.ndarray, int]] | None = None
    return_moments: tuple[np.ndarray, np.ndarray, int] | None = None
    collect_seconds: float = 0.0
    idle_seconds: float = 0.0

    @property
    def n_transitions(self) -> int:
        return int(self.rewards.size)


@dataclasses.dataclass
class ActorFailure:
    """Sent instead of a segment when the actor's code raised: the learner re-raises it (a bug is not retried)."""

    actor_id: int
    traceback: str


@dataclasses.dataclass
class ActorExit:
    """What a backend receives from an actor that died (its channel closed, its Ray actor is gone)."""

    reason: str


class ActorStartupError(RuntimeError):
    """An actor died before it delivered its first segment: actors that cannot start are not restarted."""


@dataclasses.dataclass
class ActorSlot:
    """
    One running incarnation of an actor, as the backend-independent loop of :class:`ActorBackend` sees it.
    Backends subclass it with their handles and channels.

    :param actor_id: index of the actor
    :param incarnation: how many times this actor was replaced before
    :param started_at: ``time.time()`` when it was spawned
    """

    actor_id: int
    incarnation: int
    started_at: float


_POLL_SECONDS = 0.05
_HEALTH_CHECK_SECONDS = 0.5


class ActorBackend(ABC):
    """
    Runs ``n_actors`` actors and hands their segments to the learner. Implementations: ``process`` and ``ray``.

    Contract: :meth:`start` launches the actors with the first published parameters; :meth:`publish` makes a new
    version available, each actor picks the newest one at the start of its next segment; :meth:`next_segment`
    returns the next finished segment of any actor (oldest first), replacing actors that died or hung meanwhile;
    :meth:`close` stops everything it started, idempotently.

    The receive / health-check / replace / restart loop is this class's (:meth:`next_segment`); a backend implements
    the primitives: :meth:`_spawn`, :meth:`_kill`, :meth:`_receive`, :meth:`_exit_reason` (is it alive),
    :meth:`_last_sign_of_life`, :meth:`_has_waiting_output` and :meth:`_pid`. An actor that dies before any of its
    incarnations delivered a segment is not replaced: :class:`ActorStartupError` (with :meth:`_startup_hint`).
    """

    def __init__(self, spec: ActorSpec, settings: ActorSettings) -> None:
        self.spec = spec
        self.settings = settings
        self.restarts = 0
        self.events: list[str] = []
        self._slots: dict[int, Any] = {}  # actor_id -> the backend's ActorSlot
        self._delivered: set[int] = set()  # actors that delivered at least one segment
        self._next_health_check = 0.0

    @abstractmethod
    def start(self, version: int, payload: Payload) -> None:
        """Launch the actors, acting with ``payload`` (version ``version``) from their first step."""

    @abstractmethod
    def publish(self, version: int, payload: Payload) -> None:
        """Make new parameters (and normalization statistics) available to the actors."""

    @abstractmethod
    def close(self) -> None:
        """Stop all actors (and what the backend started for them)."""

    # ----- primitives ---------------------------------------------------------------------------------------------

    @abstractmethod
    def _spawn(self, actor_id: int, incarnation: int) -> Any:
        """Start an incarnation of actor ``actor_id`` and return its slot (an :class:`ActorSlot`)."""

    @abstractmethod
    def _kill(self, slot: Any) -> None:
        """Stop the actor of ``slot`` for good and release its channels (it may be dead already)."""

    @abstractmethod
    def _receive(self, timeout: float) -> tuple[Any, Segment | ActorFailure | ActorExit] | None:
        """
        Wait up to ``timeout`` seconds for any actor's next message, the oldest finished segment first:
        ``(slot, segment)``, ``(slot, ActorFailure)`` if its code raised, ``(slot, ActorExit)`` if it died; None if none.
        """

    @abstractmethod
    def _exit_reason(self, slot: Any) -> str | None:
        """Why the actor is dead (``"exited (exit code 1)"``), or None while it is alive (as far as can be told)."""

    @abstractmethod
    def _last_sign_of_life(self, slot: Any) -> float | None:
        """``time.time()`` of the actor's last sign of life; None until it has started."""

    @abstractmethod
    def _has_waiting_output(self, slot: Any) -> bool:
        """Whether a message of the actor is waiting to be received (an actor with output waiting is not hung)."""

    @abstractmethod
    def _pid(self, slot: Any) -> int | None:
        """Process id of the actor, if known."""

    def _maintain(self) -> None:  # noqa: B027  (an optional hook, not an abstract primitive)
        """Backend upkeep at every health check (the process backend retries weights it could not write)."""

    def _startup_hint(self) -> str:
        """The likely cause of actors dying before their first segment, for :class:`ActorStartupError`."""
        return ""

    # ----- the loop -----------------------------------------------------------------------------------------------

    def pids(self) -> dict[int, int]:
        """``{actor_id: process id}`` of the running actors."""
        return {actor_id: pid for actor_id, slot in self._slots.items() if (pid := self._pid(slot)) is not None}

    def next_segment(self) -> Segment:
        """Block until any actor has a segment ready and return it (the one waiting longest first)."""
        while True:
            if time.monotonic() >= self._next_health_check:
                self._check_health()
            received = self._receive(_POLL_SECONDS)
            if received is None:
                continue
            slot, message = received
            if isinstance(message, ActorExit):
                self._replace(slot, message.reason, died=True)
            elif isinstance(message, ActorFailure):
                raise RuntimeError(f"Actor {message.actor_id} failed:\n{message.traceback}")
            else:
                self._delivered.add(slot.actor_id)
                return message

    def _check_health(self) -> None:
        """Replace actors that died, never started or stopped giving signs of life."""
        self._next_health_check = time.monotonic() + _HEALTH_CHECK_SECONDS
        self._maintain()
        now = time.time()
        for slot in list(self._slots.values()):
            if self._has_waiting_output(slot):
                continue  # a segment (or the news of a death) is waiting: the next `_receive()` takes it
            reason = self._exit_reason(slot)
            if reason is not None:
                self._replace(slot, reason, died=True)
                continue
            last_sign_of_life = self._last_sign_of_life(slot)
            if last_sign_of_life is None and now - slot.started_at > self.settings.startup_timeout:
                self._replace(slot, f"did not start within {self.settings.startup_timeout:g} s (startup_timeout)")
            elif last_sign_of_life is not None and now - last_sign_of_life > self.settings.actor_timeout:
                self._replace(slot, f"hung (no sign of life for {now - last_sign_of_life:.1f} s > actor_timeout)")

    def _replace(self, slot: Any, reason: str, died: bool = False) -> None:
        """Kill the actor of ``slot`` and start its next incarnation (or fail fast, or fail after ``max_restarts``)."""
        description = f"Actor {slot.actor_id} (pid {self._pid(slot)}) {reason}"
        self._slots.pop(slot.actor_id)
        self._kill(slot)
        if died and slot.actor_id not in self._delivered:
            hint = self._startup_hint()
            raise ActorStartupError(
                f"{description} before delivering its first segment; an actor that cannot start is not restarted."
                + (f" {hint}" if hint else "")
            )
        message = f"{description}; starting a replacement"
        warnings.warn(message, RuntimeWarning, stacklevel=3)
        self.restarts += 1
        self.events.append(message)
        if self.restarts > self.settings.max_restarts:
            raise RuntimeError(
                f"{message}; {self.restarts} actor replacements exceed max_restarts={self.settings.max_restarts}"
            )
        self._slots[slot.actor_id] = self._spawn(slot.actor_id, slot.incarnation + 1)
