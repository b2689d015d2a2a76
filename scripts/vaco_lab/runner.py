"""
The grid runner: every run built by RL Zoo's ``ExperimentManager`` (after ``sb3_vaco.zoo.register_algos()``) from
the YAML shipped in ``sb3_vaco``, so runs use exactly the zoo hyperparameters; a variant's and an update setting's
hyperparameters are applied on top like the zoo's ``-params``. Runs execute in spawned worker processes with one
torch thread each. A run whose ``result.json`` exists is skipped, so running a grid again resumes it.

Output, per run: ``<out>/<env>/<algorithm>/lag<L>/seed<S>/result.json`` (eval curve, with each evaluation's
wall-clock time since the start of ``learn()``; scores, timing, hyperparameters, versions) and ``progress.csv.gz`` (one
row per iteration: lag and TV statistics, losses).
"""

import argparse
import contextlib
import csv
import inspect
import io
import json
import multiprocessing
import os
import signal
import tempfile
import time
import traceback
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from datetime import datetime, timezone
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback, CallbackList, EvalCallback

from sb3_vaco.zoo import ZOO_ALGOS, config_file
from vaco_lab.common import (
    PROGRESS_FILE,
    RESULT_FILE,
    LagSetting,
    atomic_write_text,
    lag_label,
    package_versions,
    parse_lag,
    use_one_thread,
    zoo_entry,
)
from vaco_lab.grids import BASE_UPDATE, RELATIVE_VALUE, Grid, UpdateSetting, Variant

ERROR_FILE = "error.log"
SCHEMA_VERSION = 1
# Hyperparameters the zoo reads itself (not constructor arguments of the algo).
ZOO_KEYS = frozenset(
    {"normalize", "normalize_kwargs", "n_envs", "monitor_kwargs", "env_kwargs", "frame_stack", "env_wrapper",
     "vec_env_wrapper", "callback", "noise_type", "noise_std"}
)  # fmt: skip


@dataclass(frozen=True)
class RunSpec:
    """One run of the grid, with everything a worker process needs."""

    env: str
    variant: str
    algo: str
    update: str
    lag: str
    seed: int
    hyperparams: dict[str, Any]
    n_timesteps: int
    eval_freq: int
    n_eval_episodes: int
    out_dir: Path
    context: dict[str, Any]

    @property
    def algorithm(self) -> str:
        """The label results are grouped by: the variant, plus ``@update`` off the base update setting."""
        return self.variant if self.update == BASE_UPDATE else f"{self.variant}@{self.update}"

    @property
    def run_id(self) -> str:
        return f"{self.env}/{self.algorithm}/lag{self.lag}/seed{self.seed}"

    @property
    def run_dir(self) -> Path:
        return self.out_dir / self.run_id

    @property
    def result_path(self) -> Path:
        return self.run_dir / RESULT_FILE


@dataclass(frozen=True)
class RunOutcome:
    """What a worker reports back: success and final score, or the error."""

    run_id: str
    ok: bool
    final_score: float = float("nan")
    wall_time_s: float = 0.0
    message: str = ""


def constructor_parameters(cls: type) -> dict[str, inspect.Parameter]:
    """The zoo's :func:`~sb3_vaco.zoo.exp_manager.constructor_parameters`, imported when needed (it imports rl_zoo3)."""
    from sb3_vaco.zoo.exp_manager import constructor_parameters as zoo_constructor_parameters

    return zoo_constructor_parameters(cls)


def _constructor_default(algo: str, key: str) -> Any:
    """Default of constructor argument ``key`` of the algo."""
    parameter = constructor_parameters(ZOO_ALGOS[algo]).get(key)
    if parameter is None or parameter.default is inspect.Parameter.empty:
        raise ValueError(f"{key!r} is neither in the YAML entry nor an argument of {algo} with a default")
    return parameter.default


def _scale(base: Any, key: str, factor: float) -> int | float:
    if isinstance(base, bool) or not isinstance(base, (int, float)):
        raise ValueError(f"x{factor:g} needs a numeric {key!r}, got {base!r}")
    scaled = base * factor
    if isinstance(base, int):
        if scaled != int(scaled):
            raise ValueError(f"{key}={base} x{factor:g} is not an integer")
        return int(scaled)
    return scaled


def check_hyperparam_names(variant: Variant, update: UpdateSetting) -> None:
    """
    Every hyperparameter of the variant and the update setting must be a constructor argument of the zoo algo or a
    key the zoo reads itself: an option that no longer exists fails here, before any run starts.
    """
    valid = set(constructor_parameters(ZOO_ALGOS[variant.algo])) | ZOO_KEYS
    owners = {f"variant {variant.name!r}": variant.hyperparams, f"update {update.label!r}": update.hyperparams}
    for owner, hyperparams in owners.items():
        unknown = sorted(set(hyperparams) - valid)
        if unknown:
            raise ValueError(f"{owner}: {', '.join(unknown)} is not a hyperparameter of {variant.algo}")


def variant_hyperparams(variant: Variant, update: UpdateSetting, env_id: str) -> dict[str, Any]:
    """
    The hyperparameters a run hands to the zoo on top of the YAML entry: the variant's, then the update setting's
    (``xF`` resolved against the YAML value or the constructor default).
    """
    entry = zoo_entry(variant.algo, env_id)
    hyperparams = dict(variant.hyperparams)
    for key, value in update.hyperparams.items():
        relative = RELATIVE_VALUE.match(value) if isinstance(value, str) else None
        if relative:
            current = hyperparams.get(key, entry.get(key, _constructor_default(variant.algo, key)))
            value = _scale(current, key, float(relative.group(1)))
        hyperparams[key] = value
    return hyperparams


def build_grid(
    envs: Sequence[str],
    variants: Sequence[Variant],
    lags: Sequence[str],
    updates: Sequence[UpdateSetting],
    seeds: Sequence[int],
    out_dir: Path,
    n_timesteps: int | None,
    eval_freq: int,
    n_eval_episodes: int,
    context: dict[str, Any],
) -> list[RunSpec]:
    """
    The runs of one cell, in run order: seed-major (seed 0 of every combination before seed 1), then env, lag, update
    and variant in the order given, so a partly finished grid already covers every combination.

    :param n_timesteps: training steps per run; None: the YAML entry's ``n_timesteps``
    """
    for axis in (envs, [variant.name for variant in variants], [update.label for update in updates], lags, seeds):
        if len(set(axis)) != len(axis):
            raise ValueError(f"Repeated entry in {list(axis)}")
    lag_settings: list[LagSetting] = [parse_lag(lag) for lag in lags]
    runs = []
    for seed in seeds:
        for env_id in envs:
            for lag in lag_settings:
                for update in updates:
                    for variant in variants:
                        check_hyperparam_names(variant, update)
                        hyperparams = variant_hyperparams(variant, update, env_id)
                        if {"policy_lag", "n_timesteps"} & set(hyperparams):
                            raise ValueError("Set the lag with --lags and the run length with --n-timesteps")
                        hyperparams["policy_lag"] = list(lag) if isinstance(lag, tuple) else lag
                        steps = n_timesteps or int(zoo_entry(variant.algo, env_id)["n_timesteps"])
                        runs.append(
                            RunSpec(
                                env=env_id,
                                variant=variant.name,
                                algo=variant.algo,
                                update=update.label,
                                lag=lag_label(lag),
                                seed=seed,
                                hyperparams=hyperparams,
                                n_timesteps=steps,
                                eval_freq=eval_freq,
                                n_eval_episodes=n_eval_episodes,
                                out_dir=out_dir.resolve(),  # workers run in a scratch folder
                                context=context,
                            )
                        )
    return runs


def _same_run(first: RunSpec, second: RunSpec) -> bool:
    keys = ("algo", "hyperparams", "n_timesteps", "eval_freq", "n_eval_episodes")
    return all(getattr(first, key) == getattr(second, key) for key in keys)


def grid_runs(grid: Grid, root: Path, context: dict[str, Any]) -> list[RunSpec]:
    """
    Every run of a grid, in run order: seed-major over all cells (seed 0 of every cell, in the cells' order, before
    seed 1), and within a cell as :func:`build_grid`. A run listed by two cells (the same folder) is run once; two
    cells that define the same run differently are an error.

    :param root: the folder the cells' relative ``out`` folders are relative to (the repository root)
    """
    runs: dict[Path, RunSpec] = {}
    for seed in sorted({seed for cell in grid.cells for seed in cell.seeds}):
        for cell in grid.cells:
            if seed not in cell.seeds:
                continue
            cell_runs = build_grid(
                envs=cell.envs,
                variants=cell.variants,
                lags=cell.lags,
                updates=cell.updates,
                seeds=[seed],
                out_dir=root / cell.out,
                n_timesteps=cell.n_timesteps,
                eval_freq=cell.eval_freq,
                n_eval_episodes=cell.n_eval_episodes,
                context=context,
            )
            for run in cell_runs:
                known = runs.setdefault(run.run_dir, run)
                if not _same_run(known, run):
                    raise ValueError(
                        f"Grid {grid.name!r} defines {run.run_dir} twice, differently: {known.algo} {known.hyperparams} "
                        f"({known.n_timesteps} steps) and {run.algo} {run.hyperparams} ({run.n_timesteps} steps)"
                    )
    return list(runs.values())


class ProgressRecorder(BaseCallback):
    """
    One row per iteration: the rollout's ``rollout/*`` statistics (policy lag, recorded during collection) and the
    ``train/*`` statistics of the ``train()`` call that consumed that rollout.

    SB3 dumps the logger between collection and ``train()``, and EvalCallback dumps it during collection, so the
    ``train/*`` values are read when the next rollout starts (or training ends), and attached to the previous row
    once ``train/n_updates`` shows they are new.
    """

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[dict[str, float]] = []
        self._start = 0.0
        self._last_n_updates: float | None = None

    def _on_training_start(self) -> None:
        self._start = time.perf_counter()

    def _on_step(self) -> bool:
        return True

    def _attach_train_stats(self) -> None:
        logged = self.model.logger.name_to_value
        n_updates = logged.get("train/n_updates")
        if not self.rows or n_updates is None or n_updates == self._last_n_updates:
            return
        self._last_n_updates = n_updates
        self.rows[-1].update({key: float(value) for key, value in logged.items() if key.startswith("train/")})

    def _on_rollout_start(self) -> None:
        self._attach_train_stats()

    def _on_rollout_end(self) -> None:
        episodes = self.model.ep_info_buffer
        row = {
            "iteration": len(self.rows) + 1,
            "timesteps": self.model.num_timesteps,
            "time_s": time.perf_counter() - self._start,
            "rollout/ep_rew_mean": float(np.mean([ep["r"] for ep in episodes])) if episodes else float("nan"),
            "rollout/ep_len_mean": float(np.mean([ep["l"] for ep in episodes])) if episodes else float("nan"),
        }
        logged = self.model.logger.name_to_value
        row.update({key: float(value) for key, value in logged.items() if key.startswith("rollout/")})
        self.rows.append(row)

    def _on_training_end(self) -> None:
        self._attach_train_stats()


class EvalClock(CallbackList):
    """
    The run's EvalCallback, timed: for every evaluation, the wall-clock seconds from the start of ``learn()`` to the
    start of the evaluation (``wall_s``) and the seconds spent in the evaluations before it (``eval_time_s``), so
    that ``wall_s - eval_time_s`` is the training time that produced the evaluated policy. Replaces the EvalCallback
    in the zoo's callback list (every hook is forwarded to it).

    :param eval_callback: the zoo's EvalCallback
    """

    def __init__(self, eval_callback: EvalCallback) -> None:
        super().__init__([eval_callback])
        self.eval_callback = eval_callback
        self.start = time.perf_counter()  # reset just before learn()
        self.wall_s: list[float] = []
        self.eval_time_s: list[float] = []
        self.spent = 0.0

    def record(self, started: float) -> None:
        """An evaluation that started at ``started`` (``time.perf_counter()``)."""
        self.wall_s.append(started - self.start)
        self.eval_time_s.append(self.spent)

    def _on_step(self) -> bool:
        evaluations, started = len(self.eval_callback.evaluations_timesteps), time.perf_counter()
        continue_training = super()._on_step()
        if len(self.eval_callback.evaluations_timesteps) > evaluations:
            self.record(started)
            self.spent += time.perf_counter() - started
        return continue_training


def progress_csv(rows: list[dict[str, float]]) -> str:
    """The progress rows as CSV (6 significant digits; columns in order of first appearance)."""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, restval="", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({key: f"{value:.6g}" if isinstance(value, float) else value for key, value in row.items()})
    return buffer.getvalue()


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(key): _json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(item) for item in value]
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    return str(value)


def resolved_hyperparams(model: Any, zoo_hyperparams: dict[str, Any]) -> dict[str, Any]:
    """
    Every constructor argument of the model as it was used: the model's attribute, or for a schedule the zoo value
    (``lin_0.001``) or its initial value when the YAML left it at the default.
    """
    resolved: dict[str, Any] = {}
    for name in constructor_parameters(type(model)):
        if name in ("env", "_init_setup_model") or not hasattr(model, name):
            continue
        value = getattr(model, name)
        if callable(value) and not isinstance(value, type):
            value = zoo_hyperparams.get(name, value(1.0) if name != "policy" else type(value).__name__)
        resolved[name] = _json_safe(value)
    return resolved


def random_policy_score(env_id: str, n_episodes: int, seed: int) -> float:
    """Mean return of uniformly random actions over ``n_episodes`` (the score normalization's floor)."""
    import gymnasium as gym

    env = gym.make(env_id)
    env.action_space.seed(seed)
    env.reset(seed=seed)
    returns = []
    for _ in range(n_episodes):
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
        env.reset()
    env.close()
    return float(np.mean(returns))


def _eval_curve(model: Any, clock: EvalClock, spec: RunSpec, learn_time: float) -> dict[str, list]:
    """
    The eval callback's evaluations, plus a last one at the end of training if the schedule did not hit it (timed at
    the end of ``learn()``, ``learn_time`` seconds after its start).
    """
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import sync_envs_normalization

    eval_callback = clock.eval_callback
    wall_s, eval_time_s = list(clock.wall_s), list(clock.eval_time_s)
    timesteps = list(eval_callback.evaluations_timesteps)
    returns = [list(map(float, r)) for r in eval_callback.evaluations_results]
    lengths = [list(map(float, lengths)) for lengths in eval_callback.evaluations_length]
    if not timesteps or timesteps[-1] < spec.n_timesteps:
        sync_envs_normalization(model.get_env(), eval_callback.eval_env)
        episode_returns, episode_lengths = evaluate_policy(
            model,
            eval_callback.eval_env,
            n_eval_episodes=spec.n_eval_episodes,
            deterministic=eval_callback.deterministic,
            return_episode_rewards=True,
        )
        timesteps.append(model.num_timesteps)
        returns.append(list(map(float, episode_returns)))  # type: ignore[arg-type]
        lengths.append(list(map(float, episode_lengths)))  # type: ignore[arg-type]
        wall_s.append(learn_time)
        eval_time_s.append(clock.spent)
    if len(wall_s) != len(timesteps):
        raise RuntimeError(f"{len(timesteps)} evaluations but {len(wall_s)} timed: the eval callback was not timed")
    return {
        "timesteps": timesteps,
        "mean_return": [float(np.mean(r)) for r in returns],
        "std_return": [float(np.std(r)) for r in returns],
        "mean_ep_length": [float(np.mean(lengths_)) for lengths_ in lengths],
        "returns": returns,
        "wall_s": wall_s,
        "eval_time_s": eval_time_s,
    }


def train_and_evaluate(spec: RunSpec, scratch: Path) -> tuple[dict[str, Any], list[dict[str, float]]]:
    """Train one run through the zoo's ExperimentManager in ``scratch``; return the result record and progress rows."""
    import gymnasium as gym

    from sb3_vaco.zoo import register_algos
    from sb3_vaco.zoo.exp_manager import VACOExperimentManager

    register_algos()
    start, cpu_start = time.perf_counter(), time.process_time()
    zoo_args = argparse.Namespace(algo=spec.algo, env=spec.env, seed=spec.seed, run_id=spec.run_id)
    # The zoo's manager with VACO's schedules (`tv_threshold: lin_...`) and configuration checks
    manager = VACOExperimentManager(
        zoo_args,
        spec.algo,
        spec.env,
        log_folder=str(scratch),
        eval_freq=spec.eval_freq,
        n_eval_episodes=spec.n_eval_episodes,
        # As a hyperparameter (not the `-n` argument) so that the zoo's record of the run shows it.
        hyperparams={**spec.hyperparams, "n_timesteps": spec.n_timesteps},
        seed=spec.seed,
        log_interval=-1,
        verbose=0,
        device="cpu",
        config=str(config_file(spec.algo)),
    )
    setup = manager.setup_experiment()
    assert setup is not None
    model, zoo_hyperparams = setup
    recorder = ProgressRecorder()
    manager.callbacks.append(recorder)
    index, eval_callback = next(
        (index, callback) for index, callback in enumerate(manager.callbacks) if isinstance(callback, EvalCallback)
    )
    # The zoo divides the evaluation interval by its n_envs; with asynchronous actors each callback step stands for
    # model.n_envs transitions (the actors' envs), so evaluations stay every spec.eval_freq env steps.
    eval_callback.eval_freq = max(spec.eval_freq // model.n_envs, 1)
    clock = EvalClock(eval_callback)
    manager.callbacks[index] = clock
    learn_start = clock.start = time.perf_counter()
    manager.learn(model)
    learn_time = time.perf_counter() - learn_start
    if model.num_timesteps < spec.n_timesteps:
        # The zoo's learn() swallows KeyboardInterrupt: an interrupted run must not be recorded as finished.
        raise RuntimeError(f"Training stopped at {model.num_timesteps} of {spec.n_timesteps} steps")
    curve = _eval_curve(model, clock, spec, learn_time)
    result = {
        "schema_version": SCHEMA_VERSION,
        "run_id": spec.run_id,
        "env": spec.env,
        "env_spec": str(gym.spec(spec.env).id),
        "algorithm": spec.algorithm,
        "variant": spec.variant,
        "algo": spec.algo,
        "update": spec.update,
        "lag": spec.lag,
        "policy_lag": spec.hyperparams["policy_lag"],
        "seed": spec.seed,
        "n_timesteps": spec.n_timesteps,
        "num_timesteps": int(model.num_timesteps),
        "eval_freq": spec.eval_freq,
        "n_eval_episodes": spec.n_eval_episodes,
        "final_score": curve["mean_return"][-1],
        "final_score_std": curve["std_return"][-1],
        "auc_score": float(np.mean(curve["mean_return"])),
        "random_score": random_policy_score(spec.env, spec.n_eval_episodes, spec.seed),
        "eval": curve,
        "wall_time_s": time.perf_counter() - start,
        # CPU time of this (single-threaded) run: its cost on an idle core, whatever else the machine was doing.
        "cpu_time_s": time.process_time() - cpu_start,
        "learn_time_s": learn_time,
        "env_steps_per_s": model.num_timesteps / learn_time,
        "hyperparams": {
            "overrides": _json_safe(spec.hyperparams),
            "zoo": _json_safe(dict(zoo_hyperparams)),
            "resolved": resolved_hyperparams(model, zoo_hyperparams),
        },
        "versions": package_versions(),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **spec.context,
    }
    return result, recorder.rows


class _Terminated(BaseException):
    """Raised in a worker by SIGTERM, i.e. the parent stopping the grid."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise _Terminated


def execute_run(spec: RunSpec) -> RunOutcome:
    """
    Worker entry point: :func:`run_in_scratch`. On SIGTERM the run unwinds (its scratch folder is removed) and the
    worker process exits, so that the pool hands it no further run.
    """
    try:
        return run_in_scratch(spec)
    except _Terminated:
        os._exit(128 + signal.SIGTERM)


def run_in_scratch(spec: RunSpec) -> RunOutcome:
    """
    Train in a scratch folder (zoo logs, models and monitors stay there and are deleted), then write
    ``progress.csv.gz`` and, last, ``result.json`` atomically. A failure leaves ``error.log`` and no result.
    """
    start, cwd = time.perf_counter(), os.getcwd()
    with tempfile.TemporaryDirectory(prefix="sb3_vaco_bench_") as scratch:
        log_path = Path(scratch) / "run.log"
        try:
            os.chdir(scratch)  # MuJoCo writes its warnings (MUJOCO_LOG.TXT) into the working directory
            with open(log_path, "w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                result, rows = train_and_evaluate(spec, Path(scratch))
        except Exception:
            log_tail = log_path.read_text()[-5000:] if log_path.exists() else ""
            atomic_write_text(spec.run_dir / ERROR_FILE, f"{traceback.format_exc()}\n--- output (tail) ---\n{log_tail}")
            return RunOutcome(spec.run_id, ok=False, message=traceback.format_exc(limit=1).strip().splitlines()[-1])
        finally:
            os.chdir(cwd)
    atomic_write_text(spec.run_dir / PROGRESS_FILE, progress_csv(rows))
    atomic_write_text(spec.result_path, json.dumps(result, indent=1) + "\n")
    (spec.run_dir / ERROR_FILE).unlink(missing_ok=True)
    return RunOutcome(spec.run_id, ok=True, final_score=result["final_score"], wall_time_s=time.perf_counter() - start)


def _init_worker() -> None:
    """Worker set-up: one torch thread; Ctrl-C is the parent's to handle; SIGTERM ends the run (see :func:`execute_run`)."""
    use_one_thread()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _raise_terminated)


def run_grid(runs: Sequence[RunSpec], workers: int) -> list[RunOutcome]:
    """
    Run the unfinished runs of the grid on ``workers`` spawned processes, in grid order. On Ctrl-C the workers are
    terminated: the runs they had started leave no result and run again next time.
    """
    from tqdm import tqdm

    todo = [run for run in runs if not run.result_path.exists()]
    print(f"{len(runs) - len(todo)} of {len(runs)} runs already finished: skipped; {len(todo)} to run on {workers} worker(s)")
    outcomes: list[RunOutcome] = []
    if not todo:
        return outcomes
    use_one_thread()  # the environment variables reach the workers before they import torch
    progress = tqdm(total=len(runs), initial=len(runs) - len(todo), unit="run", dynamic_ncols=True)
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"), initializer=_init_worker) as pool:
        futures = [pool.submit(execute_run, run) for run in todo]
        try:
            for future in as_completed(futures):
                outcome = future.result()
                outcomes.append(outcome)
                status = f"{outcome.final_score:.1f}" if outcome.ok else f"FAILED: {outcome.message}"
                progress.write(f"{outcome.run_id}: {status} ({outcome.wall_time_s:.0f} s)")
                progress.update()
        except KeyboardInterrupt:
            for future in futures:
                future.cancel()
            for worker in multiprocessing.active_children():
                worker.terminate()
            progress.write("Interrupted: rerun the same command to resume (finished runs are kept).")
            raise
        finally:
            progress.close()
    return outcomes


def print_dry_run(runs: Iterable[RunSpec]) -> None:
    """List the runs in run order with their status and the hyperparameters handed to the zoo."""
    runs = list(runs)
    done = sum(run.result_path.exists() for run in runs)
    for index, run in enumerate(runs, start=1):
        status = "done" if run.result_path.exists() else "todo"
        print(f"{index:4d} [{status}] {run.run_id}  algo={run.algo} steps={run.n_timesteps} params={run.hyperparams}")
    todo_steps = sum(run.n_timesteps for run in runs if not run.result_path.exists())
    print(f"{len(runs)} runs, {done} done, {len(runs) - done} to run ({todo_steps:,} env steps)")
