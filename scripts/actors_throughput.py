"""
Asynchronous actors: throughput and measured lag (``throughput``, the default), and a learning comparison (``learn``).

``throughput``: env steps per second of training with ``N`` asynchronous actors (LaggedPPO, one env per actor; the
``process`` and ``ray`` backends) against SB3's synchronous PPO with a DummyVecEnv of ``N`` envs (``ppo``), with the
same hyperparameters, in two regimes:

* ``compute``: Hopper-v5 with RL Zoo's 256x256 networks, ``n_steps`` 512, batch 64, 5 epochs: stepping the env and
  the policy's forward passes cost CPU, and so does the learner's update;
* ``latency``: CartPole-v1 behind a fixed per-step latency (``time.sleep``: the package's
  :class:`~sb3_vaco.common.wrappers.LatencyWrapper`, also used by the benchmark grids), 1 and 5 ms by default,
  ``n_steps`` 128, batch 64, 5 epochs: the env makes its caller wait without using CPU (a remote simulator, a robot,
  a slow link).

Every configuration runs ``--rollouts`` rollouts (``rollouts * n_steps * N`` env steps) and reports

* ``steps_per_s``: env steps per second from the end of the first rollout to the end of the last one (start-up
  excluded; the span covers the updates between those rollouts);
* ``startup_s``: seconds from ``learn()`` to the end of the first rollout (actors started, first segments collected;
  the first ``process`` row also starts the fork server, which imports torch once for all later actors);
* ``lag_mean`` and ``lag_versions`` (actors): policy versions behind the learner per buffer column, over the rollouts
  after the first (``rollout/policy_lag_mean``; the distribution from the buffer's ``behavior_versions``);
* ``learner_idle`` (actors): fraction of that span the learner waited for segments (``rollout/actor_wait_time``);
* ``actor_idle`` (actors): fraction of their time the actors waited for the learner to take their segments
  (``rollout/actor_idle_time`` against ``rollout/actor_collect_time``; the backpressure of ``max_pending_segments``).

A high ``learner_idle`` means the actors limit throughput, a high ``actor_idle`` means the learner does. Results go to
``OUT/throughput.json`` and ``OUT/throughput.md`` (rewritten after every configuration, so an interrupted run keeps
what it measured) and the table is printed. Figures are only meaningful on an otherwise idle machine with at least
``max(N) + 1`` cores: the report records the CPU count and the load average before and after, and says so when the
machine was loaded::

    # the whole grid: 3 cases (compute, 1 ms, 5 ms) x N = 1, 2, 4, 8, 16 x PPO / process / Ray = 45 runs, ~10 minutes
    python scripts/actors_throughput.py throughput
    # seconds: tiny networks and budgets (what tests/test_actors.py runs)
    python scripts/actors_throughput.py throughput --quick --cases latency --latency-ms 1 --counts 1 2 \\
        --methods ppo process --out /tmp/actors

``learn``: VACO vs LaggedPPO with asynchronous actors, several seeds, evaluation curves. Writes
``OUT/learning_<env>.{json,md}``::

    python scripts/actors_throughput.py learn --env InvertedPendulum-v5 --n-actors 4 --seeds 0 1 2 --timesteps 200000
"""

import argparse
import dataclasses
import functools
import json
import math
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
# A Ray started locally by the actors listens on 127.0.0.1 only (Ray reads this when it is imported; docs/actors.md).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import gymnasium as gym
import numpy as np
import torch as th
from stable_baselines3 import PPO
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback, EvalCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize
from torch import nn

from sb3_vaco import VACO, LaggedPPO
from sb3_vaco.common.lagged import LaggedOnPolicyAlgorithm
from sb3_vaco.common.wrappers import LatencyWrapper, WrappedEnvFactory

OUT = Path("results/actors")
METHODS = ("ppo", "process", "ray")
METHOD_LABELS = {"ppo": "PPO, DummyVecEnv", "process": "process actors", "ray": "Ray actors"}
ALGOS: dict[str, type[LaggedOnPolicyAlgorithm]] = {"LaggedPPO": LaggedPPO, "VACO": VACO}

# RL Zoo's Hopper PPO network and n_steps; batch_size 64 and 5 epochs (zoo: 32, 5) keep the learner's share moderate.
HOPPER: dict[str, Any] = dict(
    n_steps=512,
    batch_size=64,
    n_epochs=5,
    policy_kwargs=dict(log_std_init=-2, ortho_init=False, activation_fn=nn.ReLU, net_arch=dict(pi=[256, 256], vf=[256, 256])),
)
# The latency-bound regime: SB3's default 64x64 networks, short rollouts so that the synchronous runs stay short.
LATENCY: dict[str, Any] = dict(n_steps=128, batch_size=64, n_epochs=5)
# --quick: tiny networks and rollouts, for a run of seconds (a check that everything runs, not a measurement).
QUICK: dict[str, Any] = dict(n_steps=32, batch_size=32, n_epochs=1, policy_kwargs=dict(net_arch=[16]))


@dataclasses.dataclass(frozen=True)
class Case:
    """
    One workload: an env, an optional fixed per-step latency, and the algorithm's hyperparameters.

    :param name: ``"compute"`` or ``"latency-<ms>ms"``
    :param env_id: registered env id
    :param latency_ms: milliseconds of latency added to every step (0: none)
    :param hyperparams: keyword arguments of PPO / the actors' algorithm (without the seed)
    """

    name: str
    env_id: str
    latency_ms: float
    hyperparams: dict[str, Any]

    def env_fn(self) -> str | Callable[[], gym.Env]:
        """What both PPO's DummyVecEnv and the actors build their envs from."""
        if self.latency_ms == 0:
            return self.env_id
        latency = functools.partial(LatencyWrapper, latency=self.latency_ms / 1000)
        return WrappedEnvFactory(self.env_id, latency, f"LatencyWrapper({self.latency_ms:g} ms)")


@dataclasses.dataclass
class RolloutRecord:
    """What :class:`Meter` keeps at the end of a rollout (the ``rollout/*`` values are the ones the actors log)."""

    time: float
    timesteps: int
    lags: np.ndarray | None = None  # versions behind the learner, per buffer column
    learner_wait: float = 0.0  # rollout/actor_wait_time
    actor_idle: float = 0.0  # rollout/actor_idle_time (mean per segment)
    actor_collect: float = 0.0  # rollout/actor_collect_time (mean per segment)


class Meter(BaseCallback):
    """Time, timesteps and (with actors) lag and waiting times at the end of every rollout."""

    def __init__(self) -> None:
        super().__init__()
        self.rollouts: list[RolloutRecord] = []

    def _on_rollout_end(self) -> None:
        record = RolloutRecord(time.perf_counter(), self.model.num_timesteps)
        pool = getattr(self.model, "_actors", None)
        if pool is not None:
            assert isinstance(self.model, LaggedOnPolicyAlgorithm)
            logged = self.model.logger.name_to_value
            record.lags = pool.version - self.model.rollout_buffer.behavior_versions[0]
            record.learner_wait = logged["rollout/actor_wait_time"]
            record.actor_idle = logged["rollout/actor_idle_time"]
            record.actor_collect = logged["rollout/actor_collect_time"]
        self.rollouts.append(record)

    def _on_step(self) -> bool:
        return True


def timed_learn(model: BaseAlgorithm, timesteps: int) -> dict[str, Any]:
    """``model.learn(timesteps)`` and the figures of one configuration (see the module docstring)."""
    meter = Meter()
    start = time.perf_counter()
    model.learn(timesteps, callback=meter)
    wall = time.perf_counter() - start
    first, last, measured = meter.rollouts[0], meter.rollouts[-1], meter.rollouts[1:]
    span = last.time - first.time
    result: dict[str, Any] = {
        "steps_per_s": (last.timesteps - first.timesteps) / span,
        "startup_s": first.time - start,
        "wall_s": wall,
        "timesteps": model.num_timesteps,
        "rollouts": len(meter.rollouts),
    }
    if first.lags is not None:
        lags = np.concatenate([r.lags for r in measured if r.lags is not None])
        values, counts = np.unique(lags, return_counts=True)
        busy = sum(r.actor_idle + r.actor_collect for r in measured)
        result.update(
            lag_mean=float(np.mean(lags)),
            lag_max=int(np.max(lags)),
            lag_versions={int(v): int(c) for v, c in zip(values, counts, strict=True)},
            learner_idle=sum(r.learner_wait for r in measured) / span,
            actor_idle=sum(r.actor_idle for r in measured) / busy if busy > 0 else 0.0,
            actor_collect_s=float(np.mean([r.actor_collect for r in measured])),
        )
    return result


def build_model(method: str, case: Case, n: int, algo: type[LaggedOnPolicyAlgorithm]) -> BaseAlgorithm:
    """PPO on a DummyVecEnv of ``n`` envs, or ``algo`` with ``n`` actors of one env each (``method``: the backend)."""
    hyperparams = dict(case.hyperparams, seed=0)
    if method == "ppo":
        return PPO("MlpPolicy", make_vec_env(case.env_fn(), n_envs=n, seed=0, vec_env_cls=DummyVecEnv), **hyperparams)
    settings: dict[str, Any] = dict(env_fn=case.env_fn())
    if method == "ray":
        settings["ray_init_kwargs"] = dict(log_to_driver=False)
    # The learner's env only provides the spaces (it is not stepped); the actors build theirs from env_fn.
    env = make_vec_env(case.env_fn(), n_envs=1, seed=0)
    return algo("MlpPolicy", env, n_actors=n, actor_backend=method, actor_backend_kwargs=settings, **hyperparams)


def forkserver_running() -> bool:
    """Whether this process's multiprocessing fork server is started (the first process-actor run starts it)."""
    from multiprocessing import forkserver

    return getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None) is not None


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, timeout=10).stdout.strip()
        return out.stdout.strip() + (" (uncommitted changes)" if dirty else "")
    except Exception:
        return None


def make_cases(args: argparse.Namespace) -> list[Case]:
    """The workloads the flags select, with ``--quick``'s tiny hyperparameters if set."""
    cases = []
    if "compute" in args.cases:
        cases.append(Case("compute", args.compute_env, 0.0, QUICK if args.quick else HOPPER))
    if "latency" in args.cases:
        for ms in args.latency_ms:
            cases.append(Case(f"latency-{ms:g}ms", args.latency_env, ms, QUICK if args.quick else LATENCY))
    return cases


def throughput(args: argparse.Namespace) -> None:
    th.set_num_threads(1)
    counts = args.counts or ([1, 2] if args.quick else [1, 2, 4, 8, 16])
    rollouts = args.rollouts or (3 if args.quick else 6)
    if rollouts < 2:
        raise ValueError("--rollouts must be >= 2 (rates are measured after the first rollout)")
    algo = ALGOS[args.algo]
    out = Path(args.out)
    report: dict[str, Any] = {
        "command": " ".join(["python scripts/actors_throughput.py", *args.argv]),
        "algo": args.algo,
        "rollouts_per_run": rollouts,
        "cases": [
            {**dataclasses.asdict(case), "hyperparams": {k: str(v) for k, v in case.hyperparams.items()}}
            for case in make_cases(args)
        ],
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch_threads_per_process": 1},
        "commit": git_commit(),
        "load_average_before": os.getloadavg(),
        "rows": [],
    }
    start = time.perf_counter()
    for case in make_cases(args):
        for n in counts:
            for method in args.methods:
                row: dict[str, Any] = {"case": case.name, "env": case.env_id, "latency_ms": case.latency_ms, "n": n}
                row["method"] = method
                if method == "process" and not forkserver_running():
                    row["note"] = "includes starting the fork server"
                try:
                    model = build_model(method, case, n, algo)
                    row.update(timed_learn(model, rollouts * case.hyperparams["n_steps"] * n))
                    if model.env is not None:
                        model.env.close()
                except Exception as error:  # record it and go on: one failing configuration does not lose the others
                    traceback.print_exc()
                    row["error"] = f"{type(error).__name__}: {error}"
                report["rows"].append(row)
                print(json.dumps(row), flush=True)
                report["load_average_after"] = os.getloadavg()
                report["total_seconds"] = time.perf_counter() - start
                write_report(report, out)
    print(throughput_markdown(report))


def write_report(report: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "throughput.json").write_text(json.dumps(report, indent=2))
    (out / "throughput.md").write_text(throughput_markdown(report))


TABLE_COLUMNS = (
    "case",
    "N",
    "method",
    "steps/s",
    "vs PPO",
    "start-up (s)",
    "lag mean",
    "lag: versions (columns)",
    "learner idle",
    "actors idle",
)


def throughput_markdown(report: dict[str, Any]) -> str:
    """The report as a markdown table, one row per configuration (columns: ``TABLE_COLUMNS``)."""
    machine, load_before = report["machine"], report["load_average_before"]
    load_after = report.get("load_average_after", load_before)
    lines = [
        f"# Actor throughput ({report['algo']} with actors vs PPO)",
        "",
        f"{machine['cpus']} CPUs ({machine['platform']}), one torch thread per process, commit {report['commit']}; "
        f"load average {load_before[0]:.1f} before / {load_after[0]:.1f} after. {report['rollouts_per_run']} rollouts "
        "per run; steps/s from the end of the first rollout to the end of the last; start-up: `learn()` to the end of "
        "the first rollout; lag: policy versions behind the learner per buffer column after the first rollout; learner "
        "idle: share of that time the learner waited for segments; actors idle: share of their time the actors waited "
        "for the learner to take their segments.",
        "",
    ]
    if load_before[0] >= 1.0:
        lines += [
            f"**The machine was loaded (load average {load_before[0]:.1f} before the run): these figures say nothing "
            "about speed on an idle machine.**",
            "",
        ]
    for case in report["cases"]:
        latency = f", {case['latency_ms']:g} ms per step (time.sleep)" if case["latency_ms"] else ""
        hyperparams = ", ".join(f"{key}={value}" for key, value in case["hyperparams"].items())
        lines.append(f"* `{case['name']}`: {case['env_id']}{latency}; {hyperparams}")
    lines += ["", "| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    ppo_rate = {(r["case"], r["n"]): r["steps_per_s"] for r in report["rows"] if r["method"] == "ppo" and "error" not in r}
    for row in report["rows"]:
        label = METHOD_LABELS.get(row["method"], row["method"])
        if "error" in row:
            lines.append(f"| {row['case']} | {row['n']} | {label} | error: {row['error']} |" + " |" * 6)
            continue

        def cell(key: str, fmt: str, row: dict[str, Any] = row) -> str:
            return format(row[key], fmt) if key in row else ""

        baseline = ppo_rate.get((row["case"], row["n"]))
        speedup = f"{row['steps_per_s'] / baseline:.2f}x" if baseline and row["method"] != "ppo" else ""
        startup = cell("startup_s", ".1f") + (f" ({row['note']})" if "note" in row else "")
        lag = ", ".join(f"{k}: {v}" for k, v in row.get("lag_versions", {}).items())
        lines.append(
            f"| {row['case']} | {row['n']} | {label} | {row['steps_per_s']:.0f} | {speedup} | {startup} "
            f"| {cell('lag_mean', '.2f')} | {lag} | {cell('learner_idle', '.0%')} | {cell('actor_idle', '.0%')} |"
        )
    total = report.get("total_seconds", math.nan)
    lines += ["", f"Command: `{report['command']}` ({total:.0f} s).", ""]
    return "\n".join(lines)


class EvalLog(BaseCallback):
    """``callback_after_eval`` of an EvalCallback: keeps (timesteps, mean return) of every evaluation."""

    def __init__(self) -> None:
        super().__init__()
        self.timesteps: list[int] = []
        self.mean_return: list[float] = []

    def _on_step(self) -> bool:
        assert isinstance(self.parent, EvalCallback)
        self.timesteps.append(self.num_timesteps)
        self.mean_return.append(float(self.parent.last_mean_reward))
        return True


def learn(args: argparse.Namespace) -> None:
    th.set_num_threads(1)
    runs: list[dict[str, Any]] = []
    for algo in (VACO, LaggedPPO):
        for seed in args.seeds:
            env = VecNormalize(make_vec_env(args.env, n_envs=1, seed=seed), gamma=0.99)
            eval_env = VecNormalize(make_vec_env(args.env, n_envs=1, seed=seed + 1000), training=False, norm_reward=False)
            log = EvalLog()
            evaluation = EvalCallback(
                eval_env,
                verbose=0,
                eval_freq=max(args.eval_every // args.n_actors, 1),
                n_eval_episodes=5,
                callback_after_eval=log,
            )
            model = algo(
                "MlpPolicy",
                env,
                n_steps=512,
                batch_size=64,
                seed=seed,
                n_actors=args.n_actors,
                actor_backend_kwargs=dict(env_fn=args.env, delay=tuple(args.delay)),
            )
            start, meter = time.perf_counter(), Meter()
            model.learn(args.timesteps, callback=[evaluation, meter])
            lags = [r.lags for r in meter.rollouts if r.lags is not None]
            runs.append(
                {
                    "algo": algo.__name__,
                    "seed": seed,
                    "seconds": time.perf_counter() - start,
                    "timesteps": log.timesteps,
                    "mean_return": log.mean_return,
                    "lag_mean": float(np.mean(np.concatenate(lags))),
                }
            )
            print(runs[-1]["algo"], seed, runs[-1]["mean_return"], flush=True)
    report = {"env": args.env, "n_actors": args.n_actors, "delay": args.delay, "timesteps": args.timesteps, "runs": runs}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"learning_{args.env}"
    (out / f"{stem}.json").write_text(json.dumps(report, indent=2))
    lines = [
        f"# VACO vs LaggedPPO, {args.n_actors} process actors, {args.env}",
        "",
        f"{args.timesteps} steps, VecNormalize, n_steps 512 per actor, batch 64, SB3 defaults otherwise; evaluation every "
        f"{args.eval_every} steps (5 episodes, deterministic). Command: `python scripts/actors_throughput.py learn --env "
        f"{args.env} --n-actors {args.n_actors} --seeds {' '.join(map(str, args.seeds))} --timesteps {args.timesteps}`",
        "",
        "| algo | seed | eval return by timesteps | lag mean (versions) | wall s |",
        "|---|---|---|---|---|",
    ]
    for r in runs:
        curve = ", ".join(f"{t // 1000}k: {m:.0f}" for t, m in zip(r["timesteps"], r["mean_return"], strict=True))
        lines.append(f"| {r['algo']} | {r['seed']} | {curve} | {r['lag_mean']:.2f} | {r['seconds']:.0f} |")
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    t = sub.add_parser("throughput", help="steps/s, lag and idle times of actors vs synchronous PPO")
    t.add_argument("--cases", nargs="+", choices=("compute", "latency"), default=["compute", "latency"])
    t.add_argument("--compute-env", default="Hopper-v5", help="env of the compute-bound case (HOPPER hyperparameters)")
    t.add_argument("--latency-env", default="CartPole-v1", help="env of the latency-bound cases (LATENCY hyperparameters)")
    t.add_argument("--latency-ms", type=float, nargs="+", default=[1.0, 5.0], help="per-step latencies, one case each")
    t.add_argument("--counts", type=int, nargs="+", default=None, help="numbers of envs / actors (default 1 2 4 8 16)")
    t.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    t.add_argument("--algo", choices=tuple(ALGOS), default="LaggedPPO", help="the algorithm run with actors")
    t.add_argument("--rollouts", type=int, default=None, help="rollouts per configuration (default 6, --quick 3)")
    t.add_argument("--out", default=str(OUT), help="output folder of throughput.{json,md}")
    t.add_argument("--quick", action="store_true", help="tiny networks and budgets, N = 1 2 unless --counts: seconds")
    lp = sub.add_parser("learn", help="VACO vs LaggedPPO with actors: evaluation curves")
    lp.add_argument("--env", default="InvertedPendulum-v5")
    lp.add_argument("--n-actors", type=int, default=4)
    lp.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    lp.add_argument("--timesteps", type=int, default=200_000)
    lp.add_argument("--eval-every", type=int, default=10_000)
    lp.add_argument("--delay", type=float, nargs=2, default=[0.0, 0.0], help="per-segment delay range (s) of the actors")
    lp.add_argument("--out", default=str(OUT), help="output folder of learning_<env>.{json,md}")
    args = parser.parse_args(argv)
    if args.command == "learn":
        learn(args)
    else:
        if args.command is None:
            args = t.parse_args([])
        args.argv = sys.argv[1:] if argv is None else argv
        throughput(args)


if __name__ == "__main__":
    gym.logger.min_level = 40
    main()
