"""The README, run as a new user runs it: every Python example and every command, in order, in a fresh copy
of the repository (its git-tracked files, no `runs/`), each one's output checked.

`markdown_support` reads the README (the same reader as the docs' test). The steps share one copy, so each
sees what the steps before it left (the tour is one story on one store). A test asks for its step; the
steps before it run first if they have not yet. A block marked `check` (a command that takes many minutes,
or that this suite cannot run) has its command lines checked, not run; one marked `skip` is skipped with
its reason; so are the commands that read `../shared/` when that data is not beside the repository.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson
import pytest

from markdown_support import REPO, Block, check_command, parse_blocks, read_blocks, run_command, unaccounted

pytestmark = pytest.mark.slow

SHARED = REPO.parent / "shared"
BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Step:
    """One runnable piece of the README: a Python example (`python`), or one command line of a block
    (`bash`); `marker` is `check` or `skip` when its block's marker says it is not run, for reason `why`."""

    kind: str
    text: str
    marker: str | None = None
    why: str | None = None

    @property
    def name(self) -> str:
        """A short id for the test: the command line, or the first line of the example that says something."""
        if self.kind == "bash":
            return self.text.split("  #")[0].strip()
        top = [line for line in self.text.splitlines() if re.match(r"[a-z]", line)]
        body = [line for line in top if not line.startswith(("from ", "import "))]
        return f"python: {body[0]}" if body else "python"


def readme_steps(blocks: list[Block]) -> list[Step]:
    """The README's Python examples and command lines, in reading order."""
    steps: list[Step] = []
    for block in blocks:
        marker = block.kind if block.kind in ("check", "skip") else None
        why = block.check or block.skip
        if block.language == "python":
            steps.append(Step("python", block.text, marker, why))
        elif block.kind in ("script", "console") or marker:
            steps += [Step("bash", line.strip(), marker, why) for line in block.command_lines()]
    return steps


BLOCKS = read_blocks(REPO / "README.md")
STEPS = readme_steps(BLOCKS)


@dataclass
class Result:
    """What one step printed."""

    code: int
    out: str
    err: str = ""


@dataclass
class Tour:
    """The fresh copy the README runs in, the steps run so far, and what they taught (session ids)."""

    root: Path
    results: dict[int, Result | str] = field(default_factory=dict)
    ids: dict[str, str] = field(default_factory=dict)

    def env(self, extra: dict[str, str]) -> dict[str, str]:
        """The environment of a step: this interpreter's `sessionrl` first on PATH, the copy's code, no
        store or tokens inherited from the caller, wide tables."""
        env = {k: v for k, v in os.environ.items() if k not in ("SESSIONRL_DB", "SESSIONRL_TOKENS")}
        env |= {"PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}", "PYTHONPATH": str(self.root / "src")}
        return env | {"COLUMNS": "200", "NO_COLOR": "1"} | extra

    def result(self, index: int) -> Result | str:
        """The result of step `index` (why it was not run, for one that was not), running earlier steps
        first."""
        for i in range(index + 1):
            if i not in self.results:
                self.results[i] = self.run(i, STEPS[i])
        return self.results[index]

    def run(self, index: int, step: Step) -> Result | str:
        if step.marker is not None:
            return f"{step.why} (not run)"
        if step.kind == "python":
            script = self.root.parent / f"readme_example_{index}.py"
            script.write_text(step.text, encoding="utf-8")
            return self.execute([sys.executable, str(script)], {})
        words = shlex.split(step.text, comments=True)
        extra = {}
        while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
            name, value = words.pop(0).split("=", 1)
            extra[name] = value
        shared = [w for w in [*words, *extra.values()] if w.startswith("../shared/")]
        if shared and not all((self.root / w).exists() for w in shared):
            return f"the shared data ({', '.join(shared)}) is not beside the repository"
        words = [self.ids.get("rated", w) if w == "<session-id>" else w for w in words]
        if words[:2] == ["sessionrl", "serve"]:
            return self.serve(words, extra)
        return self.execute(words, extra)

    def execute(self, argv: list[str], extra: dict[str, str]) -> Result:
        done = run_command(argv, self.root, self.env(extra))
        return Result(done.returncode, done.stdout, done.stderr)

    def serve(self, argv: list[str], extra: dict[str, str]) -> Result:
        """Start the server on a free port, wait for its "listening on" line, ask it one question, stop it."""
        process = subprocess.Popen(
            [*argv, "--port", "0"],
            cwd=self.root,
            env=self.env(extra),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert process.stderr is not None
        said, token = [], ""
        try:
            for line in process.stderr:
                said.append(line)
                if line.startswith("no tokens given"):
                    token = line.split()[-1]
                if line.startswith("listening on "):
                    base = line.split()[-1]
                    health = httpx.get(f"{base}/healthz", timeout=30)
                    sessions = httpx.get(
                        f"{base}/v1/sessions", headers={"Authorization": f"Bearer {token}"}, timeout=30
                    )
                    said.append(
                        f"healthz {health.status_code}; sessions {sessions.status_code} {sessions.text}\n"
                    )
                    break
        finally:
            process.send_signal(signal.SIGINT)
            out, rest = process.communicate(timeout=60)
        return Result(process.returncode, out, "".join(said) + rest)


@pytest.fixture(scope="module")
def tour(tmp_path_factory: pytest.TempPathFactory) -> Tour:
    """A fresh copy of the repository's tracked files (as they are in the working tree), with the shared
    data beside it where the README expects it."""
    base = tmp_path_factory.mktemp("readme")
    root = base / "sessionrl"
    tracked = (
        subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, tracked):
        source = REPO / name
        if source.is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, root / name)
    if SHARED.is_dir():
        (base / "shared").symlink_to(SHARED)
    assert not (root / "runs").exists()
    return Tour(root)


def one_line_json(out: str) -> dict[str, object]:
    """The JSON object on the last line of a command's output."""
    loaded: dict[str, object] = orjson.loads(out.strip().splitlines()[-1])
    return loaded


def check_rated(tour: Tour, r: Result) -> None:
    match = re.fullmatch(r"(\S+) finished plan=0 execution=\d+ feedback=1", r.out.strip())
    assert match, r.out
    tour.ids["rated"] = match.group(1)


def check_ordered(tour: Tour, r: Result) -> None:
    match = re.fullmatch(r"(\S+) True finished", r.out.strip())
    assert match, r.out
    tour.ids["ordered"] = match.group(1)


def check_serve(tour: Tour, r: Result) -> None:
    assert "no tokens given; use this one (read, write):" in r.err
    assert re.search(r"^listening on http://127\.0\.0\.1:\d+$", r.err, re.M), r.err
    assert "healthz 200; sessions 200" in r.err
    for key in ("rated", "ordered"):
        assert tour.ids[key] in r.err  # the service serves the tour's store


def check_list(tour: Tour, r: Result) -> None:
    assert "2 most recent sessions" in r.out
    for key in ("rated", "ordered"):
        assert tour.ids[key] in r.out


def check_fraction(tour: Tour, r: Result) -> None:
    assert re.search(r"┃ matched ┃ called ┃ fraction ┃", re.sub(r" +", " ", r.out)), r.out
    assert re.search(r"│ 1 │ 0 │ 0 │", re.sub(r" +", " ", r.out)), r.out  # the rated session, no CRP test


def check_sql(tour: Tour, r: Result) -> None:
    assert re.search(r"│ crp_test_request │ 1 │ 0 │", re.sub(r" +", " ", r.out)), r.out  # the tour's call


def check_schema(tour: Tour, r: Result) -> None:
    assert "wrote runs/schemas/session.v1.schema.json" in r.out
    assert (tour.root / "runs" / "schemas" / "session.v1.schema.json").is_file()
    assert not (tour.root / "schemas").exists()


def check_explain(tour: Tour, r: Result) -> None:
    assert tour.ids["rated"] in r.out
    for text in ("human_rating", "layers", "normaliser:", "rating 4.0"):
        assert text in r.out


def check_env_run(tour: Tour, r: Result) -> None:
    summary = one_line_json(r.out)
    assert summary["n"], summary
    assert summary["success_rate"] == 1.0, summary


def contains(*texts: str) -> Callable[[Tour, Result], None]:
    def check(tour: Tour, r: Result) -> None:
        for text in texts:
            assert text in r.out, (text, r.out)

    return check


CHECKS: list[tuple[str, Callable[[Tour, Result], None]]] = [
    ("python: with SessionStore.open", check_rated),
    ("python: async def main", check_ordered),
    ("sessionrl serve", check_serve),
    ("sessionrl sessions list", check_list),
    ("sessionrl sessions query --comment-contains", check_fraction),
    ("sessionrl sessions query --sql", check_sql),
    ("sessionrl store check", contains("checked 2 session(s): 0 disagreement(s), 0 repaired")),
    ("sessionrl store archive", contains("archived 2 session(s) to file://runs/archive")),
    ("sessionrl schema export", check_schema),
    ("sessionrl rewards score", contains("2 sessions: 2 new reward versions")),
    ("sessionrl rewards explain", check_explain),
    ("sessionrl rewards rescore", contains("1 sessions: 0 new reward versions, 1 unchanged")),
    ("sessionrl envs list", contains("orders", "retail", "clinic")),
    ("sessionrl envs run-expert", check_env_run),
    ("sessionrl envs replay-gold", check_env_run),
    (
        "sessionrl train examples/orders-grpo-small.yaml",
        contains("plan: ", "stage: rl", "run folder: runs/orders-grpo-small"),
    ),
]
"""What a step must print, by the start of its name; any other step must exit 0 and print something."""


@pytest.mark.timeout(900)  # a step runs the steps before it first; the small training run takes minutes
@pytest.mark.parametrize("index", range(len(STEPS)), ids=[f"{i:02d} {s.name}" for i, s in enumerate(STEPS)])
def test_readme_step(index: int, tour: Tour) -> None:
    step = STEPS[index]
    if step.marker == "check":  # checked where it stands, without the steps before it
        problem = check_command(step.text)
        assert problem is None, f"{step.name} ({step.why}): {problem}"
        return
    result = tour.result(index)
    if isinstance(result, str):
        pytest.skip(result)
    stopped = 130 if step.name.startswith("sessionrl serve") else 0  # Ctrl-C (SIGINT) stops the server
    assert result.code in (0, stopped), f"{step.name} exited {result.code}\n{result.out}\n{result.err}"
    check = next((check for start, check in CHECKS if step.name.startswith(start)), None)
    if check is None:
        assert result.out.strip() or result.err.strip(), f"{step.name} printed nothing"
    else:
        check(tour, result)


def test_the_tour_is_all_there() -> None:
    """Every check above meets a step that runs, so a README edit cannot drop a step of the tour
    unnoticed, nor mark it as only checked."""
    names = [s.name for s in STEPS if s.marker is None]
    for start, _ in CHECKS:
        assert any(n.startswith(start) for n in names), f"no README step that runs starts with {start!r}"


def test_every_block_is_run_checked_or_shown_on_purpose() -> None:
    assert unaccounted(BLOCKS) == []


def test_marked_blocks_are_checked_or_skipped_line_by_line() -> None:
    markdown = (
        "<!-- check: trains for an hour -->\n```bash\nmake demo   # the demo\nsessionrl train x.yaml\n```\n"
        "```bash\nsessionrl sessions list\n```\n<!-- skip: a fragment -->\n```python\nagent.run()\n```\n"
    )
    steps = readme_steps(parse_blocks("README.md", markdown))
    assert [(s.name, s.marker, s.why) for s in steps] == [
        ("make demo", "check", "trains for an hour"),
        ("sessionrl train x.yaml", "check", "trains for an hour"),
        ("sessionrl sessions list", None, None),
        ("python: agent.run()", "skip", "a fragment"),
    ]
