"""
RL Zoo / Optuna integration, end to end through the command line (``python -m sb3_vaco.zoo ...``).

Every command runs in a subprocess: ``import rl_zoo3`` patches gymnasium's TimeLimit globally, which must not leak
into the other tests of the session. Tiny budgets, one torch thread.
"""

import csv
import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from sb3_vaco.zoo import HYPERPARAMS_DIR

ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "MPLBACKEND": "Agg",
    "MUJOCO_GL": "egl",
    "PYOPENGL_PLATFORM": "egl",
    "SDL_VIDEODRIVER": "dummy",
    "PYTHONWARNINGS": "ignore",
}
CARTPOLE_PARAMS = [
    "n_steps:16",
    "n_epochs:2",
    "batch_size:64",
    "tv_threshold:lin_0.3",
    "tv_reference:behavior",
    "vtrace_rho_bar:2.0",
    "vtrace_c_bar:0.5",
    "policy_lag:2",
]
MUJOCO_ENVS = (
    "Hopper-v5",
    "HalfCheetah-v5",
    "Walker2d-v5",
    "Ant-v5",
    "Swimmer-v5",
    "Reacher-v5",
    "InvertedPendulum-v5",
    "InvertedDoublePendulum-v5",
    "Humanoid-v5",
)
CLASSIC_ENVS = ("CartPole-v1", "Pendulum-v1", "Acrobot-v1", "MountainCarContinuous-v0", "LunarLander-v3")


def run(cwd: Path, *args: str, check: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m sb3_vaco.zoo <args>`` in ``cwd`` (with the environment variables ``env``, by default ``ENV``)."""
    result = subprocess.run(
        [sys.executable, "-m", "sb3_vaco.zoo", *args], cwd=cwd, env=ENV if env is None else env, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    if check:
        assert result.returncode == 0, f"{args} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def run_python(cwd: Path, code: str) -> str:
    """Run a Python snippet in a subprocess (it may import rl_zoo3) and return its stdout."""
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, f"snippet failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


def load_yaml(path: Path) -> Any:
    with open(path) as file:
        return yaml.load(file, Loader=yaml.UnsafeLoader)  # config.yml is an OrderedDict dump


def run_folders(logs: Path) -> list[str]:
    return sorted(str(path.relative_to(logs)) for path in logs.glob("*/*_[0-9]*") if path.is_dir())


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Train VACO on CartPole-v1 and InvertedPendulum-v5 and LaggedPPO on CartPole-v1, with tiny budgets."""
    root = tmp_path_factory.mktemp("zoo")
    common = ["--num-threads", "1", "--seed", "3", "--eval-episodes", "2", "-f", "logs"]
    run(root, "train", "--algo", "vaco", "--env", "CartPole-v1", "-n", "512", "--eval-freq", "128", *common,
        "-params", *CARTPOLE_PARAMS)  # fmt: skip
    run(root, "train", "--algo", "vaco", "--env", "InvertedPendulum-v5", "-n", "256", "--eval-freq", "128", *common,
        "-params", "n_steps:64", "batch_size:32", "n_epochs:2", "tv_threshold:0.1")  # fmt: skip
    run(root, "train", "--algo", "lagged_ppo", "--env", "CartPole-v1", "-n", "512", "--eval-freq", "128", *common,
        "-params", "n_steps:16", "n_epochs:2", "policy_lag:1")  # fmt: skip
    return root / "logs"


def test_train_writes_run_with_vaco_config(logs: Path) -> None:
    run_dir = logs / "vaco" / "CartPole-v1_1"
    assert (run_dir / "CartPole-v1.zip").is_file()
    assert (run_dir / "best_model.zip").is_file()
    config = load_yaml(run_dir / "CartPole-v1" / "config.yml")
    # -params override the shipped entry...
    assert config["tv_threshold"] == "lin_0.3"
    assert config["tv_reference"] == "behavior"
    assert config["vtrace_rho_bar"] == 2.0
    assert config["vtrace_c_bar"] == 0.5
    assert config["policy_lag"] == 2
    assert config["n_steps"] == 16
    # ...and the rest comes from the shipped vaco.yml, found without --conf-file
    shipped = yaml.safe_load((HYPERPARAMS_DIR / "vaco.yml").read_text())["CartPole-v1"]
    assert config["n_envs"] == shipped["n_envs"] == 8
    assert config["learning_rate"] == shipped["learning_rate"]
    args = load_yaml(run_dir / "CartPole-v1" / "args.yml")
    assert Path(args["conf_file"]) == HYPERPARAMS_DIR / "vaco.yml"
    assert args["algo"] == "vaco"

    evaluations = np.load(run_dir / "evaluations.npz")
    assert len(evaluations["timesteps"]) >= 2
    assert evaluations["results"].shape == (len(evaluations["timesteps"]), 2)

    mujoco_dir = logs / "vaco" / "InvertedPendulum-v5_1"
    assert (mujoco_dir / "InvertedPendulum-v5.zip").is_file()
    assert (mujoco_dir / "InvertedPendulum-v5" / "vecnormalize.pkl").is_file()  # normalize: true in the entry
    mujoco_config = load_yaml(mujoco_dir / "InvertedPendulum-v5" / "config.yml")
    assert mujoco_config["normalize"] is True
    assert mujoco_config["tv_threshold"] == 0.1
    assert mujoco_config["n_steps"] == 64
    assert len(np.load(mujoco_dir / "evaluations.npz")["timesteps"]) >= 1


def test_inherited_entries_drop_the_keys_listed_under_without(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sb3_vaco.zoo as zoo

    (tmp_path / "parent.yml").write_text("Env-v0: {n_steps: 64, tv_threshold: 0.3}\nOnly-v0: {gamma: 0.9}\n")
    (tmp_path / "child.yml").write_text(
        "inherit: {from: parent, without: [tv_threshold]}\nEnv-v0: {clip_range: 0.1}\nNew-v0: {n_steps: 8}\n"
    )
    monkeypatch.setattr(zoo, "HYPERPARAMS_DIR", tmp_path)
    assert zoo.load_entries("child") == {
        "Env-v0": {"n_steps": 64, "clip_range": 0.1},
        "Only-v0": {"gamma": 0.9},
        "New-v0": {"n_steps": 8},
    }


def test_baseline_trains_with_the_entries_it_inherits(tmp_path: Path) -> None:
    """`spo.yml` inherits vaco.yml's entries and adds PPO's clip range: the run's config holds both."""
    run(tmp_path, "train", "--algo", "spo", "--env", "CartPole-v1", "-n", "256", "--num-threads", "1", "--seed", "0",
        "-f", "logs", "-params", "n_steps:16", "batch_size:64", "n_epochs:1")  # fmt: skip
    run_dir = tmp_path / "logs" / "spo" / "CartPole-v1_1"
    assert (run_dir / "CartPole-v1.zip").is_file()
    config = load_yaml(run_dir / "CartPole-v1" / "config.yml")
    vaco_entry = yaml.safe_load((HYPERPARAMS_DIR / "vaco.yml").read_text())["CartPole-v1"]
    assert config["learning_rate"] == vaco_entry["learning_rate"] and config["n_envs"] == vaco_entry["n_envs"]
    assert config["clip_range"] == "lin_0.2"  # from spo.yml, PPO's tuned value
    assert "tv_threshold" not in config


def test_saved_models_load_as_their_class(logs: Path) -> None:
    out = run_python(
        logs,
        """
        import json
        from sb3_vaco.zoo import register_algos
        from rl_zoo3.utils import ALGOS
        register_algos()
        vaco = ALGOS["vaco"].load("vaco/CartPole-v1_1/CartPole-v1.zip")
        ppo = ALGOS["lagged_ppo"].load("lagged_ppo/CartPole-v1_1/CartPole-v1.zip")
        print(json.dumps({
            "vaco": type(vaco).__name__, "tv_reference": vaco.tv_reference, "policy_lag": vaco.policy_lag,
            "rho_bar": vaco.vtrace_rho_bar, "delta_start": vaco.tv_threshold(1.0), "delta_half": vaco.tv_threshold(0.5),
            "lagged_ppo": type(ppo).__name__, "ppo_lag": ppo.policy_lag,
        }))
        """,
    )
    loaded = json.loads(out.strip().splitlines()[-1])
    assert loaded["vaco"] == "VACO"
    assert loaded["tv_reference"] == "behavior"
    assert loaded["policy_lag"] == 2
    assert loaded["rho_bar"] == 2.0
    # tv_threshold: lin_0.3 is a linear schedule from 0.3 to 0
    assert loaded["delta_start"] == pytest.approx(0.3)
    assert loaded["delta_half"] == pytest.approx(0.15)
    assert loaded["lagged_ppo"] == "LaggedPPO"
    assert loaded["ppo_lag"] == 1


@pytest.mark.parametrize("env_id", ["CartPole-v1", "InvertedPendulum-v5"])
def test_enjoy(logs: Path, env_id: str) -> None:
    algo = "vaco"
    result = run(logs.parent, "enjoy", "--algo", algo, "--env", env_id, "-f", "logs", "--no-render", "-n", "300",
                 "--num-threads", "1")  # fmt: skip
    assert f"Loading logs/{algo}/{env_id}_1/{env_id}.zip" in result.stdout
    assert "Mean reward" in result.stdout


def test_record_video(logs: Path, tmp_path: Path) -> None:
    probe = subprocess.run(
        [sys.executable, "-c", "import gymnasium as gym; e = gym.make('InvertedPendulum-v5', render_mode='rgb_array'); "
         "e.reset(seed=0); assert e.render().shape[-1] == 3"],
        env=ENV, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if probe.returncode != 0:
        pytest.skip(f"MuJoCo offscreen rendering (MUJOCO_GL=egl) does not work here: {probe.stderr.strip()[-300:]}")
    run(logs.parent, "record_video", "--algo", "vaco", "--env", "InvertedPendulum-v5", "-f", "logs", "-n", "40",
        "-o", str(tmp_path / "videos"))  # fmt: skip
    videos = list((tmp_path / "videos").glob("*.mp4"))
    assert len(videos) == 1
    assert videos[0].name.startswith("final-model-vaco-InvertedPendulum-v5")
    assert videos[0].stat().st_size > 1000


def assert_image(path: Path, signature: bytes) -> None:
    assert path.is_file(), f"{path} was not written"
    assert path.read_bytes().startswith(signature), path
    assert path.stat().st_size > 5000, path  # a drawn figure, not an empty canvas


PNG, SVG = b"\x89PNG", b"<?xml"


def test_all_plots_and_plot_from_file(logs: Path, tmp_path: Path) -> None:
    """The plot commands on single runs, without a display: the figures are saved to files."""
    # As on a Linux server: no display, no backend chosen (the launcher picks Agg)
    unset = ("DISPLAY", "WAYLAND_DISPLAY", "MPLBACKEND") if sys.platform.startswith("linux") else ("DISPLAY",)
    headless = {key: value for key, value in ENV.items() if key not in unset}
    result = run(logs.parent, "all_plots", "-a", "vaco", "lagged_ppo", "-e", "CartPole", "InvertedPendulum", "-f", "logs",
                 "-o", str(tmp_path / "plots"), env=headless)  # fmt: skip
    assert "VACO" in result.stdout and "LAGGED_PPO" in result.stdout
    with open(tmp_path / "plots.pkl", "rb") as file:
        post_processed = pickle.load(file)
    evaluations = np.load(logs / "vaco" / "CartPole-v1_1" / "evaluations.npz")
    cartpole = post_processed["CartPole"]["VACO-logs"]
    np.testing.assert_array_equal(cartpole["timesteps"], evaluations["timesteps"])
    np.testing.assert_allclose(cartpole["mean"], evaluations["results"].mean(axis=1))
    assert "LAGGED_PPO-logs" in post_processed["CartPole"]
    assert "VACO-logs" in post_processed["InvertedPendulum"]
    # No display: one figure per env, in figures/ by default (the zoo alone would save none)
    for env in ("cartpole", "invertedpendulum"):
        assert_image(logs.parent / "figures" / f"all_plots-results_{env}.png", PNG)

    # plot_from_file on that output (one run per curve), with the zoo's -o and the launcher's --figure-dir.
    # --keep-envs: the zoo's plot_from_file needs every curve on every env it plots (lagged_ppo only ran CartPole)
    figures = tmp_path / "from_file"
    result = run(logs.parent, "plot_from_file", "-i", str(tmp_path / "plots"), "--keep-envs", "CartPole",
                 "-o", str(tmp_path / "sensitivity.png"), "--format", "png", "--figure-dir", str(figures),
                 "--figure-format", "svg", env=headless)  # fmt: skip
    assert "keys: ['VACO-logs', 'LAGGED_PPO-logs']" in result.stdout
    assert_image(tmp_path / "sensitivity.png", PNG)
    assert sorted(path.name for path in figures.iterdir()) == [
        "plot_from_file-results_cartpole.svg",
        "plot_from_file-sensitivity_plot.svg",
    ]
    for path in figures.iterdir():
        assert_image(path, SVG)

    # plot_train too; the zoo's own options pass through (--figsize is not taken for a --figure-* option)
    run(logs.parent, "plot_train", "-a", "vaco", "-e", "CartPole", "-f", "logs", "-w", "2", "--figsize", "5", "4",
        "--figure-dir", str(tmp_path / "train"))  # fmt: skip
    assert_image(tmp_path / "train" / "plot_train-training_episodic_reward.png", PNG)
    result = run(logs.parent, "all_plots", "-a", "vaco", "-e", "CartPole", "-f", "logs", "--figure-format", "jpg",
                 check=False)  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip() == "sb3-vaco all_plots: error: --figure-format must be one of png, svg, pdf, got 'jpg'"


def test_optimize_report_and_trial_reload(tmp_path: Path) -> None:
    storage = "optuna/study.log"
    run(tmp_path, "train", "--algo", "vaco", "--env", "CartPole-v1", "-optimize", "--n-trials", "2", "-n", "256",
        "--n-evaluations", "1", "--eval-episodes", "2", "--sampler", "tpe", "--pruner", "median", "--seed", "0",
        "--num-threads", "1", "--no-optim-plots", "--storage", storage, "--study-name", "test", "-f", "logs",
        "-params", "n_envs:1", "policy_lag:1")  # fmt: skip
    # The zoo's report, and no model-less run folder left behind by -optimize
    reports = list((tmp_path / "logs" / "vaco").glob("report_CartPole-v1_2-trials-256-tpe-median_*.csv"))
    assert len(reports) == 1
    with open(reports[0]) as file:
        trials = list(csv.DictReader(file))
    assert [trial["state"] for trial in trials] == ["COMPLETE", "COMPLETE"]
    assert {"params_tv_threshold", "params_vtrace_rho_bar", "params_vtrace_c_bar", "params_tv_reference"} <= set(trials[0])
    assert "params_clip_range" not in trials[0]
    assert run_folders(tmp_path / "logs") == []

    # The readable report
    run(tmp_path, "optuna_report", "--storage", storage, "--study-name", "test", "--algo", "vaco", "-o", "report/test")
    markdown = (tmp_path / "report" / "test.md").read_text()
    assert "Trials: 2 (2 complete)" in markdown
    assert "-optimize --n-trials 2" in markdown  # the exact command
    assert "## Best trial" in markdown and "tv_threshold:" in markdown

    # Reload trial 0's hyperparameters with --trial-id (0: which the zoo alone would silently skip)
    run(tmp_path, "train", "--algo", "vaco", "--env", "CartPole-v1", "--storage", storage, "--study-name", "test",
        "--trial-id", "0", "-n", "64", "--eval-freq", "-1", "--num-threads", "1", "-f", "logs",
        "-params", "n_envs:1", "policy_lag:1")  # fmt: skip
    config = load_yaml(tmp_path / "logs" / "vaco" / "CartPole-v1_1" / "CartPole-v1" / "config.yml")
    trial = trials[0]
    assert config["batch_size"] == 2 ** int(trial["params_batch_size_pow"])
    assert config["n_steps"] == 2 ** int(trial["params_n_steps_pow"])
    assert config["gamma"] == pytest.approx(1 - float(trial["params_one_minus_gamma"]))
    assert config["tv_threshold"] == float(trial["params_tv_threshold"])
    assert config["vtrace_rho_bar"] == float(trial["params_vtrace_rho_bar"])
    assert config["vtrace_c_bar"] == float(trial["params_vtrace_c_bar"])
    assert config["tv_reference"] == trial["params_tv_reference"]
    assert config["policy_lag"] == 1
    assert (tmp_path / "logs" / "vaco" / "CartPole-v1_1" / "CartPole-v1.zip").is_file()


def test_bad_input_fails_cleanly(logs: Path, tmp_path: Path) -> None:
    bad_yml = tmp_path / "bad.yml"
    bad_yml.write_text("Pendulum-v1:\n  policy: 'MlpPolicy'\n  n_timesteps: 100\n  tv_treshold: 0.1\n")
    before = run_folders(logs)
    # As a real command: exit code 2, one error line, no traceback
    result = run(logs.parent, "train", "--algo", "vaco", "--env", "Hoper-v5", "-f", "logs", check=False)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "sb3-vaco train: error: unknown environment id 'Hoper-v5': it is not registered in gymnasium. Did you mean Hopper-v5?"
    )
    # The other cases through main(argv), in one process to save start-up time
    cases = {
        "unknown key in YAML": (["--env", "Pendulum-v1", "-conf", str(bad_yml)], "unknown hyperparameter `tv_treshold`",
                                "Did you mean `tv_threshold`?"),
        "missing YAML entry": (["--env", "CartPole-v1", "-conf", str(bad_yml)], "no hyperparameters for CartPole-v1",
                               "no `default` entry"),
        "unknown -params key": (["--env", "CartPole-v1", "-params", "rho_bar:2.0"], "unknown hyperparameter `rho_bar`",
                                "(from -params)"),
        "zoo-set key": (["--env", "CartPole-v1", "-params", "seed:3"], "`seed` (from -params) is set by the zoo", "--seed"),
        "invalid value": (["--env", "CartPole-v1", "-params", "tv_reference:nearest"], "`tv_reference` must be one of",
                          "'decoupled'"),
        "bad schedule": (["--env", "CartPole-v1", "-params", "tv_threshold:exp_0.1"], "`tv_threshold` must be", "lin_"),
        "missing file": (["--env", "CartPole-v1", "-conf", "nowhere.yml"], "hyperparameter file not found", "nowhere.yml"),
        "trial without study": (["--env", "CartPole-v1", "--trial-id", "0"], "--trial-id needs --storage", "--study-name"),
        "missing study": (["--env", "CartPole-v1", "--trial-id", "0", "--storage", "none.log", "--study-name", "s"],
                          "no Optuna journal at none.log", ""),
    }  # fmt: skip
    out = run_python(
        logs.parent,
        f"""
        import contextlib, io, json
        from sb3_vaco.zoo.cli import main
        results = {{}}
        for name, args in {json.dumps({name: args for name, (args, *_) in cases.items()})}.items():
            stderr = io.StringIO()
            with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
                code = main(["train", "--algo", "vaco", *args, "-n", "64", "-f", "logs", "--num-threads", "1"])
            results[name] = (code, stderr.getvalue())
        with contextlib.redirect_stderr(io.StringIO()) as stderr:
            results["unknown command"] = (main(["trian"]), stderr.getvalue())
        print(json.dumps(results))
        """,
    )
    results = json.loads(out.strip().splitlines()[-1])
    for name, (_, *messages) in cases.items():
        code, stderr = results[name]
        assert code == 2, name
        error_line = stderr.strip().splitlines()[-1]
        assert error_line.startswith("sb3-vaco train: error:"), (name, stderr)
        for message in messages:
            assert message in error_line, (name, error_line)
    assert results["unknown command"][0] == 2
    assert "unknown command 'trian'. Did you mean train?" in results["unknown command"][1]
    # Nothing half-written: no new run folder, no journal created, and enjoy still finds the last good run
    assert run_folders(logs) == before
    assert not (logs.parent / "none.log").exists()
    run(logs.parent, "enjoy", "--algo", "vaco", "--env", "CartPole-v1", "-f", "logs", "--no-render", "-n", "10")


def test_search_spaces_are_the_zoo_spaces_plus_each_algorithms_knobs(tmp_path: Path) -> None:
    """Every algorithm's sampler: the zoo's PPO (TRPO) space less what it lacks, plus its knobs; trials build models."""
    out = run_python(
        tmp_path,
        """
        import json
        import optuna
        from rl_zoo3.hyperparams_opt import HYPERPARAMS_CONVERTER, HYPERPARAMS_SAMPLER, sample_ppo_params, sample_trpo_params
        from sb3_vaco.zoo import ZOO_ALGOS, register_algos
        register_algos()
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        def new_study():  # one per space: a study rejects a categorical whose choices change (TRPO's net_arch)
            return optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
        zoo = {}
        for name, sampler in (("ppo", sample_ppo_params), ("trpo", sample_trpo_params)):
            trial = new_study().ask()
            sampler(trial, 1, 1, {})
            zoo[name] = {key: repr(d) for key, d in trial.distributions.items()}
        spaces, pruned = {}, {}
        for algo in ("vaco", "lagged_ppo", "decoupled_ppo", "appo", "ppo_kl", "impala", "lagged_trpo"):
            pruned[algo], study = 0, new_study()
            for _ in range(12):
                trial = study.ask()
                try:
                    sampled = HYPERPARAMS_SAMPLER[algo](trial, 1, 1, {})
                except optuna.TrialPruned:
                    assert 2 ** trial.params["batch_size_pow"] > 2 ** trial.params["n_steps_pow"]
                    pruned[algo] += 1
                    continue
                assert HYPERPARAMS_CONVERTER[algo](trial.params) == sampled, algo
                ZOO_ALGOS[algo]("MlpPolicy", "CartPole-v1", **sampled)  # every sampled key is a constructor argument
                spaces[algo] = {key: repr(d) for key, d in trial.distributions.items()}
        print(json.dumps({"zoo": zoo, "spaces": spaces, "pruned": pruned}))
        """,
    )
    result = json.loads(out.strip().splitlines()[-1])
    ppo, trpo, spaces = result["zoo"]["ppo"], result["zoo"]["trpo"], result["spaces"]
    no_minibatches = {"clip_range", "batch_size_pow", "n_epochs"}
    expected = {
        "vaco": (set(ppo) - {"clip_range"}) | {"tv_threshold", "vtrace_rho_bar", "vtrace_c_bar", "tv_reference"},
        "lagged_ppo": set(ppo),
        "decoupled_ppo": set(ppo),
        "appo": set(ppo),
        "ppo_kl": (set(ppo) - {"clip_range"}) | {"kl_coef"},
        "impala": (set(ppo) - no_minibatches) | {"vtrace_rho_bar", "vtrace_c_bar", "normalize_advantage"},
        "lagged_trpo": set(trpo),
    }
    for algo, names in expected.items():
        assert set(spaces[algo]) == names, algo
        zoo_space = trpo if algo == "lagged_trpo" else ppo
        for name in names & set(zoo_space):
            assert spaces[algo][name] == zoo_space[name], (algo, name)  # the zoo's ranges and choices
    assert result["pruned"]["impala"] == 0  # one pass over the whole batch: no minibatch to prune


def test_shipped_entries_build_models(tmp_path: Path) -> None:
    """Every entry of every algorithm's YAML (inherited entries resolved) has only valid keys and builds its model."""
    for name in ("vaco", "lagged_ppo"):
        entries = yaml.safe_load((HYPERPARAMS_DIR / f"{name}.yml").read_text())
        assert {"default", *MUJOCO_ENVS, *CLASSIC_ENVS} <= set(entries), name
        for env_id in MUJOCO_ENVS:
            assert entries[env_id].get("normalize") is True, (name, env_id)
    # The zoo's fallback entry trains what `VACO("MlpPolicy", env)` / `LaggedPPO("MlpPolicy", env)` trains
    for name in ("vaco", "lagged_ppo"):
        fallback = yaml.safe_load((HYPERPARAMS_DIR / f"{name}.yml").read_text())["default"]
        assert fallback == {"n_timesteps": 1e6, "policy": "MlpPolicy"}, name
    out = run_python(
        tmp_path,
        """
        import importlib.util, json, yaml
        from stable_baselines3.common.env_util import make_vec_env
        from torch import nn
        from sb3_vaco.zoo import ZOO_ALGOS, load_entries
        from sb3_vaco.zoo.exp_manager import ZOO_KEYS, VACOExperimentManager, check_hyperparameter_keys
        built, skipped = [], []
        for name, algo_class in ZOO_ALGOS.items():
            for env_id, entry in load_entries(name).items():
                check_hyperparameter_keys(name, algo_class, entry, {})
                if env_id == "default":
                    continue
                if "LunarLander" in env_id and importlib.util.find_spec("Box2D") is None:
                    skipped.append(f"{name}/{env_id}")
                    continue
                kwargs = VACOExperimentManager._preprocess_schedules(dict(entry))
                n_envs = kwargs.get("n_envs", 1)
                kwargs = {key: value for key, value in kwargs.items() if key not in ZOO_KEYS}
                if isinstance(kwargs.get("policy_kwargs"), str):
                    kwargs["policy_kwargs"] = eval(kwargs["policy_kwargs"], {"nn": nn})
                env = make_vec_env(env_id, n_envs=n_envs)
                algo_class(env=env, device="cpu", **kwargs)
                env.close()
                built.append(f"{name}/{env_id}")
        print(json.dumps({"built": built, "skipped": skipped}))
        """,
    )
    result = json.loads(out.strip().splitlines()[-1])
    for name in ("vaco", "lagged_ppo"):
        for env_id in MUJOCO_ENVS:
            assert f"{name}/{env_id}" in result["built"]
        assert f"{name}/CartPole-v1" in result["built"]


def test_shipped_entries_hold_only_what_differs_from_the_defaults(tmp_path: Path) -> None:
    """
    Every key of every entry of each algorithm's YAML file is a constructor argument of the algorithm or a key the zoo
    handles, and none sets an argument to its constructor default (an omitted key gets the default, so entries follow
    the class when its defaults change).
    """
    out = run_python(
        tmp_path,
        """
        import json, yaml
        from sb3_vaco.zoo import HYPERPARAMS_DIR, INHERIT_KEY, ZOO_ALGOS, load_entries
        from sb3_vaco.zoo.exp_manager import (
            ZOO_KEYS, ZOO_SET_ARGUMENTS, constructor_arguments, constructor_defaults, is_constructor_default,
        )
        checked, problems = [], []
        for name, algo_class in ZOO_ALGOS.items():
            arguments = constructor_arguments(algo_class) - set(ZOO_SET_ARGUMENTS)
            defaults = constructor_defaults(algo_class)
            own = yaml.safe_load((HYPERPARAMS_DIR / f"{name}.yml").read_text())
            inherited = load_entries(own.pop(INHERIT_KEY)["from"]) if INHERIT_KEY in own else {}
            for env_id, entry in load_entries(name).items():
                for key, value in entry.items():
                    # A key that overrides an inherited value may restate a default
                    overrides = key in own.get(env_id, {}) and key in inherited.get(env_id, {})
                    checked.append(f"{name}/{env_id}/{key}")
                    if key not in arguments | ZOO_KEYS:
                        problems.append(f"{name}/{env_id}: {key} is neither an argument of {name} nor a zoo key")
                    elif key in defaults and is_constructor_default(value, defaults[key]) and not overrides:
                        problems.append(f"{name}/{env_id}: {key}: {value!r} is the constructor default")
        # The comparison itself: a default is recognised as such, a tuned value is not
        vaco_defaults = constructor_defaults(ZOO_ALGOS["vaco"])
        assert is_constructor_default(0, vaco_defaults["policy_lag"]) and is_constructor_default(0.99, vaco_defaults["gamma"])
        assert is_constructor_default("decoupled", vaco_defaults["tv_reference"])
        assert not is_constructor_default(0.3, vaco_defaults["tv_threshold"]) and not is_constructor_default(1, False)
        print(json.dumps({"checked": checked, "problems": problems}))
        """,
    )
    result = json.loads(out.strip().splitlines()[-1])
    assert result["problems"] == []
    assert {
        "vaco/Reacher-v5/max_grad_norm",
        "vaco/Hopper-v5/n_steps",
        "lagged_ppo/Hopper-v5/normalize",
        "spo/HalfCheetah-v5/clip_range",
        "ppo_kl/Hopper-v5/n_steps",
    } <= set(result["checked"])
    # ppo_kl inherits vaco.yml without the filter's keys
    assert not any(key.startswith("ppo_kl/") and key.endswith("/tv_threshold") for key in result["checked"])
