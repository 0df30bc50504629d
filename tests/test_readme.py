"""The README, run as a new user runs it: every Python example and every command, in order, in a fresh copy
of the repository (its git-tracked files, no `runs/`), each one's output checked.

The steps share one copy, so each sees what the steps before it left (the tour is one story on one store).
A test asks for its step; the steps before it run first if they have not yet. Commands that take many
minutes, or that this suite cannot run, are skipped with the reason (`SKIPPED`); so are the commands that
read `../shared/` when that data is not beside the repository.
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

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
BIN = Path(sys.executable).parent
COMMAND_TIMEOUT_S = 600


@dataclass(frozen=True)
class Step:
    """One runnable piece of the README: a Python example, or one line of a bash block."""

    kind: str
    text: str

    @property
    def name(self) -> str:
        """A short id for the test: the command line, or the first line of the example that says something."""
        if self.kind == "bash":
            return self.text.split("  #")[0].strip()
        top = [line for line in self.text.splitlines() if re.match(r"[a-z]", line)]
        body = [line for line in top if not line.startswith(("from ", "import "))]
        return f"python: {body[0]}" if body else "python"


def readme_steps(markdown: str) -> list[Step]:
    """The README's Python examples and command lines, in reading order."""
    steps: list[Step] = []
    for language, body in re.findall(r"```(python|bash)\n(.*?)```", markdown, re.S):
        if language == "python":
            steps.append(Step("python", body))
        else:
            steps += [Step("bash", line.strip()) for line in body.splitlines() if line.strip()]
    return steps


STEPS = readme_steps((REPO / "README.md").read_text(encoding="utf-8"))

SKIPPED = {
    "make demo": "trains for about ten minutes on 2 cores; its config and its pieces have their own tests",
    "make test": "runs this very suite",
    "sessionrl train": "a full training run takes 30-60 minutes or more on 2 cores; tests/train run it small",
    "sessionrl eval": "needs the run folder that a full `sessionrl train` makes",
}
"""Command lines (their start, after any NAME=value) that are not run, and why."""


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
        """The result of step `index` (a skip reason for a skipped one), running earlier steps first."""
        for i in range(index + 1):
            if i not in self.results:
                self.results[i] = self.run(i, STEPS[i])
        return self.results[index]

    def run(self, index: int, step: Step) -> Result | str:
        if step.kind == "python":
            script = self.root.parent / f"readme_example_{index}.py"
            script.write_text(step.text, encoding="utf-8")
            return self.execute([sys.executable, str(script)], {})
        words = shlex.split(step.text, comments=True)
        extra = {}
        while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
            name, value = words.pop(0).split("=", 1)
            extra[name] = value
        line = " ".join(words)
        quick = "--quick" in words or any(w.endswith("-small.yaml") for w in words)
        reason = (
            None if quick else next((why for start, why in SKIPPED.items() if line.startswith(start)), None)
        )
        shared = [w for w in [*words, *extra.values()] if w.startswith("../shared/")]
        if reason is None and shared and not all((self.root / w).exists() for w in shared):
            reason = f"the shared data ({', '.join(shared)}) is not beside the repository"
        if reason is not None:
            return reason
        words = [self.ids.get("rated", w) if w == "<session-id>" else w for w in words]
        if words[:2] == ["sessionrl", "serve"]:
            return self.serve(words, extra)
        return self.execute(words, extra)

    def execute(self, argv: list[str], extra: dict[str, str]) -> Result:
        done = subprocess.run(
            argv,
            cwd=self.root,
            env=self.env(extra),
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )
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
    return orjson.loads(out.strip().splitlines()[-1])


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
    result = tour.result(index)
    if isinstance(result, str):
        pytest.skip(result)
    name = STEPS[index].name
    stopped = 130 if name.startswith("sessionrl serve") else 0  # Ctrl-C (SIGINT) stops the server
    assert result.code in (0, stopped), f"{name} exited {result.code}\n{result.out}\n{result.err}"
    check = next((check for start, check in CHECKS if name.startswith(start)), None)
    if check is None:
        assert result.out.strip() or result.err.strip(), f"{name} printed nothing"
    else:
        check(tour, result)


def test_the_tour_is_all_there() -> None:
    """Every check above meets its step, so a README edit cannot drop a step of the tour unnoticed."""
    names = [s.name for s in STEPS]
    for start, _ in CHECKS:
        assert any(n.startswith(start) for n in names), f"no README step starts with {start!r}"
