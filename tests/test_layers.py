"""The package's imports follow the data flow: a top-level package imports only the ones below it.

The layers run from the record (session, store) through capture, environments, policies and episodes to
evaluation, training and operations, and end at the surfaces (service, dashboard, CLI). Only module-level
imports count: an import inside a function is a deliberate lazy load (of a heavy or optional dependency)
and runs after every package has loaded.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "sessionrl"

LAYERS = (
    "errors",
    "session",
    "wire",
    "client",
    "skills",
    "store",
    "orchestrator",
    "rewards",
    "capture",
    "envs",
    "policy",
    "gateway",
    "episodes",
    "eval",
    "reflection",
    "train",
    "cluster",
    "ops",
    "access",
    "ui",
    "service",
    "cli",
)
"""Lowest first: each package may import those before it, never one after it."""


def package_imports(root: Path, top: str = "sessionrl") -> dict[str, set[str]]:
    """Which top-level packages (or modules) of `root` each one imports at module level."""
    edges: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        source = path.relative_to(root).parts[0].removesuffix(".py")
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if parts[0] == top and len(parts) > 1 and parts[1] != source:
                    edges.setdefault(source, set()).add(parts[1])
    return edges


def upward_imports(edges: dict[str, set[str]], layers: tuple[str, ...]) -> list[str]:
    """Every import that goes up the layers or names a package the layers do not list, as text."""
    rank = {name: i for i, name in enumerate(layers)}
    wrong = []
    for source, targets in sorted(edges.items()):
        for target in sorted(targets):
            if source not in rank or target not in rank:
                wrong.append(f"{source} -> {target}: add the new package to LAYERS where it belongs")
            elif rank[target] > rank[source]:
                wrong.append(f"{source} -> {target}: {target} comes after {source} in the data flow")
    return wrong


def test_every_top_level_package_has_a_layer() -> None:
    names = {
        p.name.removesuffix(".py") for p in SRC.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()
    }
    assert names - {"__init__"} == set(LAYERS)


def test_imports_follow_the_layers() -> None:
    assert upward_imports(package_imports(SRC), LAYERS) == []


def test_an_added_cycle_is_caught(tmp_path: Path) -> None:
    pkg = tmp_path / "sessionrl"
    for name, imports in {"store": "from sessionrl.train.loop import fit\n", "train": ""}.items():
        (pkg / name).mkdir(parents=True)
        (pkg / name / "__init__.py").write_text(imports)
    (pkg / "train" / "loop.py").write_text(
        "from sessionrl.store import x\n\n\ndef fit():\n    import sessionrl.ui\n"
    )
    edges = package_imports(pkg)
    assert edges == {"store": {"train"}, "train": {"store"}}  # the function-level import does not count
    assert upward_imports(edges, ("store", "train")) == [
        "store -> train: train comes after store in the data flow"
    ]
