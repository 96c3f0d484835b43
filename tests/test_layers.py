"""The parts import one way: every module's imports, read with ``ast`` (nothing is imported), point
only to its own part or to parts below it, and the graph of parts has no cycle.

A part is a folder installed as ``vidgen.<part>`` (``models/`` is ``vidgen.models``) or a module of
``vidgen/``. Imports under ``if TYPE_CHECKING:`` are annotations, not arrows, and are not counted.
Ray is imported at module level only by the modules Ray itself loads (``RAY_AT_IMPORT``): the
others import it where it is used, so the library and ``pytest`` run without Ray installed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FOLDERS = {
    "vidgen": "vidgen",
    "models": "vidgen.models",
    "attention": "vidgen.attention",
    "pipelines": "vidgen.pipelines",
    "distributed": "vidgen.distributed",
    "serving": "vidgen.serving",
    "ui": "vidgen.ui",
}
"""Source folder -> the package it installs as (``[tool.setuptools] package-dir``)."""

LAYERS = [
    "core",  # vidgen/__init__, validation (InputError), config, request (GenerationRequest)
    "video",
    "shapes",
    "attention",
    "models",
    "pipelines",
    "distributed",
    "serving",
    "training",
    "evaluation",
    "bench",
    "ui",
    "cli",
]
"""Bottom to top: a part may import the parts listed before it, never one after it."""

CORE = {
    "vidgen",
    "vidgen.validation",
    "vidgen.plotting",  # matplotlib, imported when a tool draws
    "vidgen.config",
    "vidgen.request",
    "vidgen.configs",
    "vidgen.default_model",
}

RAY_AT_IMPORT = {"vidgen.serving.router"}
"""Loaded by Ray Serve by name (``RequestRouterConfig``); it subclasses a Ray class."""


def part_of(module: str) -> str:
    if module in CORE:
        return "core"
    if module == "vidgen.__main__":
        return "cli"
    name = module.split(".")[1]
    assert name in LAYERS, f"{module}: part {name!r} has no place in LAYERS"
    return name


def modules() -> dict[str, Path]:
    found = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and (
        (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
        or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")
    )


def imports(module: str, path: Path) -> list[tuple[str, int, bool]]:
    """(imported module, line, at module level) for every import outside ``if TYPE_CHECKING:``."""
    found: list[tuple[str, int, bool]] = []
    is_package = path.name == "__init__.py"

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if _type_checking_only(child):
                for other in child.orelse:
                    visit(other, top)
                continue
            if isinstance(child, ast.Import):
                found.extend((alias.name, child.lineno, top) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = module.split(".")[: len(module.split(".")) - child.level + is_package]
                    name = ".".join([*base, child.module] if child.module else base)
                else:
                    name = child.module or ""
                found.append((name, child.lineno, top))
                # ``from vidgen import cli``: the names may be modules
                found.extend((f"{name}.{alias.name}", child.lineno, top) for alias in child.names)
            # a function or class body runs later (or never): an import there is not at module level
            visit(child, top and not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda))

    visit(ast.parse(path.read_text(), str(path)), True)
    return found


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The vidgen module ``name`` is (or lies in); None for third-party names."""
    while name and name.startswith("vidgen"):
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


ALL = modules()


def arrows() -> list[tuple[str, str, str, int]]:
    """(importing module, imported module, file, line) between two different parts."""
    found = []
    for module, path in ALL.items():
        for name, line, _ in imports(module, path):
            target = _resolve(name, ALL)
            if target is not None and part_of(target) != part_of(module):
                found.append((module, target, str(path.relative_to(ROOT)), line))
    return found


def test_every_module_has_a_part():
    assert len(ALL) > 100  # the folders were found
    for module in ALL:
        part_of(module)


def test_no_part_imports_a_part_above_it():
    upward = [
        f"{file}:{line}: {module} ({part_of(module)}) imports {target} ({part_of(target)})"
        for module, target, file, line in arrows()
        if LAYERS.index(part_of(target)) > LAYERS.index(part_of(module))
    ]
    assert upward == []


def test_the_parts_form_no_cycle():
    graph: dict[str, set[str]] = {part: set() for part in LAYERS}
    for module, target, _, _ in arrows():
        graph[part_of(module)].add(part_of(target))
    done: set[str] = set()

    def walk(part: str, path: list[str]) -> None:
        assert part not in path, "cycle: " + " -> ".join([*path[path.index(part) :], part])
        if part not in done:
            for nxt in sorted(graph[part]):
                walk(nxt, [*path, part])
            done.add(part)

    for part in LAYERS:
        walk(part, [])


def test_ray_is_imported_where_it_is_used():
    at_top = sorted(
        f"{ALL[module].relative_to(ROOT)}:{line}: {name}"
        for module in ALL
        if module not in RAY_AT_IMPORT
        for name, line, top in imports(module, ALL[module])
        if top and (name == "ray" or name.startswith("ray."))
    )
    assert at_top == []


def test_the_check_sees_a_wrong_arrow(tmp_path):
    """What the tests above would say of ``from vidgen.cli import ...`` in ``distributed/``."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from vidgen.ui import app\n"
        "import ray\n"
        "from vidgen.cli.render import overrides_of\n"
        "def f():\n    from vidgen.serving import RaySessions\n"
    )
    found = imports("vidgen.distributed.bad", bad)
    assert [(name, top) for name, _, top in found if not name.startswith("typing")] == [
        ("ray", True),
        ("vidgen.cli.render", True),
        ("vidgen.cli.render.overrides_of", True),
        ("vidgen.serving", False),
        ("vidgen.serving.RaySessions", False),
    ]
    upward = {part_of(_resolve(name, ALL)) for name, _, _ in found if name.startswith("vidgen")}
    assert {p for p in upward if LAYERS.index(p) > LAYERS.index("distributed")} == {"cli", "serving"}


@pytest.mark.parametrize("relative", [1, 2])
def test_relative_imports_resolve(tmp_path, relative):
    path = tmp_path / "x.py"
    path.write_text(f"from {'.' * relative} import y\n")
    (name, _, _), *_ = imports("vidgen.pipelines.x", path)
    assert name == ("vidgen.pipelines" if relative == 1 else "vidgen")


def test_the_type_checkers_layout_links_every_part():
    """``.typecheck/vidgen`` (mypy's ``mypy_path``) mirrors the installed package: a link for every
    entry of ``vidgen/`` and for every folder ``package-dir`` maps into ``vidgen``."""
    from vidgen.config import tomllib  # tomli before Python 3.11

    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    layout = ROOT / ".typecheck" / "vidgen"
    expected = {
        entry.name: ROOT / "vidgen" / entry.name
        for entry in (ROOT / "vidgen").iterdir()
        if entry.name != "__pycache__"
    }
    expected |= {
        name.removeprefix("vidgen."): ROOT / folder for name, folder in mapping.items() if name != "vidgen"
    }
    links = {entry.name: entry for entry in layout.iterdir()}
    assert sorted(links) == sorted(expected)
    for name, link in links.items():
        assert link.is_symlink() and link.resolve() == expected[name].resolve(), name
