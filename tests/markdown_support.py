"""Markdown pages read as runnable blocks: the one reader of README.md and the pages of docs/, and the one
checker of commands that are not run. tests/test_readme.py and tests/test_docs.py run what it reads.

A page marks a block with an HTML comment just before it (invisible once rendered):

- `<!-- file: PATH -->`: the block is the content of PATH (relative to the page's folder); several blocks
  for one path are joined in order.
- `<!-- check: REASON -->`: the block's commands need what a test cannot have (a long training run, a
  server, a cluster, data of one's own); they are not run but checked as far as can be without running
  them (`check_command`). The reason says why.
- `<!-- skip: REASON -->`: the block is not run; its test is skipped with the reason.

A ```python block runs as a script, or as a doctest when it starts with `>>> `. A ```console block is
commands: each `$ ` line (with the lines it continues onto with a trailing backslash) and the output shown
under it. A ```bash or ```sh block is command lines. Any other block (a folder tree, a config shown for
reading) is not run.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

import typer
from typer.testing import CliRunner

REPO = Path(__file__).resolve().parents[1]
SHOWN = ("", "yaml", "json", "toml", "sql", "markdown", "text", "http")
"""Languages of blocks shown for reading (configs, data, queries, trees), never run."""
SCRIPTS = ("bash", "sh", "shell")
"""Languages of blocks of command lines."""
RUNNABLE = ("python", "console", *SCRIPTS)
"""Languages of blocks a reader could run: each one is run, checked or skipped with a reason."""
REPO_FILE = re.compile(r"^(examples|bench|docs|src|tests)/")
"""A command's argument that names a file of the repository (checked to exist)."""
COMMAND_TIMEOUT_S = 600


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


def read_blocks(path: Path) -> list[Block]:
    """The fenced blocks of the page at `path`, in reading order."""
    return parse_blocks(path.name, path.read_text(encoding="utf-8"))


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


def unaccounted(blocks: list[Block]) -> list[str]:
    """The blocks a test would pass over silently: a language this module does not know, a runnable one
    shown for reading, a check marker on a Python block (it is run or skipped). Empty when each block is
    run, checked or skipped with a reason, or shown on purpose."""
    wrong = []
    for block in blocks:
        where = f"{block.page}:{block.line}: ```{block.language}"
        if block.language not in (*RUNNABLE, *SHOWN):
            wrong.append(f"{where}: a language neither run nor shown")
        elif block.language in RUNNABLE and block.kind == "shown":
            wrong.append(f"{where}: runnable but not run")
        elif block.check is not None and block.language not in ("console", *SCRIPTS):
            wrong.append(f"{where}: a check marker is for commands")
    return wrong


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


def run_command(
    argv: list[str], cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`argv` run to its end in `cwd` with `env` (None: this process's), its output captured as text."""
    return subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
    )


def declared_extras() -> set[str]:
    """The extras pyproject.toml declares."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return set(project["optional-dependencies"])


def check_command(command: str) -> str | None:
    """What is wrong with `command`, as far as can be told without running it (None: nothing found): every
    `sessionrl` command line parses (its `--help` is asked with the same arguments), every file of the
    repository it names exists, `python SCRIPT` declares the options it is given, `make TARGET` is a
    target, and an extra in `pip install 'sessionrl[EXTRA]'` is one pyproject.toml declares."""
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
        done = run_command(["make", "-n", *words[1:]], REPO)
        return None if done.returncode == 0 else f"exit status {done.returncode}\n{done.stdout}{done.stderr}"
    return None


def cli_app() -> typer.Typer:
    from sessionrl.cli import app  # imported when a command is checked, not when the tests are collected

    return app


def script_options(script: Path, options: list[str]) -> str | None:
    """None when `script` declares every one of `options` (as the string its argument parser is given),
    else which it lacks; read, not run, since a bench imports the model stack before it parses."""
    source = script.read_text(encoding="utf-8")
    unknown = [o for o in options if f'"{o}"' not in source and f"'{o}'" not in source]
    return f"{script.name} declares no option {unknown}" if unknown else None
