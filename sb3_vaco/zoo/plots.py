"""
The zoo's plot scripts (:mod:`rl_zoo3.plots`) for the launcher, made to work without a display and on a single run.

* Figures are saved to files: with ``--figure-dir DIR``, or by default (to ``figures/``) when there is no display (then
  matplotlib's Agg backend is used unless ``MPLBACKEND`` says otherwise) or the backend is not interactive (e.g.
  ``MPLBACKEND=Agg``). Each figure the script draws becomes
  ``DIR/<command>-<figure name>.<--figure-format>`` (e.g. ``figures/all_plots-results_cartpole.png``). With a
  display and no ``--figure-dir`` the scripts behave as the zoo's (windows, nothing saved).
* ``plot_from_file`` accepts what ``all_plots -o`` writes for a single run, where the zoo's ``all_plots`` squeezes
  the per-run final scores (``last_evals``) to a scalar and ``plot_from_file`` then fails
  (``min() arg is an empty sequence``).
"""

import argparse
import contextlib
import importlib
import os
import pickle
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from sb3_vaco.zoo.exp_manager import ZooUsageError

PLOT_COMMANDS = ("plot_train", "all_plots", "plot_from_file")
DEFAULT_FIGURE_DIR = "figures"
FIGURE_FORMATS = ("png", "svg", "pdf")
FIGURE_OPTIONS_HELP = f"""
options added by the launcher:
  --figure-dir DIR      save every figure to DIR/<command>-<figure name>.<format> (default without a display:
                        {DEFAULT_FIGURE_DIR}/, with a display: figures are shown, not saved)
  --figure-format {{{",".join(FIGURE_FORMATS)}}}
                        format of the saved figures (default: png)"""


def has_display() -> bool:
    """Whether figures can be shown in windows (always on macOS and Windows; on Linux, with X11 or Wayland)."""
    if sys.platform in ("darwin", "win32"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def split_figure_options(command: str, args: Sequence[str]) -> tuple[list[str], argparse.Namespace]:
    """
    Take the launcher's own options (``--figure-dir``, ``--figure-format``) out of a plot command's arguments.

    :param command: the plot command, for messages
    :param args: the command's arguments
    :return: the remaining arguments (for the zoo's script) and the launcher's options
    :raises ZooUsageError: for an unsupported ``--figure-format``
    """
    # No abbreviations: --fig... belongs to the zoo's options (--figsize)
    parser = argparse.ArgumentParser(prog=f"sb3-vaco {command}", add_help=False, allow_abbrev=False)
    parser.add_argument("--figure-dir", type=str, default=None)
    parser.add_argument("--figure-format", type=str, default="png")
    options, rest = parser.parse_known_args(list(args))
    if options.figure_format not in FIGURE_FORMATS:
        raise ZooUsageError(f"--figure-format must be one of {', '.join(FIGURE_FORMATS)}, got {options.figure_format!r}")
    return rest, options


def figure_name(figure: Any) -> str:
    """A file-name-safe name for a figure: its label (``plt.figure("Results CartPole")``), else its window title."""
    label = figure.get_label()
    manager = figure.canvas.manager
    if not label and manager is not None:
        label = manager.get_window_title()
    name = re.sub(r"[^a-z0-9.\-]+", "_", (label or "").lower()).strip("_.")
    return name or f"figure_{figure.number}"


def save_open_figures(folder: Path, prefix: str, figure_format: str, saved: list[Path]) -> None:
    """
    Save every open pyplot figure to ``folder/<prefix>-<figure name>.<figure_format>``.

    :param saved: the paths saved so far by this command, appended to; a name already used gets a numbered suffix
    """
    from matplotlib import pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    for number in plt.get_fignums():
        figure = plt.figure(number)
        stem = f"{prefix}-{figure_name(figure)}"
        path, index = folder / f"{stem}.{figure_format}", 2
        while path in saved:
            path, index = folder / f"{stem}_{index}.{figure_format}", index + 1
        figure.savefig(path, format=figure_format, bbox_inches="tight")
        saved.append(path)
        print(f"Saved {path}")


@contextlib.contextmanager
def saving_figures(folder: Path, prefix: str, figure_format: str, show: bool) -> Iterator[list[Path]]:
    """
    Within the block, ``plt.show()`` first saves the open figures (then shows them if ``show``) and closes them;
    figures still open at the end of the block (never shown, e.g. ``all_plots --no-display``) are saved too.

    :return: the list of saved paths, filled as figures are saved
    """
    from matplotlib import pyplot as plt

    original_show = plt.show
    saved: list[Path] = []

    def save_and_show(*args: Any, **kwargs: Any) -> None:
        save_open_figures(folder, prefix, figure_format, saved)
        if show:
            original_show(*args, **kwargs)
        plt.close("all")

    plt.show = save_and_show  # the zoo's scripts call plt.show() on the pyplot module
    try:
        yield saved
        save_open_figures(folder, prefix, figure_format, saved)
    finally:
        plt.show = original_show
        plt.close("all")


def restore_last_evals(results: Any) -> Any:
    """
    Give each result of an ``all_plots -o`` pickle its per-run final scores ``last_evals`` as an array of shape
    ``(n_runs,)``. The zoo's ``all_plots`` computes them with ``np.squeeze``, which makes a scalar out of a single run
    (or of one evaluation episode per run); they equal the last row of ``mean_per_eval`` (shape ``(n_eval, n_runs)``).

    :param results: the unpickled mapping env → label → curves (and ``results_table``)
    :return: ``results``, modified in place
    """
    if not isinstance(results, dict):
        return results
    for env, entries in results.items():
        if env == "results_table" or not isinstance(entries, dict):
            continue
        for entry in entries.values():
            if isinstance(entry, dict) and {"last_evals", "mean_per_eval"} <= set(entry) and np.ndim(entry["last_evals"]) == 0:
                entry["last_evals"] = np.asarray(entry["mean_per_eval"])[-1]
    return results


class _SingleRunPickle:
    """Stands for :mod:`pickle` in ``rl_zoo3.plots.plot_from_file``: loads with :func:`restore_last_evals` applied."""

    @staticmethod
    def load(file: IO[bytes]) -> Any:
        return restore_last_evals(pickle.load(file))


@contextlib.contextmanager
def single_run_plot_from_file() -> Iterator[None]:
    """Within the block, ``plot_from_file`` reads its input (and ``--merge`` files) through :func:`restore_last_evals`."""
    module: Any = importlib.import_module("rl_zoo3.plots.plot_from_file")
    original = module.pickle
    module.pickle = _SingleRunPickle
    try:
        yield
    finally:
        module.pickle = original


def plot_command(command: str, figure_options: argparse.Namespace) -> Callable[[], None]:
    """
    The zoo's plot script ``command`` (reading ``sys.argv``), saving its figures as set by ``figure_options``.

    :param command: ``plot_train``, ``all_plots`` or ``plot_from_file``
    :param figure_options: from :func:`split_figure_options`
    """
    import matplotlib

    display = has_display()
    if not display and "MPLBACKEND" not in os.environ:
        matplotlib.use("Agg")
    from matplotlib.backends import BackendFilter, backend_registry
    from rl_zoo3 import plots

    zoo_function: Callable[[], None] = getattr(plots, command)
    interactive = display and matplotlib.get_backend().lower() in backend_registry.list_builtin(BackendFilter.INTERACTIVE)
    folder = figure_options.figure_dir or (None if interactive else DEFAULT_FIGURE_DIR)

    def run() -> None:
        with contextlib.ExitStack() as stack:
            if command == "plot_from_file":
                stack.enter_context(single_run_plot_from_file())
            if folder is not None:
                stack.enter_context(saving_figures(Path(folder), command, figure_options.figure_format, show=interactive))
            try:
                zoo_function()
            except SystemExit:
                if {"-h", "--help"} & set(sys.argv[1:]):
                    print(FIGURE_OPTIONS_HELP)
                raise

    return run
