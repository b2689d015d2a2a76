"""
Speed of VACO against SB3's PPO with the same zoo settings, no lag, one torch thread.

Runs alternate (PPO, VACO, then VACO, PPO, ...) one at a time, each in a fresh process so that its peak memory is
its own. Per run: env steps/s of the whole ``learn()``, seconds per ``train()`` call and per rollout collection (wall
and CPU time: on a shared machine wall time moves with the load), peak resident memory. Also the env's own step
rate with random actions (raw env, and the vectorized + normalized env the algorithms step), the physical limit of
the training loop. Writes ``speed.json`` and ``speed.md``::

    python scripts/speed_benchmark.py                       # Hopper-v5, 3 repeats of 20,480 steps
    python scripts/speed_benchmark.py --env HalfCheetah-v5 --repeats 5 --out results/speed/halfcheetah
"""

import argparse
import contextlib
import io
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime, timezone
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback

from vaco_lab.common import REPO_ROOT, atomic_write_text, command_line, git_revision, package_versions, use_one_thread

# Algorithm -> the shipped YAML whose env entry gives its settings.
ZOO_CONFIGS = {"ppo": "lagged_ppo", "vaco": "vaco"}


def clocks() -> np.ndarray:
    """``[wall, CPU]`` seconds now: wall time moves with the machine's load, this process's CPU time much less."""
    return np.array([time.perf_counter(), time.process_time()])


class PhaseTimer(BaseCallback):
    """Wall and CPU time of each rollout collection and of each ``train()`` call (a rollout's end to the next start)."""

    def __init__(self) -> None:
        super().__init__()
        self.collect: list[np.ndarray] = []
        self.train: list[np.ndarray] = []
        self._rollout_start: np.ndarray | None = None
        self._rollout_end: np.ndarray | None = None

    def _on_rollout_start(self) -> None:
        now = clocks()
        if self._rollout_end is not None:
            self.train.append(now - self._rollout_end)
        self._rollout_start = now

    def _on_rollout_end(self) -> None:
        self._rollout_end = clocks()
        assert self._rollout_start is not None
        self.collect.append(self._rollout_end - self._rollout_start)

    def _on_step(self) -> bool:
        return True

    def _on_training_end(self) -> None:
        if self._rollout_end is not None and len(self.train) < len(self.collect):
            self.train.append(clocks() - self._rollout_end)


def zoo_env_and_hyperparams(algorithm: str, env_id: str, seed: int) -> tuple[Any, dict[str, Any]]:
    """
    The env and constructor arguments the zoo builds from the env's YAML entry (schedules, policy_kwargs,
    VecNormalize, n_envs): ``vaco.yml`` for VACO, ``lagged_ppo.yml`` less ``policy_lag`` for SB3's PPO.
    """
    from rl_zoo3.exp_manager import ExperimentManager

    from sb3_vaco.zoo import HYPERPARAMS_DIR

    zoo_algo = ZOO_CONFIGS[algorithm]
    with tempfile.TemporaryDirectory() as scratch, contextlib.redirect_stdout(io.StringIO()):
        manager = ExperimentManager(
            argparse.Namespace(),
            zoo_algo,
            env_id,
            log_folder=scratch,
            eval_freq=0,
            seed=seed,
            verbose=0,
            device="cpu",
            config=str(HYPERPARAMS_DIR / f"{zoo_algo}.yml"),
        )
        hyperparams, _ = manager.read_hyperparameters()
        # The zoo's own preprocessing (a private method of rl_zoo3 2.9): the path `setup_experiment()` takes.
        hyperparams, *_ = manager._preprocess_hyperparams(hyperparams)
        env = manager.create_envs(manager.n_envs, no_log=True)
    if algorithm == "ppo":
        del hyperparams["policy_lag"]
    return env, hyperparams


def measure_training(algorithm: str, env_id: str, n_timesteps: int, seed: int) -> dict[str, Any]:
    """Train once in this (fresh) process and report its timings and memory."""
    from stable_baselines3 import PPO

    from sb3_vaco import VACO

    use_one_thread()
    env, hyperparams = zoo_env_and_hyperparams(algorithm, env_id, seed)
    model = (PPO if algorithm == "ppo" else VACO)(env=env, seed=seed, device="cpu", **hyperparams)
    rss_before_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    timer = PhaseTimer()
    start = clocks()
    model.learn(n_timesteps, callback=timer)
    learn_s, learn_cpu_s = map(float, clocks() - start)
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    train, collect = np.median(timer.train, axis=0).tolist(), np.median(timer.collect, axis=0).tolist()
    return {
        "algorithm": algorithm,
        "seed": seed,
        "num_timesteps": int(model.num_timesteps),
        "learn_s": learn_s,
        "learn_cpu_s": learn_cpu_s,
        "env_steps_per_s": model.num_timesteps / learn_s,
        "env_steps_per_cpu_s": model.num_timesteps / learn_cpu_s,
        "train_calls": len(timer.train),
        "s_per_train": train[0],
        "cpu_s_per_train": train[1],
        "s_per_rollout": collect[0],
        "cpu_s_per_rollout": collect[1],
        "train_fraction": float(np.sum(timer.train, axis=0)[0] / learn_s),
        "peak_rss_mb": peak_rss_mb,
        "rss_growth_mb": peak_rss_mb - rss_before_mb,
    }


def env_step_rates(env_id: str, n_steps: int, seed: int) -> dict[str, float]:
    """Random-action steps/s of the raw env and of the vectorized, normalized env the algorithms step."""
    import gymnasium as gym

    env = gym.make(env_id)
    env.action_space.seed(seed)
    env.reset(seed=seed)
    start = clocks()
    for _ in range(n_steps):
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            env.reset()
    raw_s, raw_cpu_s = clocks() - start
    env.close()

    vec_env, _ = zoo_env_and_hyperparams("ppo", env_id, seed)
    actions = [np.stack([vec_env.action_space.sample() for _ in range(vec_env.num_envs)]) for _ in range(n_steps)]
    vec_env.reset()
    start = clocks()
    for action in actions:
        vec_env.step(action)
    vec_s, vec_cpu_s = (clocks() - start) / vec_env.num_envs
    vec_env.close()
    return {
        "raw_env_steps_per_s": float(n_steps / raw_s),
        "raw_env_steps_per_cpu_s": float(n_steps / raw_cpu_s),
        "vec_env_steps_per_s": float(n_steps / vec_s),
        "vec_env_steps_per_cpu_s": float(n_steps / vec_cpu_s),
    }


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


SUMMARY_KEYS = (
    "env_steps_per_s",
    "env_steps_per_cpu_s",
    "s_per_train",
    "cpu_s_per_train",
    "s_per_rollout",
    "cpu_s_per_rollout",
    "train_fraction",
    "peak_rss_mb",
    "rss_growth_mb",
)
RATIO_KEYS = ("env_steps_per_s", "env_steps_per_cpu_s", "s_per_train", "cpu_s_per_train", "cpu_s_per_rollout", "peak_rss_mb")


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians per algorithm over the repeats, and the VACO/PPO ratios."""
    summary: dict[str, Any] = {}
    for algorithm in ZOO_CONFIGS:
        own = [run for run in runs if run["algorithm"] == algorithm]
        summary[algorithm] = {key: statistics.median(run[key] for run in own) for key in SUMMARY_KEYS}
    summary["ratio_vaco_over_ppo"] = {key: summary["vaco"][key] / summary["ppo"][key] for key in RATIO_KEYS}
    return summary


def markdown_report(record: dict[str, Any]) -> str:
    """The speed record as a short markdown page."""
    summary, rates, machine = record["summary"], record["env_rates"], record["machine"]
    lines = [
        f"# Speed: VACO vs SB3 PPO on {record['env']}",
        "",
        f"{record['repeats']} alternating runs per algorithm of {record['n_timesteps']:,} steps, zoo settings "
        f"(`lagged_ppo.yml` for PPO without `policy_lag`, `vaco.yml` for VACO), lag 0, one torch thread, each run in "
        f"a fresh process; medians over the runs. Machine: {machine['cpu']}, {machine['cores']} cores, load average "
        f"{machine['load_before'][0]:.2f} before / {machine['load_after'][0]:.2f} after. Wall-clock numbers move with "
        "the load of other work on the machine; CPU-time numbers (this process's CPU seconds) much less.",
        "",
        "| | env steps/s (wall) | env steps per CPU-s | s per train() (wall) | CPU-s per train() | s per rollout "
        "(wall) | CPU-s per rollout | train share of wall time | peak RSS (MB) | RSS growth in learn() (MB) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for algorithm in ZOO_CONFIGS:
        row = summary[algorithm]
        lines.append(
            f"| {algorithm.upper()} | {row['env_steps_per_s']:.0f} | {row['env_steps_per_cpu_s']:.0f} "
            f"| {row['s_per_train']:.3f} | {row['cpu_s_per_train']:.3f} | {row['s_per_rollout']:.3f} "
            f"| {row['cpu_s_per_rollout']:.3f} | {row['train_fraction']:.0%} | {row['peak_rss_mb']:.0f} "
            f"| {row['rss_growth_mb']:.1f} |"
        )
    ratio = summary["ratio_vaco_over_ppo"]
    lines += [
        f"| VACO / PPO | {ratio['env_steps_per_s']:.3f} | {ratio['env_steps_per_cpu_s']:.3f} | {ratio['s_per_train']:.3f} "
        f"| {ratio['cpu_s_per_train']:.3f} | | {ratio['cpu_s_per_rollout']:.3f} | | {ratio['peak_rss_mb']:.3f} | |",
        "",
        f"Env alone, random actions: raw `{record['env']}` {rates['raw_env_steps_per_s']:.0f} steps/s "
        f"({rates['raw_env_steps_per_cpu_s']:.0f} per CPU-s); vectorized and normalized as the algorithms step it "
        f"{rates['vec_env_steps_per_s']:.0f} steps/s ({rates['vec_env_steps_per_cpu_s']:.0f} per CPU-s).",
        "",
        "Command:",
        "",
        "```",
        record["command"],
        "```",
        "",
        "Per run (in execution order):",
        "",
        "| algorithm | steps/s (wall) | steps per CPU-s | s per train() (wall) | CPU-s per train() | train() calls "
        "| peak RSS (MB) |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {run['algorithm']} | {run['env_steps_per_s']:.0f} | {run['env_steps_per_cpu_s']:.0f} "
            f"| {run['s_per_train']:.3f} | {run['cpu_s_per_train']:.3f} | {run['train_calls']} | {run['peak_rss_mb']:.0f} |"
            for run in record["runs"]
        ),
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="Hopper-v5", help="env id with an entry in the shipped YAML files")
    parser.add_argument("--n-timesteps", type=int, default=20_480, help="training steps per run")
    parser.add_argument("--repeats", type=int, default=3, help="runs per algorithm")
    parser.add_argument("--env-steps", type=int, default=20_000, help="steps of the random-action env measurement")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "results" / "speed", help="output folder")
    args = parser.parse_args(argv)

    use_one_thread()
    load_before = os.getloadavg()
    env_rates = env_step_rates(args.env, args.env_steps, args.seed)
    print("env alone, random actions: " + ", ".join(f"{key} {rate:.0f}" for key, rate in env_rates.items()))
    order = [pair for repeat in range(args.repeats) for pair in (("ppo", "vaco") if repeat % 2 == 0 else ("vaco", "ppo"))]
    runs = []
    # One process per run (max_tasks_per_child=1): each run's peak memory is its own.
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn"), max_tasks_per_child=1) as pool:
        for algorithm in order:
            run = pool.submit(measure_training, algorithm, args.env, args.n_timesteps, args.seed).result()
            print(f"{algorithm}: {run['env_steps_per_s']:.0f} steps/s, {run['s_per_train']:.3f} s per train()")
            runs.append(run)
    record = {
        "env": args.env,
        "n_timesteps": args.n_timesteps,
        "repeats": args.repeats,
        "seed": args.seed,
        "env_rates": env_rates,
        "summary": summarize(runs),
        "runs": runs,
        "machine": {
            "cpu": _cpu_model(),
            "cores": os.cpu_count(),
            "load_before": load_before,
            "load_after": os.getloadavg(),
        },
        "versions": package_versions(),
        "git": git_revision(),
        "command": command_line(),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    atomic_write_text(args.out / "speed.json", json.dumps(record, indent=1) + "\n")
    atomic_write_text(args.out / "speed.md", markdown_report(record))
    print(markdown_report(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
