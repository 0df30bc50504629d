"""The package's imports follow the data flow: a top-level package imports only the ones below it.

The layers run from the record (session, store) through capture, environments, policies and episodes to
evaluation, training and operations, and end at the surfaces (service, dashboard, CLI). An import inside a
function runs after every package has loaded, so it cannot break the import itself; but one that goes up
the layers is still a cycle in the design, hidden. Each is a deliberate lazy load of a heavy or optional
dependency, named in `LAZY_UPWARD` with its reason.
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

LAZY_UPWARD = {
    ("rewards", "policy"): "the judge's local model (torch), loaded only when a rule file asks for one",
    (
        "train",
        "cluster",
    ): "Ray rollout workers, imported only when the run's config has `cluster: {ray: ...}`",
}
"""The imports inside functions that go up the layers, each with why it cannot live at its own level."""


def package_imports(root: Path, top: str = "sessionrl", *, lazy: bool = False) -> dict[str, set[str]]:
    """Which top-level packages (or modules) of `root` each one imports at module level (with `lazy`:
    inside functions instead)."""
    edges: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        source = path.relative_to(root).parts[0].removesuffix(".py")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top_level = {id(n) for n in tree.body}
        nodes = [n for n in ast.walk(tree) if id(n) not in top_level] if lazy else tree.body
        for node in nodes:
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


def test_imports_inside_functions_go_up_only_as_named_lazy_loads() -> None:
    wrong = upward_imports(package_imports(SRC, lazy=True), LAYERS)
    named = {f"{source} -> {target}" for source, target in LAZY_UPWARD}
    assert [w for w in wrong if w.split(":")[0] not in named] == []
    assert all(any(w.startswith(n + ":") for w in wrong) for n in named), (
        "a LAZY_UPWARD entry is no longer used"
    )


def test_an_added_cycle_is_caught(tmp_path: Path) -> None:
    pkg = tmp_path / "sessionrl"
    for name, imports in {"store": "from sessionrl.train.loop import fit\n", "train": ""}.items():
        (pkg / name).mkdir(parents=True)
        (pkg / name / "__init__.py").write_text(imports)
    (pkg / "train" / "loop.py").write_text(
        "from sessionrl.store import x\n\n\ndef fit():\n    import sessionrl.ui\n"
    )
    edges = package_imports(pkg)
    assert edges == {"store": {"train"}, "train": {"store"}}  # the function-level import is apart
    assert package_imports(pkg, lazy=True) == {"train": {"ui"}}
    assert upward_imports(edges, ("store", "train")) == [
        "store -> train: train comes after store in the data flow"
    ]
