"""
A Ray cluster of several nodes on this machine, listening on 127.0.0.1 only: to try (and test) Ray actors on more
than one node, and the loss of a node, without a second machine. Each node is one ``ray start --block`` in a
process group of its own, so that one node can be stopped (or killed, like a crashed machine) without touching the
others or any other Ray on the machine (``ray stop`` stops every Ray process of the machine)::

    python scripts/ray_cluster.py start --temp-dir /tmp/vaco-ray --head-cpus 2 --workers 1 --worker-cpus 1

prints the address to join and each node's process group, and stops the nodes it started on Ctrl-C / SIGTERM.
``python scripts/ray_cluster.py ray-start ARGS...`` is ``ray start ARGS...`` that keeps ``127.0.0.1`` (below).
``tests/test_ray_cluster.py`` uses :class:`LocalRayCluster` from this module; ``docs/actors.md`` ("Ray clusters")
has the commands.

Loopback only (Ray 2.60): ``ray start`` replaces ``127.0.0.1`` in ``--node-ip-address`` and ``--address`` by the
machine's outbound address, and then Ray's servers listen on every interface, unless the environment variable
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` is set; but with it set ``ray start`` refuses to start a non-head node. So
the head is started by the plain ``ray start`` with that variable, and the other nodes by ``ray-start`` here: Ray's
own ``ray start`` entry point with that one replacement (``ray._private.services.resolve_ip_for_localhost``) turned
off. A learner joining such a cluster needs the variable too (``ray.init`` makes the same replacement).
"""

import argparse
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

LOOPBACK = "127.0.0.1"
# The environment of every node: no auth token written under the home folder, no usage statistics.
NODE_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
RAY_CLI = [sys.executable, "-m", "ray.scripts.scripts"]
_STARTED = "Ray runtime started."


def ray_start_keeping_loopback(args: list[str]) -> None:
    """``ray start ARGS...`` in this process, keeping ``127.0.0.1`` as given (see the module docstring); exits."""
    import ray._private.services as services
    from ray.scripts.scripts import main as ray_main

    services.resolve_ip_for_localhost = lambda host: host
    sys.argv = ["ray", "start", *args]
    ray_main()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@dataclasses.dataclass
class RayNode:
    """
    One node: a ``ray start --block`` process, leader of its own process group, and the Ray processes it started.

    :param name: ``"head"``, ``"worker1"``, ...
    :param process: the ``ray start --block`` process
    :param log_path: its output
    :param temp_dir: the node's ``--temp-dir``
    :param resources: its custom resources (``--resources``)
    """

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    temp_dir: Path
    resources: dict[str, float]
    _node_id: str | None = None

    @property
    def pgid(self) -> int:
        """Process group of the node (the ``ray start`` process's pid)."""
        return self.process.pid

    def processes(self) -> list[psutil.Process]:
        """The node's live processes: the ``ray start`` process, its descendants and its process group."""
        found: dict[int, psutil.Process] = {}
        try:
            root = psutil.Process(self.process.pid)
            found = {p.pid: p for p in [root, *root.children(recursive=True)]}
        except psutil.Error:
            pass
        for process in psutil.process_iter():
            try:
                if process.pid not in found and os.getpgid(process.pid) == self.pgid:
                    found[process.pid] = process
            except (OSError, psutil.Error):
                continue
        return [p for p in found.values() if _alive(p)]

    def pids(self) -> set[int]:
        """Pids of :meth:`processes`."""
        return {p.pid for p in self.processes()}

    @property
    def node_id(self) -> str | None:
        """Ray's id of the node (hex), read from its raylet's command line; None before the raylet started."""
        if self._node_id is None:
            for process in self.processes():
                try:
                    if process.name() != "raylet":
                        continue
                    for arg in process.cmdline():
                        if arg.startswith("--node_id="):
                            self._node_id = arg.split("=", 1)[1]
                except psutil.Error:
                    continue
        return self._node_id

    def running(self) -> bool:
        """Whether the ``ray start --block`` process still runs."""
        return self.process.poll() is None

    def log_tail(self, n_chars: int = 3000) -> str:
        """The end of the node's ``ray start`` output."""
        try:
            return self.log_path.read_text(errors="replace")[-n_chars:]
        except OSError:
            return ""

    def stop(self, kill: bool = False, timeout: float = 15.0) -> None:
        """
        Stop the node: SIGTERM to ``ray start`` (it stops the node's processes) then SIGKILL what is left after
        ``timeout`` seconds; ``kill=True``: SIGKILL every process of the node at once, as if the machine had died.
        """
        processes = self.processes()
        if not kill and self.running():
            self.process.terminate()
            _, processes = psutil.wait_procs(processes, timeout=timeout)
        for process in processes:
            try:
                process.kill()
            except psutil.Error:
                pass
        try:
            os.killpg(self.pgid, signal.SIGKILL)  # anything of the group started meanwhile
        except OSError:
            pass
        psutil.wait_procs(processes, timeout=timeout)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass


class LocalRayCluster:
    """
    Ray nodes on this machine, on 127.0.0.1 only; a context manager that stops them all (only them) at exit.

    :param temp_dir: folder of the nodes' ``--temp-dir`` (``<temp_dir>/head``, ``<temp_dir>/worker1``, ...); keep it
        short: Ray's socket paths under it must stay below 108 characters
    :param startup_timeout: seconds a node may take to start
    :param object_store_memory: bytes of each node's object store
    """

    def __init__(self, temp_dir: str | Path, startup_timeout: float = 120.0, object_store_memory: int = 128 << 20) -> None:
        self.temp_dir = Path(temp_dir)
        self.startup_timeout = startup_timeout
        self.object_store_memory = object_store_memory
        self.head: RayNode | None = None
        self.workers: list[RayNode] = []
        self.port: int | None = None

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>`` of the head's GCS: what ``ray.init(address=...)`` and ``ray start --address`` take."""
        if self.port is None:
            raise RuntimeError("the head node is not started")
        return f"{LOOPBACK}:{self.port}"

    @property
    def nodes(self) -> list[RayNode]:
        return ([self.head] if self.head is not None else []) + self.workers

    def node_of(self, pid: int) -> RayNode | None:
        """The node whose processes include ``pid`` (None if none of them does)."""
        return next((node for node in self.nodes if pid in node.pids()), None)

    def _common_args(self, num_cpus: int, resources: dict[str, float], temp_dir: Path) -> list[str]:
        return [
            "--block",
            "--node-ip-address",
            LOOPBACK,
            "--num-cpus",
            str(num_cpus),
            "--resources",
            json.dumps(resources),
            "--temp-dir",
            str(temp_dir),
            "--disable-usage-stats",
            "--min-worker-port",
            "0",  # 0, 0: each worker picks a free port (the default range is shared by the nodes of this host)
            "--max-worker-port",
            "0",
            "--object-store-memory",
            str(self.object_store_memory),
        ]

    def start_head(
        self,
        num_cpus: int,
        resources: dict[str, float] | None = None,
        port: int | None = None,
        env: dict[str, str] | None = None,
    ) -> RayNode:
        """
        Start the head node (``ray start --head``), with ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` to stay on 127.0.0.1.

        :param num_cpus: logical CPUs of the node
        :param resources: custom resources (default ``{"head_node": num_cpus}``)
        :param port: GCS port (default: a free one)
        :param env: more environment variables (``RAY_health_check_period_ms``, ...)
        """
        if self.head is not None:
            raise RuntimeError("the head node is already started")
        self.port = port or free_port()
        resources = {"head_node": float(num_cpus)} if resources is None else resources
        command = [
            *RAY_CLI,
            "start",
            "--head",
            "--port",
            str(self.port),
            "--ray-client-server-port",
            str(free_port()),
            "--include-dashboard",
            "false",
            *self._common_args(num_cpus, resources, self.temp_dir / "head"),
        ]
        head_env = {**NODE_ENV, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", **(env or {})}
        self.head = self._start("head", command, resources, head_env)
        return self.head

    def add_node(self, num_cpus: int, resources: dict[str, float] | None = None, env: dict[str, str] | None = None) -> RayNode:
        """
        Start one more node joining the head (``ray start --address``, through :func:`ray_start_keeping_loopback`).

        :param num_cpus: logical CPUs of the node
        :param resources: custom resources (default ``{"worker_node": num_cpus}``)
        :param env: more environment variables
        """
        address = self.address
        name = f"worker{len(self.workers) + 1}"
        resources = {"worker_node": float(num_cpus)} if resources is None else resources
        command = [
            sys.executable,
            str(Path(__file__).resolve()),
            "ray-start",
            "--address",
            address,
            "--dashboard-agent-listen-port",
            str(free_port()),  # the default (52365) is the head's
            "--include-log-monitor",
            "false",  # one log monitor per host (the head's) is enough
            *self._common_args(num_cpus, resources, self.temp_dir / name),
        ]
        node_env = {**NODE_ENV, **(env or {})}
        node = self._start(name, command, resources, node_env, drop_env=("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_ADDRESS"))
        self.workers.append(node)
        return node

    def _start(
        self, name: str, command: list[str], resources: dict[str, float], env: dict[str, str], drop_env: tuple[str, ...] = ()
    ) -> RayNode:
        self.temp_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.temp_dir / f"{name}.log"
        full_env = {key: value for key, value in os.environ.items() if key not in drop_env}
        full_env.update(env)
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=full_env, start_new_session=True
            )
        node = RayNode(name, process, log_path, self.temp_dir / name, resources)
        deadline = time.monotonic() + self.startup_timeout
        while _STARTED not in node.log_tail(100_000):
            if not node.running() or time.monotonic() > deadline:
                tail = node.log_tail()
                node.stop(kill=True)
                reason = f"exited ({process.returncode})" if process.returncode is not None else "timed out"
                raise RuntimeError(f"Ray node {name} did not start ({reason}); `ray start` said:\n{tail}")
            time.sleep(0.2)
        return node

    def stop(self) -> None:
        """Stop every node started here, the head last (idempotent)."""
        for node in reversed(self.nodes):
            node.stop()

    def __enter__(self) -> "LocalRayCluster":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("start", help="start a head and worker nodes on 127.0.0.1; Ctrl-C stops them")
    start.add_argument("--temp-dir", default=None, help="root of the nodes' temp dirs (default: a new folder in /tmp)")
    start.add_argument("--port", type=int, default=None, help="GCS port of the head (default: a free one)")
    start.add_argument("--head-cpus", type=int, default=2)
    start.add_argument("--workers", type=int, default=1, help="nodes besides the head")
    start.add_argument("--worker-cpus", type=int, default=1)
    ray_start = commands.add_parser("ray-start", help="`ray start ARGS...`, keeping 127.0.0.1 (see above)")
    ray_start.add_argument("args", nargs=argparse.REMAINDER, help="arguments of `ray start`")
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["ray-start"]:  # not through argparse: the arguments are ray start's
        ray_start_keeping_loopback(argv[1:])
        return 0
    args = parser.parse_args(argv)

    temp_dir = args.temp_dir or tempfile.mkdtemp(prefix="vaco-ray-", dir="/tmp")
    stop = False

    def request_stop(signum: int, frame: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    with LocalRayCluster(temp_dir) as cluster:
        cluster.start_head(args.head_cpus, port=args.port)
        for _ in range(args.workers):
            cluster.add_node(args.worker_cpus)
        print(f"Ray cluster at {cluster.address} (temp dirs under {temp_dir}):")
        for node in cluster.nodes:
            print(f"  {node.name}: process group {node.pgid}, node id {node.node_id}, resources {node.resources}")
        head_temp_dir = cluster.temp_dir / "head"
        print(
            "Join it with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 and actor_backend_kwargs="
            f"{{'address': '{cluster.address}'}} (or 'auto' with ray_init_kwargs={{'_temp_dir': '{head_temp_dir}'}}).\n"
            "Crash a worker node with `kill -9 -<process group>`; Ctrl-C stops all nodes.",
            flush=True,
        )
        while not stop:
            time.sleep(0.5)
            for node in cluster.nodes:
                if not node.running():
                    print(f"{node.name} stopped (exit code {node.process.returncode})", flush=True)
                    cluster.workers = [worker for worker in cluster.workers if worker is not node]
                    if node is cluster.head:
                        stop = True
        print("stopping the nodes", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
