"""
Benchmark grid: {algorithm variant} × {env} × {lag setting} × {update setting} × {seed}.

Every run is built by RL Zoo's ``ExperimentManager`` (after ``sb3_vaco.zoo.register_algos()``) from the YAML
shipped in ``sb3_vaco`` (``--conf-file`` equivalent), so runs use exactly the zoo hyperparameters; a variant's
and an update setting's hyperparameters are applied on top like the zoo's ``-params``. Runs execute in
parallel worker processes with one torch thread each. A run whose ``result.json`` exists is skipped, so
rerunning the same command resumes an interrupted grid.

Examples::

    python scripts/benchmark.py --preset demo
    python scripts/benchmark.py --preset main --dry-run
    python scripts/benchmark.py --envs Hopper-v5 --variants vaco lagged_ppo "vaco:tv_threshold=0.05,tv_reference=learner" \\
        --lags 0 4 0-8 --seeds 0-4 --n-timesteps 300000 --eval-freq 20000 --out results/my_grid

Output, per run: ``<out>/<env>/<algorithm>/lag<L>/seed<S>/result.json`` (eval curve, scores, timing,
hyperparameters, versions) and ``progress.csv`` (one row per iteration: lag and TV statistics, losses).
``docs/benchmarks.md`` describes both.
"""

import argparse
import contextlib
import csv
import inspect
import io
import json
import multiprocessing
import os
import re
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from datetime import datetime, timezone
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from _bench_common import (
    PROGRESS_FILE,
    REPO_ROOT,
    RESULT_FILE,
    LagSetting,
    atomic_write_text,
    command_line,
    git_revision,
    lag_label,
    package_versions,
    parse_lag,
    use_one_thread,
    zoo_entry,
)
from stable_baselines3.common.callbacks import BaseCallback, EvalCallback

ERROR_FILE = "error.log"
SCHEMA_VERSION = 1
BASE_UPDATE = "base"

# Named algorithm variants: name -> (zoo algo, hyperparameters on top of that algo's YAML entry).
# A VACO variant whose policy loss uses `clip_range` ("clip", "spo") takes the env's clip_range from
# lagged_ppo.yml unless it sets one (see `variant_hyperparams`).
BUILTIN_VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "vaco": ("vaco", {}),
    "lagged_ppo": ("lagged_ppo", {}),
    "vaco_align_only": ("vaco", {"policy_loss": "clip"}),
    "vaco_filter_only": ("vaco", {"advantage_estimator": "gae"}),
    "vaco_paper": (
        "vaco",
        {"tv_reference": "behavior", "tv_threshold": 0.2, "value_target": "vtrace", "ratio_bound": None},
    ),
    "spo": ("vaco", {"policy_loss": "spo", "advantage_estimator": "gae"}),
    "ppo_kl": ("vaco", {"policy_loss": "kl", "advantage_estimator": "gae"}),
}
CLIP_RANGE_LOSSES = ("clip", "spo")
_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.+=-]+$")
_RELATIVE_VALUE = re.compile(r"^x(\d+(?:\.\d*)?|\.\d+)$")
SWEEP_TV_THRESHOLDS = (0.025, 0.05, 0.1, 0.2)
SWEEP_RHO_BARS = (0.5, 1.0, 2.0)


@dataclass(frozen=True)
class Preset:
    """A named grid. Axis order is run order inside a seed: put cheap and informative entries first."""

    description: str
    envs: tuple[str, ...]
    variants: tuple[str, ...]
    lags: tuple[str, ...]
    seeds: tuple[int, ...]
    n_timesteps: int
    eval_freq: int
    updates: tuple[str, ...] = (BASE_UPDATE,)


PRESETS: dict[str, Preset] = {
    "demo": Preset(
        "README demo: VACO vs LaggedPPO on Hopper-v5 without and with lag",
        envs=("Hopper-v5",),
        variants=("vaco", "lagged_ppo"),
        lags=("0", "4"),
        seeds=(0, 1),
        n_timesteps=50_000,
        eval_freq=10_000,
    ),
    "main": Preset(
        "Main comparison: VACO (defaults, and the paper's rule) vs LaggedPPO across lags on three MuJoCo tasks",
        envs=("InvertedPendulum-v5", "Hopper-v5", "HalfCheetah-v5"),
        variants=("vaco", "vaco_paper", "lagged_ppo"),
        lags=("0", "4", "16"),
        seeds=tuple(range(5)),
        n_timesteps=300_000,
        eval_freq=20_000,
    ),
    "lag_range": Preset(
        "Per-env random staleness (each env draws its lag in 0..8 per rollout), the main comparison's tasks",
        envs=("InvertedPendulum-v5", "Hopper-v5", "HalfCheetah-v5"),
        variants=("vaco", "lagged_ppo"),
        lags=("0-8",),
        seeds=tuple(range(5)),
        n_timesteps=300_000,
        eval_freq=20_000,
    ),
    "ablations": Preset(
        "Baselines and ablations (method doc): realignment only, filter only, SPO, PPO-KL; VACO and LaggedPPO are the "
        "main grid's (analyze.py results/ablations results/main)",
        envs=("HalfCheetah-v5",),
        variants=("vaco_align_only", "vaco_filter_only", "spo", "ppo_kl"),
        lags=("0", "4"),
        seeds=tuple(range(5)),
        n_timesteps=300_000,
        eval_freq=20_000,
    ),
    "sweep": Preset(
        "TV budget δ × truncation ρ̄ sweep of VACO (ρ̄ of V-trace and of the decoupled filter's weight min(ρ̄, π_T/μ)); "
        "LaggedPPO is the main grid's (analyze.py results/sweep results/main)",
        envs=("HalfCheetah-v5",),
        variants=tuple(
            f"vaco:tv_threshold={delta},vtrace_rho_bar={rho},pg_rho_bar={rho}"
            for delta in SWEEP_TV_THRESHOLDS
            for rho in SWEEP_RHO_BARS
        ),
        lags=("0", "4"),
        seeds=tuple(range(5)),
        n_timesteps=300_000,
        eval_freq=20_000,
    ),
    "update_freq": Preset(
        "Forward lag: more gradient steps per update (twice the epochs, half the minibatch)",
        envs=("Hopper-v5",),
        variants=("vaco", "lagged_ppo"),
        lags=("0", "4"),
        seeds=tuple(range(5)),
        n_timesteps=300_000,
        eval_freq=20_000,
        updates=(BASE_UPDATE, "epochs2x:n_epochs=x2", "batch_half:batch_size=x0.5"),
    ),
}


@dataclass(frozen=True)
class Variant:
    """An algorithm variant: a zoo algo with hyperparameters on top of its YAML entry."""

    name: str
    algo: str
    hyperparams: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class UpdateSetting:
    """A point on the update-frequency axis: hyperparameters applied to every variant; ``xF`` scales the YAML value."""

    label: str
    hyperparams: dict[str, Any] = field(default_factory=dict)


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


def _parse_assignments(text: str) -> dict[str, str]:
    """``"a=1,b=x"`` → ``{"a": "1", "b": "x"}`` (values still text)."""
    assignments: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"Expected KEY=VALUE, got {item!r}")
        assignments[key.strip()] = value.strip()
    return assignments


def _parse_value(text: str) -> Any:
    """A command-line value as YAML would read it, and ``1e-3`` as a float (PyYAML reads it as a string)."""
    value = yaml.safe_load(text)
    if isinstance(value, str):
        try:
            return float(text)
        except ValueError:
            return value
    return value


def _check_name(name: str) -> str:
    if not _NAME_PATTERN.match(name):
        raise ValueError(f"Names become folder names: use letters, digits and _.+=- only, got {name!r}")
    return name


def parse_variant(spec: str) -> Variant:
    """
    ``[NAME=]BASE[:KEY=VALUE,...]``: a built-in variant (or zoo algo) with extra hyperparameters.
    Values are parsed as YAML (``0.05``, ``1e-3``, ``learner``, ``true``, ``lin_0.2``) and cannot contain commas.
    Without a NAME the variant is named ``BASE+KEY=VALUE+...``: ``vaco:tv_threshold=0.05`` → ``vaco+tv_threshold=0.05``.
    """
    head, _, params = spec.partition(":")
    name, sep, base = head.partition("=")
    if not sep:
        name, base = "", head
    base = base.strip()
    if base not in BUILTIN_VARIANTS:
        raise ValueError(f"Unknown variant {base!r} in {spec!r}; built-in variants: {', '.join(BUILTIN_VARIANTS)}")
    algo, hyperparams = BUILTIN_VARIANTS[base]
    assignments = _parse_assignments(params)
    if not name:
        name = base + "".join(f"+{key}={value}" for key, value in assignments.items())
    extra = {key: _parse_value(value) for key, value in assignments.items()}
    return Variant(name=_check_name(name.strip()), algo=algo, hyperparams={**hyperparams, **extra})


def parse_update(spec: str) -> UpdateSetting:
    """``LABEL[:KEY=VALUE,...]``; a value ``xF`` multiplies the env's YAML value by F (``n_epochs=x2``)."""
    label, _, params = spec.partition(":")
    hyperparams: dict[str, Any] = {}
    for key, value in _parse_assignments(params).items():
        hyperparams[key] = value if _RELATIVE_VALUE.match(value) else _parse_value(value)
    if label.strip() == BASE_UPDATE and hyperparams:
        raise ValueError(f"The update setting {BASE_UPDATE!r} means the YAML values; give another label to {spec!r}")
    return UpdateSetting(label=_check_name(label.strip()), hyperparams=hyperparams)


def parse_seeds(items: Sequence[str]) -> tuple[int, ...]:
    """Seeds as ints and inclusive ranges: ``["0-2", "7"]`` → ``(0, 1, 2, 7)``."""
    seeds: list[int] = []
    for item in items:
        low, sep, high = item.partition("-")
        seeds.extend(range(int(low), int(high) + 1) if sep else [int(low)])
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"Repeated seed in {list(items)}")
    return tuple(seeds)


def constructor_parameters(cls: type) -> dict[str, inspect.Parameter]:
    """Named constructor arguments of ``cls``, along its class hierarchy (``LaggedPPO`` → ``PPO`` → ...)."""
    parameters: dict[str, inspect.Parameter] = {}
    for klass in cls.__mro__:
        if "__init__" in vars(klass):
            for name, parameter in inspect.signature(vars(klass)["__init__"]).parameters.items():
                if parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD) and name != "self":
                    parameters.setdefault(name, parameter)
    return parameters


def _constructor_default(algo: str, key: str) -> Any:
    """Default of constructor argument ``key`` of the zoo algo."""
    from sb3_vaco.zoo import ZOO_ALGOS

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


def variant_hyperparams(variant: Variant, update: UpdateSetting, env_id: str) -> dict[str, Any]:
    """
    The hyperparameters a run hands to the zoo on top of the YAML entry: the variant's, then the update setting's
    (``xF`` resolved against the YAML value or the constructor default). A VACO policy loss that uses ``clip_range``
    takes the env's value from ``lagged_ppo.yml`` (PPO's tuned clip) when the variant does not set it.
    """
    entry = zoo_entry(variant.algo, env_id)
    hyperparams = dict(variant.hyperparams)
    if variant.algo == "vaco" and hyperparams.get("policy_loss") in CLIP_RANGE_LOSSES and "clip_range" not in hyperparams:
        ppo_clip_range = zoo_entry("lagged_ppo", env_id).get("clip_range")
        if ppo_clip_range is not None:
            hyperparams["clip_range"] = ppo_clip_range
    for key, value in update.hyperparams.items():
        relative = _RELATIVE_VALUE.match(value) if isinstance(value, str) else None
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
    All runs, in run order: seed-major (seed 0 of every cell before seed 1), then env, lag, update and variant in the
    order given, so a partly finished grid already covers every cell.

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


def _eval_curve(model: Any, eval_callback: EvalCallback, spec: RunSpec) -> dict[str, list]:
    """The eval callback's evaluations, plus a last one at the end of training if the schedule did not hit it."""
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import sync_envs_normalization

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
    return {
        "timesteps": timesteps,
        "mean_return": [float(np.mean(r)) for r in returns],
        "std_return": [float(np.std(r)) for r in returns],
        "mean_ep_length": [float(np.mean(lengths_)) for lengths_ in lengths],
        "returns": returns,
    }


def train_and_evaluate(spec: RunSpec, scratch: Path) -> tuple[dict[str, Any], list[dict[str, float]]]:
    """Train one run through the zoo's ExperimentManager in ``scratch``; return the result record and progress rows."""
    import gymnasium as gym

    from sb3_vaco.zoo import HYPERPARAMS_DIR, register_algos
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
        config=str(HYPERPARAMS_DIR / f"{spec.algo}.yml"),
    )
    setup = manager.setup_experiment()
    assert setup is not None
    model, zoo_hyperparams = setup
    recorder = ProgressRecorder()
    manager.callbacks.append(recorder)
    eval_callback = next(callback for callback in manager.callbacks if isinstance(callback, EvalCallback))
    learn_start = time.perf_counter()
    manager.learn(model)
    learn_time = time.perf_counter() - learn_start
    if model.num_timesteps < spec.n_timesteps:
        # The zoo's learn() swallows KeyboardInterrupt: an interrupted run must not be recorded as finished.
        raise RuntimeError(f"Training stopped at {model.num_timesteps} of {spec.n_timesteps} steps")
    curve = _eval_curve(model, eval_callback, spec)
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
    ``progress.csv`` and, last, ``result.json`` atomically. A failure leaves ``error.log`` and no result.
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


def _select(preset: Preset | None, value: Any, attribute: str, default: Any) -> Any:
    """A command-line axis wins over the preset's; without either, the default."""
    if value is not None:
        return value
    return getattr(preset, attribute) if preset is not None else default


def grid_from_args(args: argparse.Namespace) -> tuple[list[RunSpec], Path]:
    """The runs and output folder described by the command line (a preset, with any axis overridden)."""
    preset = PRESETS[args.preset] if args.preset else None
    envs = _select(preset, args.envs, "envs", None)
    if not envs:
        raise SystemExit("Give --preset or --envs")
    out_dir = Path(args.out) if args.out else REPO_ROOT / "results" / (args.preset or "custom")
    context = {"preset": args.preset, "command": command_line(), "git": git_revision()}
    runs = build_grid(
        envs=envs,
        variants=[parse_variant(spec) for spec in _select(preset, args.variants, "variants", ("vaco", "lagged_ppo"))],
        lags=_select(preset, args.lags, "lags", ("0",)),
        updates=[parse_update(spec) for spec in _select(preset, args.updates, "updates", (BASE_UPDATE,))],
        seeds=_select(preset, parse_seeds(args.seeds) if args.seeds else None, "seeds", (0,)),
        out_dir=out_dir,
        n_timesteps=_select(preset, args.n_timesteps, "n_timesteps", None),
        eval_freq=_select(preset, args.eval_freq, "eval_freq", 10_000),
        n_eval_episodes=args.n_eval_episodes,
        context=context,
    )
    return runs, out_dir


def print_dry_run(runs: Iterable[RunSpec]) -> None:
    """List the runs in run order with their status and the hyperparameters handed to the zoo."""
    runs = list(runs)
    done = sum(run.result_path.exists() for run in runs)
    for index, run in enumerate(runs, start=1):
        status = "done" if run.result_path.exists() else "todo"
        print(f"{index:4d} [{status}] {run.run_id}  algo={run.algo} steps={run.n_timesteps} params={run.hyperparams}")
    todo_steps = sum(run.n_timesteps for run in runs if not run.result_path.exists())
    print(f"{len(runs)} runs, {done} done, {len(runs) - done} to run ({todo_steps:,} env steps)")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), help="a named grid; the axis options below override its axes")
    parser.add_argument("--envs", nargs="+", help="env ids (keys of the shipped YAML files, else their `default`)")
    parser.add_argument(
        "--variants",
        nargs="+",
        help=f"[NAME=]BASE[:KEY=VALUE,...], BASE one of {', '.join(BUILTIN_VARIANTS)} (default: vaco lagged_ppo)",
    )
    parser.add_argument("--lags", nargs="+", help="lag settings: K (e.g. 4) or K_min-K_max (e.g. 0-8) (default: 0)")
    parser.add_argument("--updates", nargs="+", help="LABEL[:KEY=VALUE,...], VALUE xF scales the YAML value (default: base)")
    parser.add_argument("--seeds", nargs="+", help="seeds and inclusive ranges, e.g. 0-4 (default: 0)")
    parser.add_argument("--n-timesteps", type=int, help="training steps per run (default: the YAML entry's n_timesteps)")
    parser.add_argument("--eval-freq", type=int, help="evaluate every N env steps (default: 10000)")
    parser.add_argument("--n-eval-episodes", type=int, default=10, help="deterministic eval episodes per evaluation")
    parser.add_argument("--out", help="output folder (default: results/<preset>, or results/custom)")
    parser.add_argument("--workers", type=int, default=2, help="parallel runs (capped at the number of CPU cores)")
    parser.add_argument("--dry-run", action="store_true", help="list the runs and their status, run nothing")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be >= 1")
    if args.eval_freq is not None and args.eval_freq < 1:
        parser.error("--eval-freq must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    runs, out_dir = grid_from_args(args)
    if args.dry_run:
        print_dry_run(runs)
        return 0
    workers = min(args.workers, os.cpu_count() or 1)
    start = time.perf_counter()
    try:
        outcomes = run_grid(runs, workers)
    except KeyboardInterrupt:
        return 130
    failed = [outcome for outcome in outcomes if not outcome.ok]
    print(f"Finished {len(outcomes) - len(failed)} run(s) in {time.perf_counter() - start:.0f} s; results in {out_dir}")
    for outcome in failed:
        print(f"FAILED {outcome.run_id}: {outcome.message} (see its {ERROR_FILE}; rerun to retry)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
