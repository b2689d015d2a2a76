"""
Actors as local processes (``multiprocessing``, ``forkserver`` or ``spawn``; never ``fork``).

Every actor owns its own channels, so that an actor killed at any instant can only break what is its own:

* a one-way ``Pipe`` actor → learner for its segments (numpy arrays, pickled): a killed actor's pipe reads as EOF;
* a weights slot in shared memory the learner owns (``RawArray`` of float64 + version + lock), written by the learner
  on :meth:`publish` and copied by the actor at the start of each segment when its version changed;
* shared counters the learner reads without locks: a heartbeat (time of the actor's last step), the time its
  pending segment was finished (to take the oldest first) and the number of its segments the learner consumed
  (backpressure: an actor idles while it has ``max_pending_segments`` segments not yet consumed).

A shared ``multiprocessing.Queue`` would be simpler, but an actor killed while writing to it corrupts it for all
(Python's documentation warns about exactly that). The health / replace loop is
:class:`~sb3_vaco.common.actors.base.ActorBackend`'s; this module implements its primitives.
"""

import atexit
import dataclasses
import multiprocessing as mp
import signal
import time
import traceback
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

import cloudpickle
import numpy as np

from sb3_vaco.common.actors.base import (
    ActorBackend,
    ActorExit,
    ActorFailure,
    ActorSettings,
    ActorSlot,
    ActorSpec,
    Payload,
    Segment,
)
from sb3_vaco.common.actors.worker import (
    ActorWorker,
    PayloadLayout,
    flatten_payload,
    payload_layout,
    payload_size,
    unflatten_payload,
)

_LOCK_TIMEOUT = 0.2
_JOIN_SECONDS = 3.0


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
    consumed: Any,
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

    worker = None
    try:
        spec: ActorSpec = cloudpickle.loads(spec_bytes)
        worker = ActorWorker(spec, actor_id, incarnation)
        flat = np.frombuffer(weights, dtype=np.float64)
        sent = 0
        while running():
            if sent - consumed.value >= spec.max_pending_segments:
                time.sleep(0.002)  # backpressure: the learner has not taken our last segment(s) yet
                continue
            if weights_version.value != worker.version:
                with lock:
                    version = int(weights_version.value)
                    payload = unflatten_payload(flat.copy(), layout)
                worker.set_weights(version, payload)
            segment = worker.collect(on_step=beat)
            worker.sleep_delay(running)
            if not running():
                break
            ready_since.value = time.time()
            conn.send(segment)
            sent += 1
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
    consumed: Any  # segments of this actor taken by the learner


class ProcessActorBackend(ActorBackend):
    """
    :class:`~sb3_vaco.common.actors.base.ActorBackend` with one daemon process per actor on this machine.

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
            # torch imports torch._dynamo lazily, at the first manual_seed() / optimizer: seconds, so preload it too.
            self._ctx.set_forkserver_preload(["__main__", __name__, "torch._dynamo"])
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
            consumed=ctx.RawValue("q", 0),
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
            slot.consumed.value += 1
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
