"""`bench/chaos.py`: servers forked from the zygote are processes of their own that SIGKILL ends and
that start again on the same store, and the JSON line gives the per-backend counts the acceptance asks."""

from __future__ import annotations

from pathlib import Path

import httpx

from chaos import SKILL, TOKEN, Zygote, alive, free_port, kill, serve_argv, start_serve, summary


def test_a_zygote_server_dies_by_sigkill_and_its_successor_serves_the_same_store(tmp_path: Path) -> None:
    skills = tmp_path / "skills"
    skills.mkdir()
    (skills / "lookup.yaml").write_text(SKILL)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    argv = serve_argv(f"sqlite:///{tmp_path / 'chaos.db'}", skills, port)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    zygote = Zygote()
    try:
        first = start_serve(zygote, argv, base)
        opened = httpx.post(f"{base}/v1/sessions", json={"user_query": "q"}, headers=auth, timeout=30)
        assert opened.status_code == 201, opened.text
        kill(first)
        assert not alive(first)
        second = start_serve(zygote, argv, base)
        assert second != first
        found = httpx.get(f"{base}/v1/sessions/{opened.json()['session_id']}", headers=auth, timeout=30)
        assert found.status_code == 200
        kill(second)
        assert not alive(second)
    finally:
        zygote.close()


def test_the_json_line_counts_trials_per_backend_and_losses_over_all() -> None:
    runs = {
        "sqlite": {"kill_trials": 1000, "acknowledged_lost": 0, "serve_kills": 100, "steps_lost": 1,
                   "serve_errors_5xx": 2},
        "postgresql": {"kill_trials": 999, "acknowledged_lost": 3, "serve_kills": 101, "steps_lost": 0,
                       "serve_errors_5xx": 0},
    }  # fmt: skip
    line = summary(runs, {"fuzz_cases": 10_000, "server_errors": 4}, 61.4)
    assert list(line)[:6] == [
        "kill_trials", "acknowledged_lost", "serve_kills", "steps_lost", "fuzz_cases", "server_errors"
    ]  # fmt: skip
    assert (line["kill_trials"], line["serve_kills"]) == (999, 100)  # the least of the two backends'
    assert (line["acknowledged_lost"], line["steps_lost"]) == (3, 1)
    assert line["server_errors"] == 6  # 4 from the fuzzing, 2 while the SQLite server was killed
    assert line["by_backend"] == runs
    assert line["seconds"] == 61
