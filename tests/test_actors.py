"""Asynchronous actors (process and Ray backends): training, measured lag, faults, shutdown, settings."""

import json
import math
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from conftest import TINY as SHARED_TINY
from stable_baselines3.common.callbacks import BaseCallback, CheckpointCallback, EvalCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.logger import configure
from stable_baselines3.common.vec_env import VecFrameStack, VecNormalize

from sb3_vaco import VACO, LaggedPPO
from sb3_vaco.actors.base import ActorStartupError
from sb3_vaco.actors.worker import load_payload, make_payload

TINY = {**SHARED_TINY, "batch_size": 32, "seed": 0}  # one minibatch per segment of 32 steps
ACTORS = dict(n_actors=2, actor_backend_kwargs=dict(n_envs_per_actor=2))
UNPICKLABLE = threading.Lock()
LAG_KEYS = (
    "rollout/policy_lag_mean",
    "rollout/policy_lag_max",
    "rollout/policy_lag_grad_steps_mean",
    "rollout/policy_version",
)


def process_alive(pid: int) -> bool:
    try:
        import psutil

        return psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except ImportError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    except Exception:  # psutil.NoSuchProcess between the two calls
        return False


def assert_all_exited(pids, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while any(process_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in pids if process_alive(pid)], "actor processes survived"


class Recorder(BaseCallback):
    """Per rollout: the buffer's behavior versions, the learner's version, the logged values and the actors' pids."""

    def __init__(self, action=None) -> None:
        super().__init__()
        self.action = action  # called at each rollout end with the recorder, may return False to stop
        self.versions: list[np.ndarray] = []
        self.learner_versions: list[int] = []
        self.logged: list[dict] = []
        self.pids: set[int] = set()

    def _on_rollout_end(self) -> None:
        self.versions.append(self.model.rollout_buffer.behavior_versions.copy())
        self.learner_versions.append(self.model._actors.version)
        self.logged.append(dict(self.model.logger.name_to_value))
        self.pids.update(self.model._actors.pids().values())
        self.stop = self.action is not None and self.action(self) is False

    def _on_step(self) -> bool:
        return not getattr(self, "stop", False)


def learn_recorded(model, total_timesteps: int, action=None) -> Recorder:
    recorder = Recorder(action)
    model.set_logger(configure(None, [""]))
    model.learn(total_timesteps, callback=recorder)
    assert not model._actors.running, "learn() shuts the actors down"
    assert_all_exited(recorder.pids)
    return recorder


def assert_real_lag(recorder: Recorder) -> None:
    stale = [np.any(v != learner) for v, learner in zip(recorder.versions, recorder.learner_versions, strict=True)]
    assert any(stale), "some samples must come from an older version than the learner's"
    for logged, versions, learner in zip(recorder.logged, recorder.versions, recorder.learner_versions, strict=True):
        assert all(key in logged for key in LAG_KEYS)
        assert logged["rollout/policy_version"] == learner
        assert logged["rollout/policy_lag_max"] == learner - versions.min()
        assert np.all(versions <= learner)


# ---------------------------------------------------------------------------------------------------------------------
# Process backend


@pytest.mark.parametrize("algo", [VACO, LaggedPPO])
def test_process_actors_train_with_real_lag(algo):
    model = algo("MlpPolicy", "CartPole-v1", **TINY, **ACTORS)
    assert model.rollout_buffer.n_envs == 4 and model.n_envs == 4
    recorder = learn_recorded(model, 1024)
    assert model.num_timesteps == 1024
    assert_real_lag(recorder)
    assert recorder.logged[-1]["rollout/actor_restarts"] == 0
    assert "train/tv_behavior" in model.logger.name_to_value
    assert len(model.ep_info_buffer) > 0, "Monitor episode infos reach the learner"
    assert mp.active_children() == []


def test_lambda_env_factory_truncations_and_gsde():
    """A cloudpickled lambda builds the actors' envs (with a short time limit: truncations reach the buffer)."""
    env = make_vec_env("Pendulum-v1", n_envs=1)
    settings = dict(env_fn=lambda: gym.make("Pendulum-v1", max_episode_steps=20), n_envs_per_actor=1)
    model = VACO("MlpPolicy", env, n_actors=2, actor_backend_kwargs=settings, use_sde=True, sde_sample_freq=4, **TINY)
    truncations = []
    learn_recorded(model, 256, action=lambda r: truncations.append(len(r.model.rollout_buffer.truncation_observations)))
    assert sum(truncations) > 0
    assert all(th.all(th.isfinite(p)) for p in model.policy.parameters())


def test_vecnormalize_statistics_are_the_learners():
    """Actors normalize with the learner's published statistics; the learner's VecNormalize counts every transition."""
    env = VecNormalize(make_vec_env("Pendulum-v1", n_envs=1, seed=0))
    model = LaggedPPO("MlpPolicy", env, n_actors=2, actor_backend_kwargs=dict(env_fn="Pendulum-v1"), **TINY)
    learn_recorded(model, 256)
    # + the learner env's own reset observation and the initial epsilon count
    assert env.obs_rms.count == pytest.approx(256 + 1, abs=0.01)
    assert env.ret_rms.count == pytest.approx(256, abs=0.01)
    assert np.abs(model.rollout_buffer.observations).max() <= env.clip_obs


def test_killed_actor_is_replaced():
    killed: list[int] = []

    def kill_one(recorder: Recorder):
        if len(recorder.versions) == 2:
            killed.append(recorder.model._actors.pids()[0])
            os.kill(killed[0], signal.SIGKILL)

    model = VACO("MlpPolicy", "CartPole-v1", **TINY, **ACTORS)
    with pytest.warns(RuntimeWarning, match="replacement"):
        recorder = learn_recorded(model, 1024, action=kill_one)
    assert recorder.logged[-1]["rollout/actor_restarts"] >= 1
    assert killed and killed[0] in recorder.pids and len(recorder.pids) >= 3
    assert model.num_timesteps == 1024


def test_hung_actor_is_replaced():
    """SIGSTOP an actor: no sign of life for actor_timeout seconds, so it is killed and replaced."""
    stopped: list[int] = []

    def stop_one(recorder: Recorder):
        if len(recorder.versions) == 2:
            stopped.append(recorder.model._actors.pids()[0])
            os.kill(stopped[0], signal.SIGSTOP)
            recorder.stopped_at = time.monotonic()
        if stopped:
            if recorder.model._actors.restarts >= 1:
                return False  # done: it was replaced
            assert time.monotonic() - recorder.stopped_at < 30, "the stopped actor was never replaced"

    settings = dict(n_envs_per_actor=2, actor_timeout=1.0, delay=0.01)
    model = VACO("MlpPolicy", "CartPole-v1", n_actors=2, actor_backend_kwargs=settings, **TINY)
    with pytest.warns(RuntimeWarning, match="hung"):
        recorder = learn_recorded(model, 10**6, action=stop_one)
    assert stopped[0] in recorder.pids and not process_alive(stopped[0])


@pytest.mark.parametrize("error", [ZeroDivisionError, KeyboardInterrupt])
def test_exception_or_ctrl_c_shuts_actors_down(error):
    pids: list[int] = []

    def fail(recorder: Recorder):
        pids.extend(recorder.model._actors.pids().values())
        raise error

    model = VACO("MlpPolicy", "CartPole-v1", **TINY, **ACTORS)
    with pytest.raises(error):
        model.learn(1024, callback=Recorder(fail))
    assert not model._actors.running and len(pids) == 2
    assert_all_exited(pids)
    assert mp.active_children() == []


def test_error_in_actor_is_raised_in_the_learner():
    settings = dict(env_fn=lambda: gym.make("NoSuchEnv-v0"))
    model = VACO("MlpPolicy", "CartPole-v1", n_actors=1, actor_backend_kwargs=settings, **TINY)
    with pytest.raises(RuntimeError, match="Actor 0 failed"):
        model.learn(64)
    assert mp.active_children() == []


def exit_at_construction():
    os._exit(3)  # an actor process that dies before its first segment, as one without the __main__ guard does


def test_actor_dying_before_its_first_segment_fails_fast():
    """Not replaced max_restarts times: one prompt error naming the likely cause (the script's main guard)."""
    settings = dict(env_fn=exit_at_construction, startup_timeout=60.0)
    model = VACO("MlpPolicy", "CartPole-v1", n_actors=2, actor_backend_kwargs=settings, **TINY)
    start = time.monotonic()
    with warnings.catch_warnings(record=True) as caught, pytest.raises(ActorStartupError, match="__main__") as error:
        warnings.simplefilter("always")
        model.learn(64)
    assert time.monotonic() - start < 30
    assert "exit code 3" in str(error.value) and "max_restarts" not in str(error.value)
    assert not [w for w in caught if "replacement" in str(w.message)], "no actor was replaced"
    assert not model._actors.running and mp.active_children() == []


def test_published_parameters_load_from_read_only_arrays_without_warning():
    """Ray hands the actors the published payload as read-only arrays: loading it must not warn (th.as_tensor would)."""
    source, target = (VACO("MlpPolicy", "CartPole-v1", **{**TINY, "seed": seed}).policy for seed in (0, 1))
    payload = make_payload(source, None)
    for array in payload.values():
        array.setflags(write=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_payload(payload, target, None)
    assert all(th.equal(a, b) for a, b in zip(source.state_dict().values(), target.state_dict().values(), strict=True))


def test_callbacks_count_transitions(tmp_path):
    """EvalCallback / CheckpointCallback / progress bar see num_timesteps advance by the transitions received."""

    class StopAt(BaseCallback):
        def _on_step(self) -> bool:
            return self.num_timesteps < 384

    model = LaggedPPO("MlpPolicy", "CartPole-v1", **TINY, **ACTORS)
    eval_callback = EvalCallback(
        make_vec_env("CartPole-v1", n_envs=1), eval_freq=32, n_eval_episodes=1, log_path=str(tmp_path)
    )
    checkpoint = CheckpointCallback(save_freq=64, save_path=str(tmp_path))
    model.learn(10_000, callback=[eval_callback, checkpoint, StopAt()], progress_bar=True)
    assert model.num_timesteps == 384, "on_step() once per step row of n_envs = 4 transitions; False stops training"
    assert len(np.load(tmp_path / "evaluations.npz")["timesteps"]) == 384 // (32 * 4)
    assert sorted(p.name for p in tmp_path.glob("rl_model_*")) == ["rl_model_256_steps.zip"]


def test_save_load_excludes_the_actors(tmp_path):
    model = VACO("MlpPolicy", "CartPole-v1", **TINY, **ACTORS).learn(128)
    model.save(tmp_path / "model")
    loaded = VACO.load(tmp_path / "model", env=make_vec_env("CartPole-v1", n_envs=1))
    assert loaded.n_actors == 2 and not loaded._actors.running and loaded.rollout_buffer.n_envs == 4
    loaded.learn(128, reset_num_timesteps=False)
    assert loaded.num_timesteps == 256
    synchronous = VACO.load(tmp_path / "model", env=make_vec_env("CartPole-v1", n_envs=1), n_actors=0)
    assert synchronous.rollout_buffer.n_envs == 1 and synchronous._actors is None
    synchronous.learn(64)


def test_no_actors_is_unchanged():
    runs = [
        VACO("MlpPolicy", "CartPole-v1", **TINY).learn(256),
        VACO("MlpPolicy", "CartPole-v1", n_actors=0, actor_backend="ray", actor_backend_kwargs={"delay": 1.0}, **TINY).learn(
            256
        ),
    ]
    for a, b in zip(runs[0].policy.parameters(), runs[1].policy.parameters(), strict=True):
        assert th.equal(a, b)
    assert runs[1]._actors is None


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(n_actors=-1), "n_actors"),
        (dict(n_actors=True), "n_actors"),
        (dict(n_actors=2, actor_backend="mpi"), "actor_backend"),
        (dict(n_actors=2, actor_backend_kwargs={"n_env_per_actor": 2}), "unknown key"),
        (dict(n_actors=2, actor_backend_kwargs={"address": "auto"}), "unknown key"),
        (dict(n_actors=2, actor_backend_kwargs={"delay": (0.2, 0.1)}), "delay"),
        (dict(n_actors=2, actor_backend_kwargs={"n_envs_per_actor": 0}), "n_envs_per_actor"),
        (dict(n_actors=2, actor_backend_kwargs={"actor_timeout": 0}), "actor_timeout"),
        (dict(n_actors=2, actor_backend_kwargs={"start_method": "fork"}), "start_method"),
        (dict(n_actors=2, policy_lag=1), "policy_lag"),
        (dict(n_actors=2, env=make_vec_env("CartPole-v1")), "env id"),
        (dict(n_actors=2, actor_backend_kwargs={"env_fn": lambda: UNPICKLABLE}), "cannot be pickled"),
        (
            dict(
                n_actors=2, env=VecFrameStack(make_vec_env("CartPole-v1"), 2), actor_backend_kwargs={"env_fn": "CartPole-v1"}
            ),
            "VecFrameStack",
        ),
        (dict(n_actors=2, batch_size=1024), "batch_size"),
    ],
)
def test_invalid_actor_settings_name_the_parameter(kwargs, match):
    env = kwargs.pop("env", "CartPole-v1")
    for algo in (VACO, LaggedPPO):
        if algo is LaggedPPO and match == "batch_size":
            continue  # PPO only warns about batch_size
        with pytest.raises(ValueError, match=match):
            algo("MlpPolicy", env, **{**TINY, **kwargs})


def test_throughput_script_quick_mode(tmp_path):
    """scripts/actors_throughput.py's small-budget mode runs end to end and writes the table (no speed is checked)."""
    script = Path(__file__).resolve().parents[1] / "scripts" / "actors_throughput.py"
    command = [sys.executable, str(script), "throughput", "--quick", "--cases", "latency", "--latency-ms", "1"]
    command += ["--counts", "1", "2", "--methods", "ppo", "process", "--rollouts", "3", "--out", str(tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(command, cwd=script.parents[1], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    report = json.loads((tmp_path / "throughput.json").read_text())
    rows = report["rows"]
    assert [(row["case"], row["n"], row["method"]) for row in rows] == [
        ("latency-1ms", n, method) for n in (1, 2) for method in ("ppo", "process")
    ]
    common = {"case", "env", "latency_ms", "n", "method", "steps_per_s", "startup_s", "wall_s", "timesteps", "rollouts"}
    actors = {"lag_mean", "lag_max", "lag_versions", "learner_idle", "actor_idle", "actor_collect_s"}
    for row in rows:
        assert "error" not in row and common <= set(row)
        assert row["timesteps"] == 3 * 32 * row["n"] and row["rollouts"] == 3  # --quick: n_steps 32
        assert math.isfinite(row["steps_per_s"]) and math.isfinite(row["startup_s"])
        if row["method"] == "process":
            assert actors <= set(row)
            # the distribution covers every buffer column of the rollouts after the first
            assert sum(row["lag_versions"].values()) == 2 * row["n"]
            assert 0.0 <= row["learner_idle"] <= 1.0 and 0.0 <= row["actor_idle"] <= 1.0
        else:
            assert not actors & set(row)
    assert {"machine", "load_average_before", "load_average_after", "commit", "command", "cases"} <= set(report)

    markdown = (tmp_path / "throughput.md").read_text()
    columns = ["case", "N", "method", "steps/s", "vs PPO", "start-up (s)", "lag mean", "lag: versions (columns)"]
    header = "| " + " | ".join([*columns, "learner idle", "actors idle"]) + " |"
    assert header in markdown and header in run.stdout
    table = markdown[markdown.index(header) :].splitlines()
    assert len([line for line in table[2:] if line.startswith("| latency-1ms |")]) == 4
    assert all(line.count("|") == header.count("|") for line in table[2:6])


# ---------------------------------------------------------------------------------------------------------------------
# Ray backend (local, 127.0.0.1 only)


@pytest.fixture
def ray_env(monkeypatch):
    ray = pytest.importorskip("ray")
    # Listen on 127.0.0.1 only: the variable for Ray's own processes, the constant it set when `ray` was imported
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    monkeypatch.setattr(ray._private.ray_constants, "ENABLE_RAY_CLUSTER", False)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # no token written under the home folder
    temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    yield dict(num_cpus=2, ray_init_kwargs={"_temp_dir": temp_dir, "log_to_driver": False})
    ray.shutdown()
    shutil.rmtree(temp_dir, ignore_errors=True)


def test_ray_actors_train_with_real_lag_and_shut_down(ray_env):
    import ray

    settings = dict(n_envs_per_actor=2, **ray_env)
    model = VACO("MlpPolicy", "CartPole-v1", n_actors=2, actor_backend="ray", actor_backend_kwargs=settings, **TINY)
    recorder = learn_recorded(model, 1024)
    assert model.num_timesteps == 1024
    assert_real_lag(recorder)
    assert len(model.ep_info_buffer) > 0
    assert not ray.is_initialized(), "the backend shuts down the Ray it started"


@pytest.mark.slow
def test_ray_killed_actor_is_replaced(ray_env):
    killed: list[int] = []

    def kill_one(recorder: Recorder):
        if len(recorder.versions) == 3:
            killed.append(recorder.model._actors.pids()[0])
            os.kill(killed[0], signal.SIGKILL)

    settings = dict(n_envs_per_actor=2, **ray_env)
    model = LaggedPPO("MlpPolicy", "CartPole-v1", n_actors=2, actor_backend="ray", actor_backend_kwargs=settings, **TINY)
    with pytest.warns(RuntimeWarning, match="replacement"):
        recorder = learn_recorded(model, 1536, action=kill_one)
    assert model.num_timesteps == 1536
    assert recorder.logged[-1]["rollout/actor_restarts"] >= 1 and killed[0] in recorder.pids
