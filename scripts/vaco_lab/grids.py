"""
Named benchmark grids and algorithm variants, read from a YAML file (``scripts/grids.yml``): experiments are data.

The file has two top-level keys::

    variants:                  # name -> zoo algo + hyperparameters on top of its YAML entry
      vaco: {algo: vaco}
      vaco_rho4: {algo: vaco, hyperparams: {pg_rho_bar: 4}, description: "weights min(4, π_T/μ)"}
    grids:
      demo:                    # a grid: one cell (the keys below), or `cells:` with those keys as their defaults
        description: VACO vs LaggedPPO on Hopper-v5 without and with lag
        out: results/demo      # relative to the repository root
        envs: [Hopper-v5]
        variants: [vaco, lagged_ppo]
        lags: [0, 4]           # K, or a range "0-8"
        seeds: 0-1             # ints and inclusive ranges
        n_timesteps: 50000
        eval_freq: 10000
        # optional: updates (default [base]), n_eval_episodes (default 10), local_variants (definitions that shadow
        # the file's in this grid only)

A cell's ``variants`` are names from the table, or specs ``[NAME=]BASE[:KEY=VALUE,...]`` as on the command line.
Every key is checked: a typo, a missing key, an unknown variant or algo, a bad lag or seed is a
:class:`GridFileError` that names the grid, the cell and the key.
"""

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from vaco_lab.common import lag_label, parse_lag, parse_seeds

BASE_UPDATE = "base"
DEFAULT_N_EVAL_EPISODES = 10
_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.+=-]+$")
RELATIVE_VALUE = re.compile(r"^x(\d+(?:\.\d*)?|\.\d+)$")

VARIANT_KEYS = {"algo": "algorithm (vaco, lagged_ppo, a baseline)", "hyperparams": "mapping", "description": "text"}
CELL_KEYS = {
    "out": "output folder, relative to the repository root",
    "envs": "list of env ids",
    "variants": "list of variant names or specs",
    "lags": "list of lag settings (K or K_min-K_max)",
    "seeds": "seeds: ints and inclusive ranges",
    "updates": "list of update settings LABEL[:KEY=VALUE,...] (default [base])",
    "n_timesteps": "training steps per run",
    "eval_freq": "evaluate every N env steps",
    "n_eval_episodes": f"episodes per evaluation (default {DEFAULT_N_EVAL_EPISODES})",
}
REQUIRED_CELL_KEYS = ("out", "envs", "variants", "lags", "seeds", "n_timesteps", "eval_freq")
GRID_KEYS = {"description": "text", "cells": "list of cells", "local_variants": "mapping name -> variant", **CELL_KEYS}


class GridFileError(ValueError):
    """A malformed grids file: the message names the file, the grid, the cell and the key."""


@dataclass(frozen=True)
class Variant:
    """An algorithm variant: a zoo algo with hyperparameters on top of its YAML entry."""

    name: str
    algo: str
    hyperparams: dict[str, Any] = field(default_factory=dict)
    description: str = ""


@dataclass(frozen=True)
class UpdateSetting:
    """A point on the update-frequency axis: hyperparameters applied to every variant; ``xF`` scales the YAML value."""

    label: str
    hyperparams: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Cell:
    """A product {env} × {lag} × {update} × {variant} × {seed} with one protocol, written to one folder."""

    out: Path
    envs: tuple[str, ...]
    variants: tuple[Variant, ...]
    lags: tuple[str, ...]
    seeds: tuple[int, ...]
    n_timesteps: int | None
    eval_freq: int
    updates: tuple[UpdateSetting, ...] = (UpdateSetting(BASE_UPDATE),)
    n_eval_episodes: int = DEFAULT_N_EVAL_EPISODES


@dataclass(frozen=True)
class Grid:
    """A named experiment: one or more cells."""

    name: str | None
    description: str
    cells: tuple[Cell, ...]

    @property
    def out_dirs(self) -> list[Path]:
        """The output folders, in order of first appearance."""
        return list(dict.fromkeys(cell.out for cell in self.cells))


@dataclass(frozen=True)
class GridFile:
    """The variants and grids of a grids file."""

    path: Path
    variants: dict[str, Variant]
    grids: dict[str, Grid]

    def grid(self, name: str) -> Grid:
        """The grid ``name``; an error listing the grids otherwise."""
        if name not in self.grids:
            raise GridFileError(f"No grid {name!r} in {self.path}; grids: {', '.join(self.grids)}")
        return self.grids[name]


def check_name(name: str) -> str:
    """A name that becomes a folder name: letters, digits and ``_.+=-``."""
    if not _NAME_PATTERN.match(name):
        raise ValueError(f"Names become folder names: use letters, digits and _.+=- only, got {name!r}")
    return name


def _parse_assignments(text: str) -> dict[str, str]:
    """``"a=1,b=x"`` → ``{"a": "1", "b": "x"}`` (values still text)."""
    assignments: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"Expected KEY=VALUE, got {item!r}")
        assignments[key.strip()] = value.strip()
    return assignments


def parse_value(text: str) -> Any:
    """A command-line value as YAML would read it, and ``1e-3`` as a float (PyYAML reads it as a string)."""
    value = yaml.safe_load(text)
    if isinstance(value, str):
        try:
            return float(text)
        except ValueError:
            return value
    return value


def parse_variant(spec: str, table: Mapping[str, Variant]) -> Variant:
    """
    ``[NAME=]BASE[:KEY=VALUE,...]``: a variant of ``table`` with extra hyperparameters. Values are parsed as YAML
    (``0.05``, ``1e-3``, ``learner``, ``true``, ``lin_0.2``) and cannot contain commas. Without a NAME the variant is
    named ``BASE+KEY=VALUE+...`` (``vaco:tv_threshold=0.05`` → ``vaco+tv_threshold=0.05``); ``BASE`` alone is the
    table's variant.
    """
    head, _, params = spec.partition(":")
    name, sep, base = head.partition("=")
    if not sep:
        name, base = "", head
    base = base.strip()
    if base not in table:
        raise ValueError(f"Unknown variant {base!r} in {spec!r}; variants: {', '.join(table)}")
    assignments = _parse_assignments(params)
    if not name and not assignments:
        return table[base]
    if not name:
        name = base + "".join(f"+{key}={value}" for key, value in assignments.items())
    extra = {key: parse_value(value) for key, value in assignments.items()}
    parent = table[base]
    return Variant(name=check_name(name.strip()), algo=parent.algo, hyperparams={**parent.hyperparams, **extra})


def parse_update(spec: str) -> UpdateSetting:
    """``LABEL[:KEY=VALUE,...]``; a value ``xF`` multiplies the env's YAML value by F (``n_epochs=x2``)."""
    label, _, params = spec.partition(":")
    hyperparams: dict[str, Any] = {}
    for key, value in _parse_assignments(params).items():
        hyperparams[key] = value if RELATIVE_VALUE.match(value) else parse_value(value)
    if label.strip() == BASE_UPDATE and hyperparams:
        raise ValueError(f"The update setting {BASE_UPDATE!r} means the YAML values; give another label to {spec!r}")
    return UpdateSetting(label=check_name(label.strip()), hyperparams=hyperparams)


def _zoo_algos() -> tuple[str, ...]:
    from sb3_vaco.zoo import ZOO_ALGOS

    return tuple(ZOO_ALGOS)


def _check_keys(entry: Any, valid: Mapping[str, str], where: str) -> dict[str, Any]:
    if not isinstance(entry, dict):
        raise GridFileError(f"{where}: expected a mapping of keys, got {entry!r}")
    unknown = [key for key in entry if key not in valid]
    if unknown:
        raise GridFileError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; valid keys: {', '.join(valid)}")
    return entry


def _parse_variant_table(entries: Any, where: str, base: Mapping[str, Variant] | None = None) -> dict[str, Variant]:
    """Variant definitions ``name: {algo, hyperparams, description}``."""
    if entries is None:
        return {}
    if not isinstance(entries, dict):
        raise GridFileError(f"{where}: expected a mapping name -> {{algo, hyperparams}}, got {entries!r}")
    algos = _zoo_algos()
    table: dict[str, Variant] = {}
    for name, entry in entries.items():
        here = f"{where}, variant {name!r}"
        entry = _check_keys(entry, VARIANT_KEYS, here)
        try:
            check_name(str(name))
        except ValueError as error:
            raise GridFileError(f"{here}: {error}") from None
        if entry.get("algo") not in algos:
            raise GridFileError(f"{here}: 'algo' must be one of {', '.join(algos)}, got {entry.get('algo')!r}")
        hyperparams = entry.get("hyperparams") or {}
        if not isinstance(hyperparams, dict) or not all(isinstance(key, str) for key in hyperparams):
            raise GridFileError(f"{here}: 'hyperparams' must be a mapping KEY: VALUE, got {hyperparams!r}")
        reserved = {"policy_lag", "n_timesteps"} & set(hyperparams)
        if reserved:
            raise GridFileError(f"{here}: {', '.join(sorted(reserved))} are set by a cell's 'lags' and 'n_timesteps'")
        table[str(name)] = Variant(str(name), entry["algo"], dict(hyperparams), str(entry.get("description", "")))
    return table


def _as_list(value: Any, key: str, where: str) -> list[Any]:
    items = value if isinstance(value, list) else [value]
    if not items or any(isinstance(item, (dict, list)) or item is None for item in items):
        raise GridFileError(f"{where}: {key!r} must be a non-empty {CELL_KEYS[key]}, got {value!r}")
    return items


def _positive_int(value: Any, key: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise GridFileError(f"{where}: {key!r} must be a positive integer, got {value!r}")
    return value


def _unique(items: Sequence[Any], key: str, where: str) -> None:
    if len(set(items)) != len(items):
        raise GridFileError(f"{where}: repeated entry in {key!r}: {list(items)}")


def parse_cell(entry: dict[str, Any], table: Mapping[str, Variant], where: str) -> Cell:
    """A cell from its (merged) mapping, every key checked."""
    missing = [key for key in REQUIRED_CELL_KEYS if key not in entry]
    if missing:
        raise GridFileError(f"{where}: missing key(s) {', '.join(map(repr, missing))}")
    try:
        variants = tuple(parse_variant(str(spec), table) for spec in _as_list(entry["variants"], "variants", where))
        lags = tuple(lag_label(parse_lag(str(lag))) for lag in _as_list(entry["lags"], "lags", where))
        seeds = parse_seeds(_as_list(entry["seeds"], "seeds", where))
        updates = tuple(parse_update(str(spec)) for spec in _as_list(entry.get("updates", BASE_UPDATE), "updates", where))
    except ValueError as error:
        if isinstance(error, GridFileError):
            raise
        raise GridFileError(f"{where}: {error}") from None
    envs = tuple(str(env) for env in _as_list(entry["envs"], "envs", where))
    names = {"envs": envs, "variants": [v.name for v in variants], "lags": lags, "updates": [u.label for u in updates]}
    for key, items in names.items():
        _unique(items, key, where)
    if not isinstance(entry["out"], str) or not entry["out"].strip():
        raise GridFileError(f"{where}: 'out' must be a folder path, got {entry['out']!r}")
    return Cell(
        out=Path(entry["out"]),
        envs=envs,
        variants=variants,
        lags=lags,
        seeds=seeds,
        n_timesteps=_positive_int(entry["n_timesteps"], "n_timesteps", where),
        eval_freq=_positive_int(entry["eval_freq"], "eval_freq", where),
        updates=updates,
        n_eval_episodes=_positive_int(entry.get("n_eval_episodes", DEFAULT_N_EVAL_EPISODES), "n_eval_episodes", where),
    )


def parse_grid(name: str, entry: Any, table: Mapping[str, Variant], where: str) -> Grid:
    """A grid: its cells, each the grid's cell keys overridden by the cell's own."""
    entry = _check_keys(entry, GRID_KEYS, where)
    if not isinstance(entry.get("description"), str) or not entry["description"].strip():
        raise GridFileError(f"{where}: 'description' (text: what the grid measures) is required")
    table = {**table, **_parse_variant_table(entry.get("local_variants"), f"{where}, local_variants")}
    defaults = {key: value for key, value in entry.items() if key in CELL_KEYS}
    cells = entry.get("cells")
    if cells is None:
        return Grid(name, entry["description"].strip(), (parse_cell(defaults, table, where),))
    if not isinstance(cells, list) or not cells:
        raise GridFileError(f"{where}: 'cells' must be a non-empty list of cells, got {cells!r}")
    parsed = []
    for index, cell in enumerate(cells, start=1):
        here = f"{where}, cell {index}"
        parsed.append(parse_cell({**defaults, **_check_keys(cell, CELL_KEYS, here)}, table, here))
    return Grid(name, entry["description"].strip(), tuple(parsed))


def load_grid_file(path: Path) -> GridFile:
    """Read and check a grids file (see the module docstring for its format)."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as error:
        raise GridFileError(f"{path}: not valid YAML: {error}") from None
    data = _check_keys(data, {"variants": "mapping", "grids": "mapping"}, str(path))
    table = _parse_variant_table(data.get("variants"), f"{path}: variants")
    grids = data.get("grids")
    if not isinstance(grids, dict) or not grids:
        raise GridFileError(f"{path}: 'grids' must be a non-empty mapping name -> grid")
    parsed = {}
    for name, entry in grids.items():
        try:
            check_name(str(name))
        except ValueError as error:
            raise GridFileError(f"{path}, grid {name!r}: {error}") from None
        parsed[str(name)] = parse_grid(str(name), entry, table, f"{path}, grid {name!r}")
    return GridFile(Path(path), table, parsed)


def _filtered(values: Sequence[Any], keep: Sequence[str] | None, label: Any = str) -> tuple[Any, ...]:
    return tuple(value for value in values if keep is None or label(value) in keep)


def select(
    grid: Grid,
    envs: Sequence[str] | None = None,
    variants: Sequence[str] | None = None,
    lags: Sequence[str] | None = None,
    updates: Sequence[str] | None = None,
    seeds: Sequence[int] | None = None,
    n_timesteps: int | None = None,
    eval_freq: int | None = None,
    n_eval_episodes: int | None = None,
    out: Path | None = None,
) -> Grid:
    """
    Part of a grid, or the grid with another protocol: ``envs``, ``variants`` (names), ``lags`` and ``updates``
    (labels) keep only those entries of each cell (a value no cell has is an error); ``seeds``, ``n_timesteps``,
    ``eval_freq`` and ``n_eval_episodes`` replace every cell's; ``out`` replaces the folder of a one-folder grid.
    """
    cells = []
    for cell in grid.cells:
        cell = replace(
            cell,
            envs=_filtered(cell.envs, envs),
            variants=_filtered(cell.variants, variants, lambda variant: variant.name),
            lags=_filtered(cell.lags, None if lags is None else [lag_label(parse_lag(lag)) for lag in lags]),
            updates=_filtered(cell.updates, updates, lambda update: update.label),
            seeds=tuple(seeds) if seeds is not None else cell.seeds,
            n_timesteps=n_timesteps or cell.n_timesteps,
            eval_freq=eval_freq or cell.eval_freq,
            n_eval_episodes=n_eval_episodes or cell.n_eval_episodes,
        )
        if cell.envs and cell.variants and cell.lags and cell.updates:
            cells.append(cell)
    for option, wanted, present in (
        ("--envs", envs, {env for cell in grid.cells for env in cell.envs}),
        ("--variants", variants, {variant.name for cell in grid.cells for variant in cell.variants}),
        ("--lags", lags and [lag_label(parse_lag(lag)) for lag in lags], {lag for cell in grid.cells for lag in cell.lags}),
        ("--updates", updates, {update.label for cell in grid.cells for update in cell.updates}),
    ):
        absent = [value for value in wanted or () if value not in present]
        if absent:
            raise ValueError(f"{option}: {', '.join(absent)} not in grid {grid.name!r} (it has {', '.join(sorted(present))})")
    if not cells:
        raise ValueError(f"No cell of grid {grid.name!r} has all of the selected envs, variants, lags and updates")
    if out is not None:
        if len(grid.out_dirs) > 1:
            folders = ", ".join(map(str, grid.out_dirs))
            raise ValueError(f"--out: grid {grid.name!r} writes to several folders ({folders}); it cannot be moved to one")
        cells = [replace(cell, out=out) for cell in cells]
    return replace(grid, cells=tuple(cells))
