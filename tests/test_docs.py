"""The pages of `docs/`, run as a reader runs them: every Python block and every command, in order, in a
fresh folder per page, each command's output checked against what the page shows under it.

`markdown_support` reads the pages (the same reader as the README's test) and says what their markers
(`file`, `check`, `skip`) mean. A file of Python is run when a later block imports it. A ```python block
runs as a script in the page's folder, or as a doctest (its outputs checked). Each command of a ```console
block runs in bash in the page's folder and must exit 0, and every line under it must appear in what it
printed (spaces collapsed). A ```bash or ```sh block runs as one bash script that stops at the first
failing command. The commands of a `check` block are checked, not run. So every block a reader could run
is run, checked, or skipped with its reason in the page.

A page runs in a virtual environment of its own that sees this interpreter's packages (sessionrl included)
and puts its own `python`, `pip` and `sessionrl` first on PATH, so what a page installs never reaches the
project's environment. `pip install` runs with `--no-deps --no-build-isolation`, so no network is needed.
Pages whose blocks another test runs are listed in `RUN_ELSEWHERE` with that test.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from markdown_support import (
    REPO,
    Block,
    check_command,
    commands,
    parse_blocks,
    read_blocks,
    run_command,
    squeeze,
    unaccounted,
)

RUN_ELSEWHERE = {
    "http.md": "tests/service/test_http_doc.py runs its curl examples in order against sessionrl serve",
}
"""Pages whose blocks another test runs, and which."""
PAGES = tuple(sorted(p.name for p in (REPO / "docs").glob("*.md") if p.name not in RUN_ELSEWHERE))
"""The pages of docs/ whose blocks this module runs: all the others."""
OFFLINE_PIP = ("--no-deps", "--no-build-isolation")
"""Added to every `pip install` a page runs: the test installs what the page builds, never from an index."""


def page_blocks(page: str) -> list[Block]:
    """The fenced blocks of `docs/<page>` in reading order."""
    return read_blocks(REPO / "docs" / page)


def offline(command: str) -> str:
    """`command` with `OFFLINE_PIP` added when it is a `pip install`."""
    return re.sub(r"\bpip install\b", f"pip install {' '.join(OFFLINE_PIP)}", command)


def console_script(bin_dir: Path, python: Path, name: str) -> None:
    """Write the launcher pip writes for the console script `name` of the installed distributions."""
    (point,) = entry_points(group="console_scripts", name=name)
    module, _, attribute = point.value.partition(":")
    launcher = bin_dir / name
    launcher.write_text(
        f"#!{python}\nimport sys\nfrom {module} import {attribute.split('.')[0]}\nsys.exit({attribute}())\n",
        encoding="utf-8",
    )
    launcher.chmod(0o755)


def page_venv(where: Path) -> Path:
    """A virtual environment whose interpreter also sees this interpreter's packages; its bin folder."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=120)
    (site,) = (where / "lib").glob("python*/site-packages")
    parent = sysconfig.get_paths()["purelib"]
    (site / "_parent_packages.pth").write_text(f"import site; site.addsitedir({parent!r})\n")
    bin_dir = where / "bin"
    for name in ("pip", "sessionrl"):
        console_script(bin_dir, bin_dir / "python", name)
    return bin_dir


@dataclass
class PageRun:
    """A page's folder and environment, and the outcome of each block run so far (None: passed)."""

    page: str
    root: Path
    blocks: list[Block]
    outcomes: dict[int, str | None] = field(default_factory=dict)
    venv: Path | None = None

    @property
    def bin_dir(self) -> Path:
        """The page's environment's bin folder, made when a block first runs something."""
        if self.venv is None:
            self.venv = page_venv(self.root.parent / "venv")
        return self.venv

    def env(self) -> dict[str, str]:
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("SESSIONRL_", "PYTHONPATH"))}
        path = os.pathsep.join([str(self.bin_dir), str(Path(sys.executable).parent), keep.get("PATH", "")])
        return keep | {
            "PATH": path,
            "VIRTUAL_ENV": str(self.bin_dir.parent),
            "COLUMNS": "200",
            "NO_COLOR": "1",
        }

    def outcome(self, index: int) -> str | None:
        """What went wrong with block `index` (None when nothing did), running the blocks before it first."""
        for i in range(index + 1):
            if i not in self.outcomes:
                self.outcomes[i] = self.run(self.blocks[i])
        return self.outcomes[index]

    def run(self, block: Block) -> str | None:
        if block.kind == "file":
            assert block.file is not None
            path = self.root / block.file
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a", encoding="utf-8") as handle:
                handle.write(("\n\n" if path.stat().st_size else "") + block.text)
            return None
        if block.kind == "python":
            return self.execute(["python", "-c", block.text], [])
        if block.kind == "doctest":
            script = self.root.parent / f"{self.page}-{block.line}.txt"
            script.write_text(block.text, encoding="utf-8")
            return self.execute(["python", "-m", "doctest", "-o", "NORMALIZE_WHITESPACE", str(script)], [])
        if block.kind == "console":
            for command, shown in commands(block.text):
                problem = self.execute(["bash", "-c", offline(command)], shown)
                if problem:
                    return f"$ {command}\n{problem}"
        if block.kind == "script":
            return self.execute(["bash", "-e", "-c", offline(block.text)], [])
        if block.kind == "check":
            for command in block.command_lines():
                problem = check_command(command)
                if problem:
                    return f"$ {command}\n{problem}"
        return None

    def execute(self, argv: list[str], shown: list[str]) -> str | None:
        done = run_command(argv, self.root, self.env())
        said = f"exit status {done.returncode}\n{done.stdout}\n{done.stderr}"
        if done.returncode != 0:
            return said
        printed = squeeze(done.stdout + done.stderr)
        missing = [line for line in shown if squeeze(line) not in printed]
        return f"it never printed {missing}\n{said}" if missing else None


RUNS: dict[str, PageRun] = {}


@pytest.fixture
def page_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> PageRun:
    """The run of the page the test asks for, made once (its blocks share one folder)."""
    page: str = request.param
    if page not in RUNS:
        root = tmp_path_factory.mktemp(page.removesuffix(".md")) / "work"
        root.mkdir()
        RUNS[page] = PageRun(page, root, page_blocks(page))
    return RUNS[page]


CASES = [(page, i, block) for page in PAGES for i, block in enumerate(page_blocks(page))]


@pytest.mark.slow
@pytest.mark.timeout(900)  # a block runs the blocks before it first: an editable install, mypy, the CLI
@pytest.mark.parametrize(
    ("page_run", "index", "block"),
    CASES,
    ids=[f"{page}:{block.line} {block.name}" for page, _, block in CASES],
    indirect=["page_run"],
)
def test_docs_block(page_run: PageRun, index: int, block: Block) -> None:
    if block.skip is not None:
        pytest.skip(block.skip)
    problem = page_run.outcome(index)
    assert problem is None, f"docs/{block.page}:{block.line}: {problem}"


PLUGIN_STORY = (
    ("pip install -e .", "Successfully installed library-domain"),
    ("sessionrl envs check library ", "library passes check_env"),
    ("sessionrl envs replay-gold library ", "2 of 2 solved (success rate 1.000)"),
    ("mypy --strict library_domain.py", "Success: no issues found"),
)
"""The acceptance of a plugin domain outside the package, as docs/new-domain.md has a reader do it: the
package its blocks write installs with `pip install -e`, passes `envs check` under its entry-point name,
replays its gold plans through the CLI, and passes `mypy --strict`."""


def test_the_plugin_story_is_all_there() -> None:
    """docs/new-domain.md keeps every step of `PLUGIN_STORY`, each with the output that proves it, so an
    edit of the page cannot drop the acceptance unnoticed (test_docs_block runs and checks them)."""
    steps = [step for b in page_blocks("new-domain.md") if b.kind == "console" for step in commands(b.text)]
    for start, proof in PLUGIN_STORY:
        shown = [lines for command, lines in steps if re.sub(r"^(\w+=\S+ +)*", "", command).startswith(start)]
        assert shown, f"no command of docs/new-domain.md starts with {start!r}"
        assert any(proof in line for line in shown[-1]), f"{start!r} shows no {proof!r} under it"
    files = {b.file for b in page_blocks("new-domain.md") if b.kind == "file"}
    assert {"pyproject.toml", "library_domain.py", "library/tools.json"} <= files


def test_blocks_read_with_their_markers() -> None:
    markdown = (
        "Text.\n\n<!-- file: pkg/a.py -->\n```python\nA = 1\n```\n\n"
        "<!-- skip: needs a GPU -->\n```console\n$ nvidia-smi\n```\n```python\n>>> 1 + 1\n2\n```\n"
    )
    blocks = parse_blocks("p.md", markdown)
    assert [(b.line, b.kind, b.file, b.skip) for b in blocks] == [
        (4, "file", "pkg/a.py", None),
        (9, "skip", None, "needs a GPU"),
        (12, "doctest", None, None),
    ]
    assert blocks[1].name == "console: nvidia-smi"


def test_console_blocks_read_as_commands_and_their_output() -> None:
    assert commands("$ a --x\nout 1\n\nout 2\n$ b\n") == [("a --x", ["out 1", "out 2"]), ("b", [])]
    assert offline("pip install -e .") == "pip install --no-deps --no-build-isolation -e ."
    block = Block("p.md", 3, "python", ">>> 1 + 1\n2\n")
    assert (block.kind, Block("p.md", 3, "python", "print(1)\n").kind) == ("doctest", "python")
    assert Block("p.md", 3, "toml", "x = 1\n", skip="needs a GPU").kind == "skip"


def test_every_block_is_run_checked_or_shown_on_purpose() -> None:
    """A block in a language the reader does not know would pass unrun: each is a runnable one (run,
    checked or skipped with a reason) or one shown for reading."""
    assert [w for page in (*PAGES, *RUN_ELSEWHERE) for w in unaccounted(page_blocks(page))] == []


def test_a_block_that_would_pass_unrun_is_named() -> None:
    markdown = (
        "```ruby\nputs 1\n```\n```yaml\na: 1\n```\n"
        "<!-- check: needs a GPU -->\n```python\nimport torch\n```\n"
        "<!-- check: needs a GPU -->\n```console\n$ nvidia-smi\n```\n"
    )
    assert unaccounted(parse_blocks("p.md", markdown)) == [
        "p.md:1: ```ruby: a language neither run nor shown",
        "p.md:8: ```python: a check marker is for commands",
    ]


def test_console_continuations_and_scripts() -> None:
    assert commands("$ a \\\n    --b 1\nout\n$ c\n") == [("a --b 1", ["out"]), ("c", [])]
    script = Block("p.md", 3, "bash", "export A=1 \\\n  B=2\n# note\necho $A\n")
    assert (script.kind, script.command_lines()) == ("script", ["export A=1 B=2", "echo $A"])
    assert Block("p.md", 3, "sh", "x\n", check="needs a GPU").kind == "check"


def test_check_finds_what_a_command_gets_wrong() -> None:
    assert check_command("sessionrl rewards queue --db runs/x.db --k 5  # a comment") is None
    assert check_command("X=1 sessionrl train examples/orders-grpo.yaml --resume &") is None
    assert "No such option" in (check_command("sessionrl rewards queue --no-such-flag") or "")
    assert "No such command" in (check_command("sessionrl no-such-command") or "")
    assert "examples/nothing.yaml" in (check_command("sessionrl train examples/nothing.yaml") or "")
    assert "nosuchextra" in (check_command("pip install 'sessionrl[traces,nosuchextra]'") or "")
    assert check_command("curl http://127.0.0.1:8321/v1/sessions") is None  # nothing to check offline
    assert check_command("python bench/sampling.py --model smollm2") is None
    assert "--no-such" in (check_command("python bench/sampling.py --no-such 1") or "")
