"""Run folders as the dashboard reads them: curves per stage, evaluation rows, failures and thresholds."""

from __future__ import annotations

from pathlib import Path

from ui_support import tiny_run

from sessionrl.ui import runs


def test_a_run_folder_reads_as_stages_curves_and_evaluations(tmp_path: Path) -> None:
    tiny_run(tmp_path / "r1")
    (tmp_path / "r1" / "metrics.jsonl").open("a").write(
        '{"stage": "rl", "step": 9, "rew'
    )  # a half-written line
    (tmp_path / "not-a-run").mkdir()
    assert runs.run_names(tmp_path) == ["r1"]
    run = runs.read_run(tmp_path, "r1")
    assert run is not None
    assert run.stages == {"sft": 6, "rl": 5, "eval": 2}
    (sft, rl) = run.curves
    assert (sft.stage, sft.xs[:2], sft.series["loss"][:2]) == ("sft", [0.0, 1.0], [2.0, 1.0])
    assert set(rl.series) == {"reward", "success", "kl"}
    assert [e["label"] for e in run.evaluations] == ["sft", "rl"]
    assert runs.failures(run.evaluations) == {"wrong_order": 3, "no_answer": 2}
    assert runs.thresholds(run.config, {"tcsr": 0.9, "spt": 8.0}) == {"tcsr": 0.85, "spt": 8.0}
    assert runs.read_run(tmp_path, "missing") is None


def test_the_evaluation_history_keeps_one_policy_in_time_order(tmp_path: Path) -> None:
    tiny_run(tmp_path / "r1")
    points = runs.evaluation_history(tmp_path, "rl")
    assert [(p.run, p.label) for p in points] == [("r1", "rl")]
    assert points[0].values == {"tcsr": 0.9, "dvr": 1.0, "er5": 0.6, "cu": None, "spt": 4.0}
    assert len(runs.evaluation_history(tmp_path)) == 2
