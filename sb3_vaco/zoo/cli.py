"""
Command-line launcher: the RL Zoo's scripts with ``vaco`` and ``lagged_ppo`` registered.

.. code-block:: bash

    python -m sb3_vaco.zoo train --algo vaco --env Hopper-v5 -n 200000 --eval-freq 10000 -tb tb/
    python -m sb3_vaco.zoo train --algo vaco --env CartPole-v1 -optimize --n-trials 20 --sampler tpe --pruner median
    python -m sb3_vaco.zoo enjoy --algo vaco --env Hopper-v5 -f logs/ --no-render -n 2000
    python -m sb3_vaco.zoo record_video --algo vaco --env Hopper-v5 -f logs/ -n 500
    python -m sb3_vaco.zoo all_plots -a vaco ppo -e Hopper -f logs/ -o results --figure-dir figures/
    python -m sb3_vaco.zoo plot_from_file -i results -o results.png --format png

``sb3-vaco`` (console script) takes the same sub-commands. Every option is the zoo's; in addition, ``train``
loads ``vaco`` / ``lagged_ppo`` hyperparameters from the YAML files shipped in ``sb3_vaco/hyperparams`` unless
``--conf-file`` is given, and ``-params`` also accepts bare words as strings (``tv_reference:behavior``,
``tv_threshold:lin_0.1``). The plot commands save their figures to files without a display, or with
``--figure-dir`` (see :mod:`sb3_vaco.zoo.plots`).
"""

import argparse
import difflib
import importlib
import os
import re
import runpy
import sys
from collections.abc import Callable, Sequence

from sb3_vaco.zoo import ZOO_ALGOS, config_file, register_algos
from sb3_vaco.zoo.exp_manager import VACOExperimentManager, ZooUsageError
from sb3_vaco.zoo.plots import PLOT_COMMANDS, plot_command, split_figure_options

PROG = "sb3-vaco"
COMMANDS = {
    "train": "train an agent (rl_zoo3.train), or tune it with -optimize",
    "enjoy": "run a trained agent (rl_zoo3.enjoy)",
    "record_video": "record a video of a trained agent (rl_zoo3.record_video)",
    "plot_train": "plot the training curves of a run (rl_zoo3.plots.plot_train)",
    "all_plots": "plot and tabulate the evaluations of several runs (rl_zoo3.plots.all_plots)",
    "plot_from_file": "plot the output of all_plots -o (rl_zoo3.plots.plot_from_file)",
    "optuna_report": "write a Markdown/CSV report of an Optuna study (sb3_vaco.zoo.report)",
}
ENV_COMMANDS = ("train", "enjoy", "record_video")
# A -params value that is a bare word (tv_reference:behavior, tv_threshold:lin_0.2) is read as a string
_BARE_WORD = re.compile(r"^[A-Za-z_][\w.\-]*$")


def usage() -> str:
    """The launcher's help text."""
    lines = [f"usage: {PROG} <command> [options]   (or: python -m sb3_vaco.zoo <command> [options])", "", "commands:"]
    lines += [f"  {name:<16}{description}" for name, description in COMMANDS.items()]
    lines += ["", f"`{PROG} <command> -h` lists the command's options. Algorithms added to the zoo: {', '.join(ZOO_ALGOS)}."]
    return "\n".join(lines)


def _pre_parse(args: Sequence[str]) -> argparse.Namespace:
    """Read the few options the launcher needs before handing ``args`` to the zoo (unknown options are ignored)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--algo", type=str, default="ppo")
    parser.add_argument("--env", type=str, default="CartPole-v1")
    parser.add_argument("-conf", "--conf-file", type=str, default=None)
    parser.add_argument("--gym-packages", type=str, nargs="+", default=[])
    known, _ = parser.parse_known_args(list(args))
    return known


def _quote_bare_words(args: list[str]) -> list[str]:
    """
    The zoo ``eval()``s every ``-params key:value``; quote values that are bare words and do not evaluate
    (``tv_reference:behavior`` → ``tv_reference:'behavior'``), so that strings need no shell-proof quoting.
    """
    from rl_zoo3 import utils as zoo_utils

    result, in_params = [], False
    for arg in args:
        if arg in ("-params", "--hyperparams"):
            in_params = True
        elif arg.startswith("-"):
            in_params = False
        elif in_params and ":" in arg:
            key, value = arg.split(":", 1)
            try:
                eval(value, vars(zoo_utils))
            except Exception as error:
                if not _BARE_WORD.match(value):
                    raise ZooUsageError(f"could not read -params {arg!r}: {error!r}") from error
                arg = f"{key}:{value!r}"
        result.append(arg)
    return result


def _check_env(env_id: str, gym_packages: Sequence[str]) -> None:
    """Fail clearly for an unregistered env id (with the closest match) or one whose optional dependency is missing."""
    import gymnasium as gym
    import rl_zoo3.import_envs  # noqa: F401  (registers the zoo's custom envs)

    for module in gym_packages:
        importlib.import_module(module)
    if env_id not in gym.envs.registry:
        close = difflib.get_close_matches(env_id, list(gym.envs.registry), n=1)
        hint = f" Did you mean {close[0]}?" if close else ""
        raise ZooUsageError(f"unknown environment id {env_id!r}: it is not registered in gymnasium.{hint}")
    try:
        gym.make(env_id).close()
    except gym.error.DependencyNotInstalled as error:
        raise ZooUsageError(f"{env_id} needs an optional dependency that is not installed: {error}") from error
    except Exception:
        pass  # e.g. an env that needs --env-kwargs: the zoo reports it with the right arguments


def _train_args(args: list[str]) -> list[str]:
    """``train``'s arguments: the shipped YAML as ``--conf-file`` for the package's algorithms, bare words quoted."""
    known = _pre_parse(args)
    if known.algo in ZOO_ALGOS and known.conf_file is None:
        args = [*args, "--conf-file", str(config_file(known.algo))]
    return _quote_bare_words(args)


def _run_record_video() -> None:
    # rl_zoo3.record_video is a script without a function: run it as __main__ (ALGOS is already patched)
    runpy.run_module("rl_zoo3.record_video", run_name="__main__", alter_sys=True)


def _command_function(command: str, figure_options: argparse.Namespace | None = None) -> Callable[[], None]:
    if command == "train":
        import rl_zoo3.train

        # train() looks ExperimentManager up in its module's globals: use the VACO-aware one
        rl_zoo3.train.ExperimentManager = VACOExperimentManager  # type: ignore[misc]
        return rl_zoo3.train.train
    if command == "enjoy":
        from rl_zoo3.enjoy import enjoy

        return enjoy
    if command == "record_video":
        return _run_record_video
    if command == "optuna_report":
        from sb3_vaco.zoo.report import main as report_main

        return report_main
    if command in PLOT_COMMANDS:
        assert figure_options is not None
        return plot_command(command, figure_options)
    raise ValueError(f"unknown command {command!r}")


def main(argv: Sequence[str] | None = None) -> int:
    """
    Run ``<command> [options]`` (``sys.argv[1:]`` by default) and return the exit code:
    0 on success, 2 for invalid input (reported as one line on stderr), the command's own code otherwise.

    :param argv: the command and its options
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    command, args = argv[0], argv[1:]
    if command not in COMMANDS:
        close = difflib.get_close_matches(command, list(COMMANDS), n=1)
        hint = f" Did you mean {close[0]}?" if close else ""
        print(f"{PROG}: error: unknown command {command!r}.{hint}\n\n{usage()}", file=sys.stderr)
        return 2

    if command == "record_video" and "DISPLAY" not in os.environ:
        # Headless machine: render MuJoCo offscreen with EGL, pygame without a window
        os.environ.setdefault("MUJOCO_GL", "egl")
        os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")

    register_algos()
    old_argv = sys.argv
    try:
        if command in ENV_COMMANDS and not {"-h", "--help"} & set(args):
            known = _pre_parse(args)
            _check_env(known.env, known.gym_packages)
        figure_options = None
        if command == "train":
            args = _train_args(args)
        elif command in PLOT_COMMANDS:
            args, figure_options = split_figure_options(command, args)
        function = _command_function(command, figure_options)
        sys.argv = [f"{PROG} {command}", *args]
        function()
    except ZooUsageError as error:
        print(f"{PROG} {command}: error: {error}", file=sys.stderr)
        return 2
    except SystemExit as error:  # argparse errors and --help
        return error.code if isinstance(error.code, int) else (0 if error.code is None else 1)
    finally:
        sys.argv = old_argv
    return 0
