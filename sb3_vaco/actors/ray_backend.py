"""
Actors as Ray actors, on this machine or on a cluster (optional extra: ``pip install "ray>=2.40"``).

The learner (Ray driver) keeps ``max_pending_segments`` ``collect`` calls in flight per actor. Each call carries the
newest published parameters as an object reference (``ray.put`` once per version; ``None`` when the actor already
has them): the same rule as the process backend, the actor acts with the newest version at the start of a segment.
A call that fails because its actor died (``RayActorError``) or whose result was lost with the actor's node
(``ObjectLostError``), or that has not finished after ``actor_timeout`` seconds, gets its actor killed and replaced
(the loop is :class:`~sb3_vaco.actors.base.ActorBackend`'s; this module implements its primitives); an
exception raised by the actor's code is re-raised in the learner.
"""

import dataclasses
import os
import signal
import time
import traceback
from collections import deque
from typing import Any

import cloudpickle

from sb3_vaco.actors.base import (
    ActorBackend,
    ActorExit,
    ActorFailure,
    ActorSettings,
    ActorSlot,
    ActorSpec,
    Payload,
    Segment,
)
from sb3_vaco.actors.worker import ActorWorker


class _RayActor:
    """The Ray actor class (wrapped with ``ray.remote`` at start, so this module imports without Ray)."""

    def __init__(self, spec_bytes: bytes, actor_id: int, incarnation: int) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the learner's: it stops the actors
        self.worker: ActorWorker | None = None
        self.error: str | None = None
        self.finished_at: float | None = None  # when the previous collect() returned (for the idle time)
        try:
            self.worker = ActorWorker(cloudpickle.loads(spec_bytes), actor_id, incarnation)
        except Exception:
            # Reported by collect(): an actor that fails to build its envs is a bug to raise, not a death to retry.
            self.error = traceback.format_exc()

    def pid(self) -> int:
        return os.getpid()

    def collect(self, version: int, payload: Payload | None) -> Segment:
        # Idle: since the previous segment was returned (the learner submits the next call once it has taken it).
        idle_seconds = 0.0 if self.finished_at is None else time.perf_counter() - self.finished_at
        if self.worker is None:
            raise RuntimeError(f"the actor could not be built:\n{self.error}")
        if payload is not None:
            self.worker.set_weights(version, payload)
        segment = self.worker.collect()
        segment.idle_seconds = idle_seconds
        self.worker.sleep_delay()
        self.finished_at = time.perf_counter()
        return segment


@dataclasses.dataclass
class _RaySlot(ActorSlot):
    """One Ray actor and its calls in flight."""

    handle: Any
    pid_ref: Any
    pid: int | None = None
    version: int = -1  # newest version sent to it
    in_flight: deque[Any] = dataclasses.field(default_factory=deque)  # collect() calls, oldest first (run in order)
    busy_since: float = dataclasses.field(default_factory=time.time)  # when its oldest unfinished call started (about)


class RayActorBackend(ActorBackend):
    """
    :class:`~sb3_vaco.actors.base.ActorBackend` with Ray actors.

    Starts Ray locally (``ray.init(num_cpus=..., include_dashboard=False)``) when it is not initialized and no
    ``address`` is given, and shuts it down on :meth:`close`; joins a cluster with ``address`` (and leaves it running).

    :param spec: what each actor builds
    :param settings: validated actor settings
    """

    def __init__(self, spec: ActorSpec, settings: ActorSettings) -> None:
        super().__init__(spec, settings)
        try:
            import ray
        except ImportError as error:
            raise ImportError('actor_backend="ray" needs Ray: pip install "ray>=2.40"') from error
        self._ray = ray
        self._spec_bytes = cloudpickle.dumps(spec)
        self._slots: dict[int, _RaySlot] = {}
        self._owns_ray = False
        self._remote_class: Any = None
        self._version = -1
        self._weights_ref: Any = None
        self._closed = False

    def start(self, version: int, payload: Payload) -> None:
        ray, settings = self._ray, self.settings
        if not ray.is_initialized():
            init_kwargs = dict(settings.ray_init_kwargs or {})
            if settings.address is not None:
                ray.init(address=settings.address, **init_kwargs)
            else:
                init_kwargs.setdefault("num_cpus", settings.num_cpus or settings.n_actors)
                init_kwargs.setdefault("include_dashboard", False)
                ray.init(**init_kwargs)
                self._owns_ray = True
        options = {"num_cpus": 1, **(settings.actor_options or {})}
        self._remote_class = ray.remote(_RayActor).options(max_restarts=0, **options)
        self.publish(version, payload)
        for actor_id in range(settings.n_actors):
            self._slots[actor_id] = self._spawn(actor_id, incarnation=0)

    def _spawn(self, actor_id: int, incarnation: int) -> _RaySlot:
        handle = self._remote_class.remote(self._spec_bytes, actor_id, incarnation)
        slot = _RaySlot(actor_id, incarnation, time.time(), handle, handle.pid.remote())
        for _ in range(self.settings.max_pending_segments):
            self._submit(slot)
        return slot

    def _submit(self, slot: _RaySlot) -> None:
        payload = self._weights_ref if slot.version != self._version else None
        if not slot.in_flight:
            slot.busy_since = time.time()
        slot.in_flight.append(slot.handle.collect.remote(self._version, payload))
        slot.version = self._version

    def publish(self, version: int, payload: Payload) -> None:
        self._version = version
        self._weights_ref = self._ray.put(payload)

    # ----- primitives of ActorBackend's health / replace loop ------------------------------------------------------

    def _receive(self, timeout: float) -> tuple[_RaySlot, Segment | ActorFailure | ActorExit] | None:
        ray = self._ray
        owners = {slot.in_flight[0]: slot for slot in self._slots.values() if slot.in_flight}
        if not owners:  # every actor was just replaced and has nothing in flight yet: cannot happen, be safe
            for slot in self._slots.values():
                self._submit(slot)
            return None
        ready, _ = ray.wait(list(owners), num_returns=1, timeout=timeout)
        if not ready:
            return None
        slot = owners[ready[0]]
        slot.in_flight.popleft()
        slot.busy_since = time.time()
        try:
            segment = ray.get(ready[0])
        except ray.exceptions.RayActorError as error:
            return slot, ActorExit(f"died ({type(error).__name__})")
        except ray.exceptions.ObjectLostError as error:
            # A segment too large to return inline (Ray's max_direct_call_object_size, 100 KiB) waits in the object
            # store of its actor's node until the learner fetches it: a node that dies meanwhile takes it along (and
            # the actor with it). ObjectReconstructionFailedError, OwnerDiedError, ... are ObjectLostErrors.
            return slot, ActorExit(f"lost its segment with its node ({type(error).__name__})")
        except ray.exceptions.RayTaskError as error:
            return slot, ActorFailure(slot.actor_id, str(error))
        self._submit(slot)
        return slot, segment

    def _exit_reason(self, slot: _RaySlot) -> str | None:
        return None  # Ray reports a death as the failure of the actor's next call (see _receive)

    def _last_sign_of_life(self, slot: _RaySlot) -> float | None:
        """When the actor's oldest unfinished segment started; None until it has started (its pid is known)."""
        ray = self._ray
        if slot.pid is None and ray.wait([slot.pid_ref], timeout=0)[0]:
            try:
                slot.pid = ray.get(slot.pid_ref)
                slot.busy_since = max(slot.busy_since, time.time())  # started: its first segment begins about now
            except ray.exceptions.RayActorError:
                pass  # its collect() call reports the death
        if slot.pid is None:
            return None
        return slot.busy_since if slot.in_flight else time.time()

    def _has_waiting_output(self, slot: _RaySlot) -> bool:
        return bool(slot.in_flight) and bool(self._ray.wait([slot.in_flight[0]], timeout=0)[0])

    def _pid(self, slot: _RaySlot) -> int | None:
        return slot.pid

    def _kill(self, slot: _RaySlot) -> None:
        try:
            self._ray.kill(slot.handle, no_restart=True)
        except Exception:
            pass

    def _startup_hint(self) -> str:
        return (
            "Ray workers need the learner's Python environment (sb3_vaco, torch, SB3 and the env's package, same "
            "versions); the Ray worker logs say why it died."
        )

    def pids(self) -> dict[int, int]:
        pids = {}
        for actor_id, slot in self._slots.items():
            if slot.pid is None:
                slot.pid = self._ray.get(slot.pid_ref, timeout=self.settings.startup_timeout)
            pids[actor_id] = slot.pid
        return pids

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for slot in self._slots.values():
            self._kill(slot)
        self._slots.clear()
        if self._owns_ray and self._ray.is_initialized():
            self._ray.shutdown()
