"""The pages of `docs/`, run as a reader runs them: every Python block and every command, in order, in a
fresh folder per page, each command's output checked against what the page shows under it.

A page marks its blocks with HTML comments just before them (invisible once rendered):

- `<!-- file: PATH -->`: the block is the content of PATH (relative to the page's folder); several blocks
  for one path are joined in order. A file of Python is run when a later block imports it.
- `<!-- check: REASON -->`: the block's commands need what a test cannot have (a long training run, a
  server, a cluster, data of one's own); they are not run but checked as far as can be without running
  them: every `sessionrl` command line parses (its `--help` is asked with the same arguments), every file
  of the repository it names exists, `python SCRIPT` declares the options it is given, `make TARGET` is a
  target, and an extra in `pip install 'sessionrl[EXTRA]'` is one pyproject.toml declares. The reason
  says why.
- `<!-- skip: REASON -->`: the block is not run; its test is skipped with the reason.

Then a ```python block runs as a script in the page's folder, or as a doctest when it starts with `>>> `
(its outputs are checked). A ```console block is commands: each `$ ` line (with the lines it continues
onto with a trailing backslash) runs in bash in the page's folder and must exit 0, and every line under it
must appear in what it printed (spaces collapsed). A ```bash or ```sh block runs as one bash script that
stops at the first failing command. Any other block (a folder tree, a config shown for reading) is not
run. So every block a reader could run is run, checked, or skipped with its reason in the page.

A page runs in a virtual environment of its own that sees this interpreter's packages (sessionrl included)
and puts its own `python`, `pip` and `sessionrl` first on PATH, so what a page installs never reaches the
project's environment. `pip install` runs with `--no-deps --no-build-isolation`, so no network is needed.
Pages whose blocks another test runs are listed in `RUN_ELSEWHERE` with that test.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import sysconfig
import tomllib
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

REPO = Path(__file__).resolve().parents[1]
RUN_ELSEWHERE = {
    "http.md": "tests/service/test_http_doc.py runs its curl examples in order against sessionrl serve",
}
"""Pages whose blocks another test runs, and which."""
PAGES = tuple(sorted(p.name for p in (REPO / "docs").glob("*.md") if p.name not in RUN_ELSEWHERE))
"""The pages of docs/ whose blocks this module runs: all the others."""
SHOWN = ("", "yaml", "json", "toml", "sql", "markdown", "text", "http")
"""Languages of blocks shown for reading (configs, data, queries, trees), never run."""
SCRIPTS = ("bash", "sh", "shell")
"""Languages of blocks that run as one bash script."""
RUNNABLE = ("python", "console", *SCRIPTS)
"""Languages of blocks a reader could run: each one is run, checked or skipped with a reason."""
REPO_FILE = re.compile(r"^(examples|bench|docs|src|tests)/")
"""A command's argument that names a file of the repository (checked to exist)."""
COMMAND_TIMEOUT_S = 300
OFFLINE_PIP = ("--no-deps", "--no-build-isolation")
"""Added to every `pip install` a page runs: the test installs what the page builds, never from an index."""


@dataclass(frozen=True)
class Block:
    """One fenced block of a page, with what its marker comment says."""

    page: str
    line: int
    language: str
    text: str
    file: str | None = None
    skip: str | None = None
    check: str | None = None

    @property
    def kind(self) -> str:
        """`skip`, `check`, `file`, `doctest`, `python`, `console`, `script` (a bash block), or `shown` (a
        block that is not run)."""
        if self.skip is not None:
            return "skip"
        if self.check is not None:
            return "check"
        if self.file is not None:
            return "file"
        if self.language == "python":
            return "doctest" if self.text.lstrip().startswith(">>> ") else "python"
        if self.language == "console":
            return "console"
        return "script" if self.language in SCRIPTS else "shown"

    def command_lines(self) -> list[str]:
        """The commands of a console or bash block, each on one line (continuations joined)."""
        if self.language == "console":
            return [command for command, _ in commands(self.text)]
        return joined(self.text.splitlines())

    @property
    def name(self) -> str:
        """A short id: the file it writes, its first command, or its first line that does something."""
        if self.file is not None:
            return f"file {self.file}"
        lines = [line.removeprefix(">>> ").removeprefix("$ ") for line in self.text.splitlines()]
        body = [line for line in lines if line.strip() and not line.startswith(("from ", "import ", "#"))]
        return f"{self.language}: {body[0][:60]}" if body else self.language


BLOCK = re.compile(r"(?:<!--\s*(file|skip|check):\s*(.*?)\s*-->\s*\n)?^```(\w*)\n(.*?)^```", re.S | re.M)


def page_blocks(page: str) -> list[Block]:
    """The fenced blocks of `docs/<page>` in reading order."""
    return parse_blocks(page, (REPO / "docs" / page).read_text(encoding="utf-8"))


def parse_blocks(page: str, markdown: str) -> list[Block]:
    """The fenced blocks of `markdown`, each with its marker comment, in reading order."""
    blocks = []
    for match in BLOCK.finditer(markdown):
        marker, value, language, text = match.groups()
        line = markdown.count("\n", 0, match.start(3)) + 1
        blocks.append(
            Block(
                page,
                line,
                language,
                text,
                file=value if marker == "file" else None,
                skip=value if marker == "skip" else None,
                check=value if marker == "check" else None,
            )
        )
    return blocks


def joined(lines: list[str]) -> list[str]:
    """`lines`, each one ending in a backslash joined to the next; blank and comment lines left out."""
    out: list[str] = []
    carry = ""
    for line in lines:
        text = f"{carry} {line.strip()}".strip() if carry else line
        carry = text[:-1].rstrip() if text.endswith("\\") else ""
        if not carry and text.strip() and not text.lstrip().startswith("#"):
            out.append(text)
    return out


def commands(text: str) -> list[tuple[str, list[str]]]:
    """A console block's commands (a `$ ` line and the lines it continues onto with a trailing backslash),
    each with the output lines shown under it."""
    steps: list[tuple[str, list[str]]] = []
    continued = False
    for line in text.splitlines():
        if continued:
            steps[-1] = (f"{steps[-1][0][:-1].rstrip()} {line.strip()}", [])
        elif line.startswith("$ "):
            steps.append((line[2:], []))
        elif line.strip():
            if not steps:
                raise ValueError(f"console output {line!r} comes before any `$ ` command")
            steps[-1][1].append(line)
        continued = bool(steps) and not steps[-1][1] and steps[-1][0].endswith("\\")
    return steps


def squeeze(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def offline(command: str) -> str:
    """`command` with `OFFLINE_PIP` added when it is a `pip install`."""
    return re.sub(r"\bpip install\b", f"pip install {' '.join(OFFLINE_PIP)}", command)


def declared_extras() -> set[str]:
    """The extras pyproject.toml declares."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return set(project["optional-dependencies"])


def check_command(command: str) -> str | None:
    """What is wrong with `command`, as far as can be told without running it (None: nothing found); see
    the module doc for what is checked."""
    words = [w for w in shlex.split(command, comments=True) if w != "&"]
    while words and re.match(r"^[A-Za-z_]\w*=", words[0]):
        words.pop(0)
    missing = [w for w in words if REPO_FILE.match(w) and not (REPO / w).exists()]
    if missing:
        return f"names files the repository does not have: {missing}"
    extras = {e for w in words for group in re.findall(r"^sessionrl\[(.*)\]$", w) for e in group.split(",")}
    if extras - declared_extras():
        return f"installs extras pyproject.toml does not declare: {sorted(extras - declared_extras())}"
    cli = [i for i, w in enumerate(words) if w in ("sessionrl", "$(command -v sessionrl)")]
    if cli:
        result = CliRunner().invoke(cli_app(), [*words[cli[0] + 1 :], "--help"], terminal_width=200)
        return None if result.exit_code == 0 else f"exit status {result.exit_code}\n{result.output}"
    if words[:1] == ["python"] and len(words) > 1 and words[1].endswith(".py"):
        return script_options(REPO / words[1], [w.split("=")[0] for w in words[2:] if w.startswith("--")])
    if words[:1] == ["make"]:
        return answers(["make", "-n", *words[1:]])
    return None


def cli_app() -> typer.Typer:
    from sessionrl.cli import app  # imported when a page asks, not when the tests are collected

    return app


def script_options(script: Path, options: list[str]) -> str | None:
    """None when `script` declares every one of `options` (as the string its argument parser is given),
    else which it lacks; read, not run, since a bench imports the model stack before it parses."""
    source = script.read_text(encoding="utf-8")
    unknown = [o for o in options if f'"{o}"' not in source and f"'{o}'" not in source]
    return f"{script.name} declares no option {unknown}" if unknown else None


def answers(argv: list[str]) -> str | None:
    """None when `argv` exits 0 in the repository, else what it said."""
    done = subprocess.run(
        argv, cwd=REPO, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
    )
    return None if done.returncode == 0 else f"exit status {done.returncode}\n{done.stdout}\n{done.stderr}"


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
        done = subprocess.run(
            argv,
            cwd=self.root,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )
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
    """A block in a language this module does not know would pass unrun: each is a runnable one (run,
    checked or skipped with a reason) or one shown for reading."""
    for page in (*PAGES, *RUN_ELSEWHERE):
        for block in page_blocks(page):
            assert block.language in (*RUNNABLE, *SHOWN), f"docs/{page}:{block.line}: ```{block.language}"
            if block.language in RUNNABLE:
                assert block.kind != "shown", f"docs/{page}:{block.line}"
            if block.check is not None:  # commands are checked: a Python block is run or skipped
                assert block.language in ("console", *SCRIPTS), f"docs/{page}:{block.line}: check a command"


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
