"""
Asynchronous actors: throughput and measured lag, and (subcommand ``learn``) a learning comparison.

``throughput`` (default): env steps per second of training with 1, 2 and 4 process actors (LaggedPPO, and VACO at
the largest count) against SB3's PPO with a DummyVecEnv and a SubprocVecEnv of the same number of envs, next to the
env-only step rate (random actions, DummyVecEnv); plus the lag distribution the actors produced. Rates are measured
after the first rollout (actor / subprocess start-up excluded, reported separately). Writes
``results/actors/throughput.{json,md}``::

    python scripts/actors_throughput.py throughput --env Hopper-v5 --timesteps 8192

``learn``: VACO vs LaggedPPO with asynchronous actors, several seeds, evaluation curves. Writes
``results/actors/learning_<env>.{json,md}``::

    python scripts/actors_throughput.py learn --env InvertedPendulum-v5 --n-actors 4 --seeds 0 1 2 --timesteps 200000
"""

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import gymnasium as gym
import numpy as np
import torch as th
from stable_baselines3 import PPO
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback, EvalCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecNormalize
from torch import nn

from sb3_vaco import VACO, LaggedPPO
from sb3_vaco.common.lag import LaggedOnPolicyAlgorithm

OUT = Path("results/actors")
# RL Zoo's Hopper PPO network and n_steps; batch_size 64 and 5 epochs (zoo: 32, 5) keep the learner's share moderate.
HOPPER: dict[str, Any] = dict(
    n_steps=512,
    batch_size=64,
    n_epochs=5,
    policy_kwargs=dict(log_std_init=-2, ortho_init=False, activation_fn=nn.ReLU, net_arch=dict(pi=[256, 256], vf=[256, 256])),
)


class Meter(BaseCallback):
    """Time and timesteps at the end of the first rollout, and the per-column lag of every rollout (actor runs)."""

    def __init__(self) -> None:
        super().__init__()
        self.start = time.perf_counter()
        self.first_rollout: tuple[float, int] | None = None
        self.lags: list[int] = []
        self.lag_grad_steps: list[float] = []
        self.wait = 0.0

    def _on_rollout_end(self) -> None:
        if self.first_rollout is None:
            self.first_rollout = (time.perf_counter(), self.model.num_timesteps)
        pool = getattr(self.model, "_actors", None)
        if pool is not None:
            assert isinstance(self.model, LaggedOnPolicyAlgorithm)
            self.lags.extend((pool.version - self.model.rollout_buffer.behavior_versions[0]).tolist())
            self.lag_grad_steps.append(self.model.logger.name_to_value["rollout/policy_lag_grad_steps_mean"])
            self.wait += pool.wait_seconds

    def _on_step(self) -> bool:
        return True


def timed_learn(model: BaseAlgorithm, timesteps: int) -> dict[str, Any]:
    meter = Meter()
    model.learn(timesteps, callback=meter)
    end = time.perf_counter()
    assert meter.first_rollout is not None
    first_time, first_steps = meter.first_rollout
    result: dict[str, Any] = {
        "steps_per_s": (model.num_timesteps - first_steps) / (end - first_time),
        "steps_per_s_with_startup": model.num_timesteps / (end - meter.start),
        "first_rollout_s": first_time - meter.start,
        "timesteps": model.num_timesteps,
    }
    if meter.lags:
        values, counts = np.unique(meter.lags, return_counts=True)
        result["lag_versions"] = {int(v): int(c) for v, c in zip(values, counts, strict=True)}
        result["lag_mean"] = float(np.mean(meter.lags))
        result["lag_grad_steps_mean"] = float(np.mean(meter.lag_grad_steps))
        result["learner_wait_fraction"] = meter.wait / (end - meter.start)
    return result


def env_only_rate(env_id: str, n_envs: int, seconds: float = 2.0) -> float:
    env = make_vec_env(env_id, n_envs=n_envs, seed=0, vec_env_cls=DummyVecEnv)
    env.reset()
    actions = np.stack([env.action_space.sample() for _ in range(n_envs)])
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        env.step(actions)
        steps += n_envs
    env.close()
    return steps / (time.perf_counter() - start)


def throughput(args: argparse.Namespace) -> None:
    th.set_num_threads(1)
    hp = dict(HOPPER, seed=0)
    rows: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    start = time.perf_counter()
    for n in args.counts:
        rows.append({"n": n, "method": "env only (random actions, DummyVecEnv)", "steps_per_s": env_only_rate(args.env, n)})
        for vec_env_cls in (DummyVecEnv, SubprocVecEnv):
            env = make_vec_env(args.env, n_envs=n, seed=0, vec_env_cls=vec_env_cls)
            result = timed_learn(PPO("MlpPolicy", env, **hp), args.timesteps)
            env.close()
            rows.append({"n": n, "method": f"PPO, {vec_env_cls.__name__}", **result})
            print(rows[-1], flush=True)
        algos = [LaggedPPO, VACO] if n == max(args.counts) else [LaggedPPO]
        for algo in algos:
            model = algo("MlpPolicy", args.env, n_actors=n, **hp)
            rows.append({"n": n, "method": f"{algo.__name__}, {n} process actors", **timed_learn(model, args.timesteps)})
            print(rows[-1], flush=True)
    report = {
        "env": args.env,
        "timesteps_per_run": args.timesteps,
        "hyperparameters": {**hp, "policy_kwargs": str(hp["policy_kwargs"])},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch_threads": 1},
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "total_seconds": time.perf_counter() - start,
        "rows": rows,
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "throughput.json").write_text(json.dumps(report, indent=2))
    (OUT / "throughput.md").write_text(throughput_markdown(report))
    print(throughput_markdown(report))


def throughput_markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# Actor throughput on {report['env']}",
        "",
        f"{report['timesteps_per_run']} env steps per run, hyperparameters `{report['hyperparameters']}`, one torch thread "
        f"per process, {report['machine']['cpus']} CPUs, load average {report['load_average_before'][0]:.1f} before / "
        f"{report['load_average_after'][0]:.1f} after (other jobs were running). Steps/s are measured after the first "
        "rollout; lag is in policy versions behind the learner at the time the batch was assembled, per buffer column.",
        "",
        "| envs / actors | method | steps/s | steps/s incl. start-up | first rollout (s) | lag: versions (count) | lag mean "
        "| lag (grad steps) | learner waiting |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        lag = ", ".join(f"{k}: {v}" for k, v in row.get("lag_versions", {}).items())

        def cell(key: str, fmt: str, row: dict[str, Any] = row) -> str:
            return format(row[key], fmt) if key in row else ""

        lines.append(
            f"| {row['n']} | {row['method']} | {row['steps_per_s']:.0f} | {cell('steps_per_s_with_startup', '.0f')} "
            f"| {cell('first_rollout_s', '.1f')} | {lag} | {cell('lag_mean', '.2f')} | {cell('lag_grad_steps_mean', '.0f')} "
            f"| {cell('learner_wait_fraction', '.0%')} |"
        )
    lines += ["", f"Command: `python scripts/actors_throughput.py throughput --env {report['env']} "
              f"--timesteps {report['timesteps_per_run']}` ({report['total_seconds']:.0f} s).", ""]  # fmt: skip
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
            runs.append(
                {
                    "algo": algo.__name__,
                    "seed": seed,
                    "seconds": time.perf_counter() - start,
                    "timesteps": log.timesteps,
                    "mean_return": log.mean_return,
                    "lag_mean": float(np.mean(meter.lags)),
                }
            )
            print(runs[-1]["algo"], seed, runs[-1]["mean_return"], flush=True)
    report = {"env": args.env, "n_actors": args.n_actors, "delay": args.delay, "timesteps": args.timesteps, "runs": runs}
    OUT.mkdir(parents=True, exist_ok=True)
    stem = f"learning_{args.env}"
    (OUT / f"{stem}.json").write_text(json.dumps(report, indent=2))
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
    (OUT / f"{stem}.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    t = sub.add_parser("throughput")
    t.add_argument("--env", default="Hopper-v5")
    t.add_argument("--timesteps", type=int, default=8192)
    t.add_argument("--counts", type=int, nargs="+", default=[1, 2, 4])
    lp = sub.add_parser("learn")
    lp.add_argument("--env", default="InvertedPendulum-v5")
    lp.add_argument("--n-actors", type=int, default=4)
    lp.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    lp.add_argument("--timesteps", type=int, default=200_000)
    lp.add_argument("--eval-every", type=int, default=10_000)
    lp.add_argument("--delay", type=float, nargs=2, default=[0.0, 0.0], help="per-segment delay range (s) of the actors")
    args = parser.parse_args()
    if args.command == "learn":
        learn(args)
    else:
        if args.command is None:
            args = t.parse_args([])
        throughput(args)


if __name__ == "__main__":
    gym.logger.min_level = 40
    main()
