"""The packages' imports point one way (docs/concepts.md, "Architecture"):

    exporters ──> edgetrain <── device_sim        (edgetrain.cli may import all three)
        ^                           │
        └───────────────────────────┘

  * the device side (edgetrain, its cli sub-package aside) imports none of exporters,
    device_sim, torch or matplotlib;
  * exporters never imports device_sim;
  * no module imports another module's private (`_name`) names;
  * no cycle between packages.
Imports are read from the source (AST), inside functions too.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import ROOT

PACKAGES = ("edgetrain", "exporters", "device_sim", "bench")
DEVICE_FORBIDDEN = ("exporters", "device_sim", "torch", "matplotlib")
EXEMPT_FROM_DEVICE_RULE = ("edgetrain", "cli")  # the command line composes host and device
MAX_LINES = 300


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, root: Path) -> list[tuple[str, list[str], int]]:
    """(module imported, names taken from it, line) for every import in the file."""
    tree = ast.parse(path.read_text(), str(path))
    here = module_name(path, root).split(".")
    is_pkg = path.name == "__init__.py"
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, [], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:  # relative: resolve against this module's package
                base = here if is_pkg else here[:-1]
                base = base[:len(base) - (node.level - 1)]
                mod = ".".join(base + ([mod] if mod else []))
            found.append((mod, [a.name for a in node.names], node.lineno))
    return found


def violations(root: Path) -> list[str]:
    """Every breach of the rules above in the source tree at `root`."""
    bad = []
    graph: dict[str, set[str]] = {}
    local = {p.stem for p in (root / "bench").glob("*.py")} if (root / "bench").is_dir() else set()
    for pkg in PACKAGES:
        for f in sorted((root / pkg).rglob("*.py")):
            rel = f.relative_to(root)
            exempt = rel.parts[:2] == EXEMPT_FROM_DEVICE_RULE
            for mod, names, line in imports_of(f, root):
                top = mod.split(".")[0]
                where = f"{rel}:{line} imports {mod}"
                if pkg == "edgetrain" and not exempt and top in DEVICE_FORBIDDEN:
                    bad.append(f"device side: {where}")
                if pkg == "exporters" and top == "device_sim":
                    bad.append(f"exporters -> device_sim: {where}")
                private = [n for n in names if n.startswith("_") and not n.startswith("__")]
                if private and (top in PACKAGES or top in local):
                    bad.append(f"private name {private} of another module: {where}")
                if top in PACKAGES and top != pkg and not exempt:
                    graph.setdefault(pkg, set()).add(top)
    for a, targets in graph.items():
        for b in targets:
            if a < b and a in graph.get(b, set()):
                bad.append(f"cycle between packages: {a} <-> {b}")
    return sorted(set(bad))


def test_imports_point_one_way():
    assert violations(ROOT) == []


def test_no_source_file_over_300_lines():
    long = [f"{f.relative_to(ROOT)} ({n} lines)" for pkg in PACKAGES
            for f in sorted((ROOT / pkg).rglob("*.py"))
            if (n := len(f.read_text().splitlines())) > MAX_LINES]
    assert long == []


@pytest.mark.parametrize("planted, expected", [
    ("edgetrain/planted.py", ("from device_sim.faults import ENV\n", "device side")),
    ("edgetrain/planted.py", ("import torch\n", "device side")),
    ("edgetrain/planted.py", ("def f():\n    import matplotlib.pyplot\n", "device side")),
    ("exporters/planted.py", ("from device_sim import profiles\n", "exporters -> device_sim")),
    ("device_sim/planted.py", ("from edgetrain.runtime import _OPENED\n", "private name")),
    ("edgetrain/planted.py", ("from . import _hidden\n", "private name")),
])
def test_the_check_finds_a_planted_violation(tmp_path, planted, expected):
    """A copy of the tree with one bad import in it fails the check, naming the rule."""
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            dest = tmp_path / f.relative_to(ROOT)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(f.read_text())
    assert violations(tmp_path) == []
    source, rule = expected
    (tmp_path / planted).write_text(source)
    found = violations(tmp_path)
    assert found and any(v.startswith(rule) and "planted.py" in v for v in found), found


def test_the_check_finds_a_planted_cycle(tmp_path):
    for pkg in ("edgetrain", "device_sim"):
        (tmp_path / pkg).mkdir()
    (tmp_path / "device_sim" / "a.py").write_text("import edgetrain.runtime\n")
    (tmp_path / "edgetrain" / "cli").mkdir()
    (tmp_path / "edgetrain" / "cli" / "b.py").write_text("import device_sim.a\n")  # exempt
    assert violations(tmp_path) == []
    (tmp_path / "edgetrain" / "b.py").write_text("import device_sim.a\n")
    found = violations(tmp_path)
    assert any(v.startswith("cycle between packages") for v in found), found
