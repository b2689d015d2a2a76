"""The package's structure: no import cycle between its modules; the wheel is the library, without the lab."""

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import sb3_vaco

PACKAGE_ROOT = Path(sb3_vaco.__file__).resolve().parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that ``path`` imports, anywhere in it (lazy imports in functions included)."""
    imported: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        imported.update(name for name in names if name in modules)
    return imported


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(path): path for path in PACKAGE_ROOT.rglob("*.py")}
    modules = set(paths)
    return {name: imported_modules(path, modules) - {name} for name, path in paths.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of imports as a list of modules (first = last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for imported in sorted(graph[module]):
            if state.get(imported) == 1:
                return [*path[path.index(imported) :], imported]
            if imported not in state and (cycle := visit(imported)) is not None:
                return cycle
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)) is not None:
            return cycle
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_import_cycle_in_the_package():
    graph = import_graph()
    assert "sb3_vaco.common.lagged" in graph and "sb3_vaco.actors.pool" in graph["sb3_vaco.common.lagged"]
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle or [])


def test_the_wheel_is_the_library(tmp_path):
    """
    The built wheel holds the package only (no benchmark lab, no demo), and ``import sb3_vaco`` needs none of the lab's,
    the zoo's, Ray's or TRL's dependencies.
    """
    repo = PACKAGE_ROOT.parent
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(repo), "--no-deps", "--no-build-isolation", "-w", str(tmp_path), "-q"],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    (wheel,) = tmp_path.glob("sb3_vaco-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    packages = {name.split("/")[0] for name in names}
    assert packages == {"sb3_vaco", wheel.name.split("-py")[0] + ".dist-info"}, packages
    assert "sb3_vaco/hyperparams/vaco.yml" in names
    lab = ("sb3_vaco/bench/", "vaco_lab", "math_task", "grids.yml", "demo")
    assert not [name for name in names if any(part in name for part in lab)]

    blocked = ("vaco_lab", "rl_zoo3", "optuna", "pandas", "rliable", "matplotlib", "trl", "transformers", "datasets", "ray")
    code = f"""
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Block())
import sb3_vaco
from sb3_vaco import *
print(len(sb3_vaco.__all__))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=False)
    assert result.returncode == 0, result.stderr
