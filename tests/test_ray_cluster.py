"""
A real two-node Ray cluster on this machine (127.0.0.1 only, started with ``scripts/ray_cluster.py``): the learner
joins it with ``address="auto"``, its actors run on both nodes, and the worker node is killed mid-run.

Cheap enough for CI (CartPole, a 16-unit net, about 2,000 steps; about 40-60 s, most of it starting Ray and the
actors); skipped when Ray is not installed or a cluster cannot start here.
"""

import os
import shutil
import tempfile
import time
import warnings
from typing import Any

import psutil
import pytest
from conftest import TINY as SHARED_TINY
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import configure

from sb3_vaco import VACO

ray = pytest.importorskip("ray", reason="the Ray cluster test needs Ray (pip install 'ray>=2.40')")

import ray_cluster  # noqa: E402 - scripts/ is on the test path (pyproject.toml)

TOTAL_TIMESTEPS = 2048  # 32 batches of 2 segments of 32 steps x 1 env
TINY = {**SHARED_TINY, "batch_size": 32, "seed": 0}  # one minibatch per segment of 32 steps
# The GCS checks each raylet every second (default 3 s) and declares it dead after 5 failed checks.
HEAD_ENV = {"RAY_health_check_period_ms": "1000"}
# Results above 1,000 bytes (default 100 KiB) go through the object store of the actor's node, as real segments
# (Hopper, n_steps=2048) do: losing the node then loses the segment waiting there (ObjectLostError).
NODE_ENV = {"RAY_max_direct_call_object_size": "1000"}


@pytest.fixture
def cluster(monkeypatch):
    """A head node (2 CPUs, resource ``head_node``) and a worker node (1 CPU, ``worker_node``); stopped at the end."""
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    # The learner keeps 127.0.0.1 (ray.init would replace it by the machine's outbound address): the environment
    # variable for a Ray imported later, the constant it sets for the Ray imported above.
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    monkeypatch.setattr(ray._private.ray_constants, "ENABLE_RAY_CLUSTER", False)
    ray.shutdown()
    temp_dir = tempfile.mkdtemp(prefix="vaco-ray-", dir="/tmp")  # short: Ray's socket paths live under it
    local = ray_cluster.LocalRayCluster(temp_dir, startup_timeout=90.0)
    try:
        try:
            local.start_head(2, env={**HEAD_ENV, **NODE_ENV})
            local.add_node(1, env=NODE_ENV)
        except (RuntimeError, OSError) as error:
            pytest.skip(f"a local two-node Ray cluster cannot start here: {error}")
        yield local
    finally:
        ray.shutdown()
        local.stop()
        shutil.rmtree(temp_dir, ignore_errors=True)


def wait_for(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(0.2)


def alive_nodes() -> dict[str, dict[str, Any]]:
    return {node["NodeID"]: node for node in ray.nodes() if node["Alive"]}


def listeners_off_loopback(pids: set[int]) -> list[str]:
    """Listening sockets of these processes on an address other than 127.0.0.1."""
    found = []
    for pid in pids:
        try:
            connections = psutil.Process(pid).net_connections(kind="inet")
        except psutil.Error:
            continue
        for connection in connections:
            if connection.status == psutil.CONN_LISTEN and connection.laddr.ip not in ("127.0.0.1", "::ffff:127.0.0.1"):
                found.append(f"pid {pid}: {connection.laddr.ip}:{connection.laddr.port}")
    return found


class NodeLoss(BaseCallback):
    """
    At each batch: which actors delivered it; where the actors run (the node whose process tree holds each actor's
    pid, and Ray's node of that raylet). Once every actor of the worker node has delivered a segment and has its next
    one finished (waiting in the worker's object store), kills the whole worker node (SIGKILL, as a crashed machine)
    and waits until Ray declares it dead; then records where the replacements run.
    """

    def __init__(self, cluster: Any) -> None:
        super().__init__()
        self.cluster = cluster
        self.worker = cluster.workers[0]
        self.gcs_address: str | None = None
        self.learner_node: str | None = None
        self.delivered: set[int] = set()  # actor ids that delivered a segment before the loss
        self.placement: dict[int, str] = {}  # actor id -> node name, before the loss
        self.lost: list[int] = []  # actors of the worker node
        self.killed_pids: set[int] = set()
        self.segments_after: list[int] = []  # actor ids of the segments taken after the loss
        self.replaced: dict[int, str] = {}  # actor id -> node name of the actors running after the replacements
        self.exposed: list[str] = []  # listeners of the nodes and the learner off 127.0.0.1
        self.restarts: list[int] = []  # model._actors.restarts at each batch
        self.logged_restarts: list[float] = []  # rollout/actor_restarts at each batch

    def _on_rollout_end(self) -> None:
        actor_ids = [segment.actor_id for segment in self.locals["batch"].segments]
        self.restarts.append(self.model._actors.restarts)
        self.logged_restarts.append(self.model.logger.name_to_value["rollout/actor_restarts"])
        if self.gcs_address is None:
            self.gcs_address = ray.get_runtime_context().gcs_address
            self.learner_node = ray.get_runtime_context().get_node_id()
        if not self.lost:
            self.delivered.update(actor_ids)
            pids = self.model._actors.pids()  # waits until every actor has started
            self.placement = {actor_id: getattr(self.cluster.node_of(pid), "name", "?") for actor_id, pid in pids.items()}
            on_worker = [actor_id for actor_id, name in self.placement.items() if name == self.worker.name]
            if on_worker and set(on_worker) <= self.delivered:
                self._kill_worker_node(on_worker, pids)
        else:
            self.segments_after.extend(actor_ids)
            if not self.replaced and self.model._actors.restarts >= len(self.lost):
                pids = self.model._actors.pids()  # waits until the replacements have started
                self.replaced = {actor_id: getattr(self.cluster.node_of(pid), "name", "?") for actor_id, pid in pids.items()}

    def _kill_worker_node(self, on_worker: list[int], pids: dict[int, int]) -> None:
        # Let the worker's actors finish their next segment: it then waits in the worker node's object store.
        backend = self.model._actors.backend
        refs = [backend._slots[actor_id].in_flight[0] for actor_id in on_worker if backend._slots[actor_id].in_flight]
        ray.wait(refs, num_returns=len(refs), timeout=30, fetch_local=False)
        self.killed_pids = self.worker.pids()
        self.exposed = listeners_off_loopback(self.killed_pids | self.cluster.head.pids() | {os.getpid()})
        assert {pids[actor_id] for actor_id in on_worker} <= self.killed_pids
        worker_node_id = self.worker.node_id
        self.worker.stop(kill=True)
        self.lost = on_worker
        wait_for(lambda: worker_node_id not in alive_nodes(), 60, "Ray to declare the killed worker node dead")

    def _on_step(self) -> bool:
        return True


def test_actors_on_two_nodes_survive_the_loss_of_the_worker_node(cluster):
    head, worker = cluster.head, cluster.workers[0]
    assert head.node_id and worker.node_id and head.node_id != worker.node_id
    # Both nodes registered before the learner starts (so that the SPREAD placement sees both).
    ray.init(address=cluster.address, log_to_driver=False)
    wait_for(lambda: {head.node_id, worker.node_id} <= set(alive_nodes()), 60, "both nodes to join the cluster")
    resources = {node_id: node["Resources"] for node_id, node in alive_nodes().items()}
    assert resources[head.node_id].get("head_node") == 2 and resources[worker.node_id].get("worker_node") == 1
    ray.shutdown()

    settings = dict(
        address="auto",  # `auto` reads <temp dir>/ray_current_cluster: the head's temp dir, not the default /tmp/ray
        ray_init_kwargs={"_temp_dir": str(head.temp_dir), "log_to_driver": False},
        actor_options={"num_cpus": 1, "scheduling_strategy": "SPREAD"},  # one actor per node; 1 CPU on the worker
    )
    model = VACO("MlpPolicy", "CartPole-v1", n_actors=2, actor_backend="ray", actor_backend_kwargs=settings, **TINY)
    model.set_logger(configure(None, [""]))
    watch = NodeLoss(cluster)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.learn(TOTAL_TIMESTEPS, callback=watch)
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    replacements = [message for message in messages if "replacement" in message]

    # The learner joined this cluster (`auto`), through the head's raylet (the node that survives).
    assert watch.gcs_address == cluster.address and watch.learner_node == head.node_id
    assert not watch.exposed, f"listening off 127.0.0.1: {watch.exposed}"
    # Actors on both nodes, the worker node killed mid-run with its actor.
    assert sorted(watch.placement.values()) == ["head", "worker1"], watch.placement
    assert watch.lost and watch.killed_pids and not (watch.killed_pids & worker.pids()), "the worker node is gone"
    assert not worker.running() and head.running()
    # Its actor was replaced on the head, the replacement delivered, and training finished with every step.
    assert model.num_timesteps == TOTAL_TIMESTEPS
    assert watch.restarts[-1] >= len(watch.lost) and watch.restarts[0] == 0
    assert watch.logged_restarts == watch.restarts
    assert replacements and all(f"Actor {actor_id}" in " ".join(replacements) for actor_id in watch.lost), replacements
    assert watch.replaced and set(watch.replaced.values()) == {"head"}, watch.replaced
    assert set(watch.lost) <= set(watch.segments_after), "the replacements delivered segments"
    assert not model._actors.running
    print(f"placement {watch.placement}, replaced on {watch.replaced}; {replacements}")
