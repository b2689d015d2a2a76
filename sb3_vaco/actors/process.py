"""
Actors as local processes (``multiprocessing``, ``forkserver`` or ``spawn``; never ``fork``).

Every actor owns its own channels, so that an actor killed at any instant can only break what is its own:

* a one-way ``Pipe`` actor → learner for its segments (numpy arrays, pickled): a killed actor's pipe reads as EOF;
* a weights slot in shared memory the learner owns (``RawArray`` of float64 + version + lock), written by the learner
  on :meth:`publish` and copied by the actor at the start of each segment when its version changed;
* shared counters the learner reads without locks: a heartbeat (time of the actor's last step) and the time its
  pending segment was finished (to take the oldest first);
* a semaphore counting the segments the actor may still finish before the learner takes one (backpressure: it starts
  at ``max_pending_segments``, the actor takes one before each segment, the learner gives one back for every segment
  it receives). An actor with none left blocks on it (waking every ``_IDLE_BEAT_SECONDS`` to beat and to check for a
  stop), and resumes as soon as the learner takes a segment.

A shared ``multiprocessing.Queue`` would be simpler, but an actor killed while writing to it corrupts it for all
(Python's documentation warns about exactly that). The health / replace loop is
:class:`~sb3_vaco.actors.base.ActorBackend`'s; this module implements its primitives.
"""

import atexit
import dataclasses
import multiprocessing as mp
import signal
import sys
import time
import traceback
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np

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
from sb3_vaco.actors.worker import (
    ActorWorker,
    PayloadLayout,
    flatten_payload,
    payload_layout,
    payload_size,
    unflatten_payload,
)

_LOCK_TIMEOUT = 0.2
_JOIN_SECONDS = 3.0
_IDLE_BEAT_SECONDS = 0.05  # an actor waiting for the learner beats and checks for a stop this often


def _actor_main(
    spec_bytes: bytes,
    actor_id: int,
    incarnation: int,
    layout: PayloadLayout,
    conn: Connection,
    weights: Any,
    weights_version: Any,
    lock: Any,
    heartbeat: Any,
    ready_since: Any,
    free_slots: Any,
    stop: Any,
) -> None:
    """The actor process: collect segments with the newest published weights until told to stop or orphaned."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the learner's: it stops the actors
    heartbeat.value = time.time()
    parent = mp.parent_process()

    def beat() -> None:
        heartbeat.value = time.time()

    def running() -> bool:
        beat()
        return not stop.value and (parent is None or parent.is_alive())

    def wait_for_free_slot() -> float | None:
        """Backpressure: block until fewer than ``max_pending_segments`` of our segments wait for the learner.
        Returns the seconds waited, or None if told to stop (or orphaned) meanwhile."""
        start = time.perf_counter()
        while not free_slots.acquire(timeout=_IDLE_BEAT_SECONDS):
            if not running():
                return None
        return time.perf_counter() - start

    worker = None
    try:
        spec: ActorSpec = cloudpickle.loads(spec_bytes)
        worker = ActorWorker(spec, actor_id, incarnation)
        flat = np.frombuffer(weights, dtype=np.float64)
        while running():
            idle_seconds = wait_for_free_slot()
            if idle_seconds is None or not running():
                break
            if weights_version.value != worker.version:
                with lock:
                    version = int(weights_version.value)
                    payload = unflatten_payload(flat.copy(), layout)
                worker.set_weights(version, payload)
            segment = worker.collect(on_step=beat)
            segment.idle_seconds = idle_seconds
            worker.sleep_delay(running)
            if not running():
                break
            ready_since.value = time.time()
            conn.send(segment)
    except (BrokenPipeError, EOFError, ConnectionResetError):
        pass  # the learner closed our pipe: it is shutting down
    except Exception:
        try:
            conn.send(ActorFailure(actor_id, traceback.format_exc()))
        except Exception:
            pass
    finally:
        if worker is not None:
            worker.close()
        conn.close()


def _env_modules(spec: ActorSpec) -> list[str]:
    """
    The module of the actors' env's entry point, for the fork server to import once: when the env is a registered id
    (or a factory with an ``env_id``, such as :class:`~sb3_vaco.common.wrappers.WrappedEnvFactory`) and this process
    imported that module already (the fork server survives only an ImportError while preloading).
    """
    try:
        env_fn = cloudpickle.loads(spec.env_fn)
        env_id = env_fn if isinstance(env_fn, str) else getattr(env_fn, "env_id", None)
        entry_point = gym.spec(env_id).entry_point if isinstance(env_id, str) else None
    except Exception:  # not registered (the actor reports it), or not loadable here: nothing to preload
        return []
    module = entry_point.split(":")[0] if isinstance(entry_point, str) else None
    return [module] if module in sys.modules else []


@dataclasses.dataclass
class _Slot(ActorSlot):
    """One running actor and the channels it owns."""

    process: BaseProcess
    conn: Connection
    weights: Any
    weights_version: Any
    lock: Any
    heartbeat: Any  # time.time() of the actor's last sign of life; 0 until it started
    ready_since: Any  # when its pending segment was finished
    free_slots: Any  # semaphore: segments the actor may still finish before the learner takes one (backpressure)


class ProcessActorBackend(ActorBackend):
    """
    :class:`~sb3_vaco.actors.base.ActorBackend` with one daemon process per actor on this machine.

    :param spec: what each actor builds
    :param settings: validated actor settings
    """

    def __init__(self, spec: ActorSpec, settings: ActorSettings) -> None:
        super().__init__(spec, settings)
        start_method = settings.start_method
        if start_method is None:
            start_method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
        self._ctx = mp.get_context(start_method)
        if start_method == "forkserver":
            # The fork server (one per learner process, started on first use) imports torch and SB3 once; every actor,
            # replacements included, then starts as a fork of it instead of importing them again. No effect if a
            # fork server already runs (e.g. started by a SubprocVecEnv).
            # torch imports torch._dynamo lazily, at the first manual_seed() / optimizer: seconds, so preload it too;
            # and the module of a registered env's entry point (MuJoCo's envs: a fifth of a second per actor).
            self._ctx.set_forkserver_preload(["__main__", __name__, "torch._dynamo", *_env_modules(spec)])
        self._start_method = start_method
        self._spec_bytes = cloudpickle.dumps(spec)
        self._slots: dict[int, _Slot] = {}
        self._layout: PayloadLayout = []
        self._flat = np.zeros(0)
        self._version = -1
        self._stop: Any = None
        self._closed = False

    def start(self, version: int, payload: Payload) -> None:
        self._layout = payload_layout(payload)
        self._flat = np.zeros(payload_size(self._layout))
        flatten_payload(payload, self._layout, self._flat)
        self._version = version
        self._stop = self._ctx.RawValue("b", 0)
        atexit.register(self.close)
        for actor_id in range(self.settings.n_actors):
            self._slots[actor_id] = self._spawn(actor_id, incarnation=0)

    def _spawn(self, actor_id: int, incarnation: int) -> _Slot:
        ctx = self._ctx
        weights = ctx.RawArray("d", len(self._flat))
        np.frombuffer(weights, dtype=np.float64)[:] = self._flat
        receiver, sender = ctx.Pipe(duplex=False)
        shared = dict(
            weights=weights,
            weights_version=ctx.RawValue("q", self._version),
            lock=ctx.Lock(),
            heartbeat=ctx.RawValue("d", 0.0),
            ready_since=ctx.RawValue("d", 0.0),
            free_slots=ctx.Semaphore(self.spec.max_pending_segments),
        )
        process = ctx.Process(  # type: ignore[attr-defined]
            target=_actor_main,
            args=(self._spec_bytes, actor_id, incarnation, self._layout, sender, *shared.values(), self._stop),
            name=f"sb3_vaco-actor-{actor_id}",
            daemon=True,  # never outlive the learner, whatever happens to it
        )
        process.start()
        sender.close()  # only the actor may hold the write end: its death then reads as EOF here
        return _Slot(actor_id, incarnation, time.time(), process, receiver, **shared)

    def publish(self, version: int, payload: Payload) -> None:
        flatten_payload(payload, self._layout, self._flat)
        self._version = version
        for slot in self._slots.values():
            self._write_weights(slot)

    def _write_weights(self, slot: _Slot) -> None:
        if slot.weights_version.value == self._version:
            return
        # The actor holds the lock only while copying. If it cannot be had (an actor stopped or killed while copying),
        # the weights are written at a later poll, or the actor is replaced.
        if not slot.lock.acquire(timeout=_LOCK_TIMEOUT):
            return
        try:
            np.frombuffer(slot.weights, dtype=np.float64)[:] = self._flat
            slot.weights_version.value = self._version
        finally:
            slot.lock.release()

    # ----- primitives of ActorBackend's health / replace loop ------------------------------------------------------

    def _receive(self, timeout: float) -> tuple[_Slot, Segment | ActorFailure | ActorExit] | None:
        by_conn = {slot.conn: slot for slot in self._slots.values()}
        ready = wait(list(by_conn), timeout=timeout)
        if not ready:
            return None
        slot = min((by_conn[conn] for conn in ready), key=lambda s: s.ready_since.value)  # type: ignore[index]
        try:
            message = slot.conn.recv()
        except (EOFError, OSError):
            slot.process.join(timeout=1.0)
            return slot, ActorExit(f"exited (exit code {slot.process.exitcode})")
        if isinstance(message, Segment):
            slot.free_slots.release()  # the actor may start its next segment
        return slot, message

    def _exit_reason(self, slot: _Slot) -> str | None:
        exitcode = slot.process.exitcode
        return None if exitcode is None else f"exited (exit code {exitcode})"

    def _last_sign_of_life(self, slot: _Slot) -> float | None:
        heartbeat = slot.heartbeat.value
        return None if heartbeat == 0.0 else heartbeat

    def _has_waiting_output(self, slot: _Slot) -> bool:
        return slot.conn.poll()  # a segment, or the EOF of an exit

    def _pid(self, slot: _Slot) -> int | None:
        return slot.process.pid

    def _kill(self, slot: _Slot) -> None:
        self._stop_process(slot, kill=True)

    def _maintain(self) -> None:
        for slot in self._slots.values():
            self._write_weights(slot)  # retry the weights a lock timeout kept from being written

    def _startup_hint(self) -> str:
        return (
            f"With the {self._start_method!r} start method every actor process imports the script that started "
            'training as __main__: start training under `if __name__ == "__main__":` (as with SubprocVecEnv), the '
            "likely cause; otherwise the actor's own output (stderr) says why it exited."
        )

    @staticmethod
    def _stop_process(slot: _Slot, kill: bool, timeout: float = 0.0) -> None:
        slot.conn.close()
        process = slot.process
        process.join(timeout=timeout)
        if process.is_alive():
            if kill:
                process.kill()
            else:
                process.terminate()
            process.join(timeout=_JOIN_SECONDS)
        if process.is_alive():
            process.kill()
            process.join(timeout=_JOIN_SECONDS)
        process.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        if self._stop is not None:
            self._stop.value = 1
        for slot in self._slots.values():
            slot.conn.close()  # unblocks an actor waiting to send
        deadline = time.monotonic() + _JOIN_SECONDS
        for slot in self._slots.values():
            slot.process.join(timeout=max(0.0, deadline - time.monotonic()))
        for slot in self._slots.values():
            self._stop_process(slot, kill=False)
        self._slots.clear()
