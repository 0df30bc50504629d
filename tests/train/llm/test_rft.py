"""Rejection-sampling fine-tuning: the dense judge's verdicts worked out by hand, a tiny `trainer: rft` run
that counts what it sampled, kept and rejected and evaluates both policies, and the kept episodes'
own tokens trained through the SFT trainer (the weights move, the loss is logged per step)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from sessionrl.session import SessionCreate, created, fold
from sessionrl.session.model import CallStatus, FinalOutput, ToolCall
from sessionrl.train.config import RunConfig
from sessionrl.train.dispatch import run_trainer
from sessionrl.train.llm import evaluation, rft
from sessionrl.train.llm.checkpoint import Stage
from sessionrl.train.llm.loop import TrainResult
from sessionrl.train.llm.sft import SFTTrainer
from tiny_run_support import SFT_SECTION, tiny_run

ROLLOUT = {"full_schemas": False, "domain_policy": False}
RFT = {
    "tasks": 2,
    "samples": 2,
    "min_kept": 1,
    "sampling": {"max_new_tokens": 16},
    "trainer": {"steps": 2, "batch_sessions": 2},
}


def term(name: str, *steps: float) -> Any:
    return SimpleNamespace(name=name, steps={f"c{i}": v for i, v in enumerate(steps)})


def test_the_dense_judge_keeps_only_answered_episodes_no_term_charged() -> None:
    call = ToolCall(call_id="c0", tool="sms_send", params={}, status=CallStatus.SUCCESS)
    bare = fold([created(SessionCreate(user_query="q"))])
    answered = bare.model_copy(update={"final_output": FinalOutput(text="done")})
    worked = answered.model_copy(update={"tool_calls": (call,)})
    fine: Any = SimpleNamespace(terms=(term("recovery", 1.0), term("policy_error")))
    charged: Any = SimpleNamespace(terms=(term("recovery", 1.0), term("policy_error", 0.0, -1.0)))
    assert rft.dense_verdict(bare, fine) == "no answer"
    assert rft.dense_verdict(answered, fine) == "no tool call"
    assert rft.dense_verdict(worked, charged) == "charged by policy_error"
    assert rft.dense_verdict(worked, fine) is None


def sampled(*replies: tuple[tuple[int, ...], tuple[float, ...]]) -> Any:
    """A session whose policy calls drew `replies` (token ids, their logprobs)."""
    calls = [
        SimpleNamespace(call_id=f"l{i}", prompt_token_ids=(1,), token_ids=ids, logprobs=lps)
        for i, (ids, lps) in enumerate(replies)
    ]
    return SimpleNamespace(llm_calls=calls)


def test_a_round_counts_its_distinct_episodes_and_the_surprise_of_their_tokens() -> None:
    one = sampled(((5, 6), (-0.5, -0.25)), ((7,), (-0.75,)))
    twin = sampled(((5, 6), (-0.5, -0.25)), ((7,), (-0.75,)))
    other = sampled(((5, 9), (-0.5, -2.5)))
    judged = rft.Judged((one, twin, other), {"task not solved": 2})
    assert judged.distinct == 2
    # tokens: 0.5 0.25 0.75, twice, then 0.5 2.5: 6.0 nats over 8 tokens
    assert judged.nats == pytest.approx(6.0 / 8)
    assert judged.as_record() == {
        "sampled": 5,
        "kept": 3,
        "distinct": 2,
        "kept_nats": 0.75,
        "rejected_task_not_solved": 2,
    }
    nothing = rft.Judged((), {"task not solved": 4})
    assert nothing.nats is None
    assert "kept_nats" not in nothing.as_record()


def keep_all(run: Any, accept: str, ran: Any) -> rft.Judged:
    """A judge that keeps every episode the round ran."""
    return rft.Judged(tuple(run.store.get(r.session_id) for r in ran), {})


def records(run_dir: Path, stage: str) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["stage"] == stage]


@pytest.mark.parametrize("accept", ["task", "dense"])
def test_an_rft_run_counts_every_episode_it_judged_and_reports_both_policies(
    accept: str, tmp_path: Path
) -> None:
    data = tiny_run(
        run_dir=str(tmp_path), trainer="rft", sft=SFT_SECTION, rollout=ROLLOUT, rft=RFT | {"accept": accept}
    )
    result = run_trainer(RunConfig.model_validate(data))
    assert isinstance(result, TrainResult)
    assert result.stage is Stage.RFT
    assert set(result.report) == {"sft", "rft"}
    (judged,) = records(tmp_path, "rft")
    rejected = sum(v for k, v in judged.items() if k.startswith("rejected_"))
    assert judged["sampled"] == 4 == judged["kept"] + rejected
    assert judged["accept"] == accept
    assert judged["distinct"] <= judged["kept"]
    assert judged.get("kept_nats", 0.0) >= 0.0
    labels = {r["label"]: r for r in records(tmp_path, "eval")}
    assert "tool_acc" in labels["rft"]
    assert "tool_acc" in labels["sft"]


def test_kept_episodes_train_on_their_own_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rft, "judge", keep_all)
    data = tiny_run(run_dir=str(tmp_path), trainer="rft", sft=SFT_SECTION, rollout=ROLLOUT, rft=RFT)
    run_trainer(RunConfig.model_validate(data))
    updates = records(tmp_path, "rft_update")
    assert [u["step"] for u in updates] == [0, 1]
    assert all(u["loss"] > 0 and u["tokens"] > 0 for u in updates)
    before = load_file(str(tmp_path / "sft_policy" / "model.safetensors"))
    after = load_file(str(tmp_path / "rft_policy" / "model.safetensors"))
    assert any(not torch.equal(before[k], after[k]) for k in before)


@pytest.fixture
def batches(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The session ids of each batch a round's imitation steps on, as the run goes."""
    stepped: list[list[str]] = []

    class Recording(SFTTrainer):
        def step(self, batch: Any) -> Any:
            stepped.append([seq.session_id for seq in batch])
            return super().step(batch)

    monkeypatch.setattr(rft, "SFTTrainer", Recording)
    return stepped


def test_replay_draws_its_share_of_each_batch_from_the_demonstrations(
    batches: list[list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rft, "judge", keep_all)
    rounds = RFT | {"replay": 0.5, "trainer": RFT["trainer"] | {"batch_sessions": 4}}
    data = tiny_run(run_dir=str(tmp_path), trainer="rft", sft=SFT_SECTION, rollout=ROLLOUT, rft=rounds)
    run_trainer(RunConfig.model_validate(data))
    assert len(batches) == 2
    for ids in batches:
        assert sum(i.startswith("demo-") for i in ids) == 2
        assert sum(i.startswith("rft-") for i in ids) == 2
    assert [u["replayed"] for u in records(tmp_path, "rft_update")] == [2, 2]


def test_replay_from_fewer_demonstrations_than_min_kept_stops_before_training(
    batches: list[list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rft, "judge", keep_all)
    rounds = RFT | {"replay": 0.5, "min_kept": 2, "dev_tasks": 2}
    few = SFT_SECTION | {"demos": 1}  # a later stage that recorded one demonstration, not imitation's
    data = tiny_run(run_dir=str(tmp_path), trainer="rft", sft=few, rollout=ROLLOUT, rft=rounds)
    with pytest.raises(ValueError, match=r"1 demonstrations, under rft.min_kept=2.*sft.demos"):
        run_trainer(RunConfig.model_validate(data))
    assert batches == []
    assert not any(r["label"].startswith("rft-dev") for r in records(tmp_path, "eval"))  # nor validated


def test_without_replay_a_round_trains_on_its_kept_episodes_alone(
    batches: list[list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rft, "judge", keep_all)
    data = tiny_run(run_dir=str(tmp_path), trainer="rft", sft=SFT_SECTION, rollout=ROLLOUT, rft=RFT)
    run_trainer(RunConfig.model_validate(data))
    assert len(batches) == 2
    assert all(i.startswith("rft-") for ids in batches for i in ids)
    assert {u["replayed"] for u in records(tmp_path, "rft_update")} == {0}


def test_a_round_that_keeps_too_few_trains_on_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rft, "judge", keep_all)
    rounds = RFT | {"min_kept": 5}  # 2 tasks x 2 episodes kept: 4
    data = tiny_run(run_dir=str(tmp_path), trainer="rft", sft=SFT_SECTION, rollout=ROLLOUT, rft=rounds)
    run_trainer(RunConfig.model_validate(data))
    assert records(tmp_path, "rft_update") == []
    (judged,) = records(tmp_path, "rft")
    assert judged["kept"] == 4
    before = load_file(str(tmp_path / "sft_policy" / "model.safetensors"))
    after = load_file(str(tmp_path / "rft_policy" / "model.safetensors"))
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_copies_of_one_episode_count_once_against_the_bar(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def keep_copies(run: Any, accept: str, ran: Any) -> rft.Judged:
        return rft.Judged((run.store.get(ran[0].session_id),) * len(ran), {})

    monkeypatch.setattr(rft, "judge", keep_copies)
    rounds = RFT | {"min_kept": 2}  # 4 kept, 1 distinct
    data = tiny_run(run_dir=str(tmp_path), trainer="rft", sft=SFT_SECTION, rollout=ROLLOUT, rft=rounds)
    run_trainer(RunConfig.model_validate(data))
    assert records(tmp_path, "rft_update") == []
    (judged,) = records(tmp_path, "rft")
    assert (judged["kept"], judged["distinct"]) == (4, 1)
    before = load_file(str(tmp_path / "sft_policy" / "model.safetensors"))
    after = load_file(str(tmp_path / "rft_policy" / "model.safetensors"))
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_dev_tasks_judge_each_round_and_the_rounds_end_on_the_policy_they_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rft, "judge", keep_all)
    data = tiny_run(
        run_dir=str(tmp_path), trainer="rft", sft=SFT_SECTION, rollout=ROLLOUT, rft=RFT | {"dev_tasks": 3}
    )
    run_trainer(RunConfig.model_validate(data))
    evals = {r["label"]: r for r in records(tmp_path, "eval")}
    (verdict,) = records(tmp_path, "rft_dev")
    assert verdict["dev_tasks"] == 3
    assert verdict["before"] == round(evals["rft-dev-0"]["success"] * 3)
    assert verdict["solved"] == round(evals["rft-dev-1"]["success"] * 3)
    assert verdict["kept"] is (verdict["solved"] >= verdict["before"])
    before = load_file(str(tmp_path / "sft_policy" / "model.safetensors"))
    after = load_file(str(tmp_path / "rft_policy" / "model.safetensors"))
    assert any(not torch.equal(before[k], after[k]) for k in before) is verdict["kept"]


def test_a_round_that_solves_fewer_dev_tasks_is_undone_and_the_next_starts_from_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    solved = iter([2, 1, 2])  # before the rounds, after round 1 (worse: undone), after round 2 (as good)
    judged: list[dict[str, torch.Tensor]] = []  # the weights each dev evaluation saw
    started: list[dict[str, torch.Tensor]] = []  # the weights each round's imitation started from

    def copy(run: Any) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in run.need_policy().model.state_dict().items()}

    def on_dev(run: Any, tasks: int, label: str) -> int:
        judged.append(copy(run))
        return next(solved)

    def imitate(run: Any, *args: Any) -> None:
        started.append(copy(run))
        real_imitate(run, *args)

    real_imitate = rft.imitate
    monkeypatch.setattr(evaluation, "solved_on_dev", on_dev)
    monkeypatch.setattr(rft, "imitate", imitate)
    monkeypatch.setattr(rft, "judge", keep_all)
    rounds = RFT | {"dev_tasks": 4, "rounds": 2}
    data = tiny_run(run_dir=str(tmp_path), trainer="rft", sft=SFT_SECTION, rollout=ROLLOUT, rft=rounds)
    run_trainer(RunConfig.model_validate(data))

    verdicts = records(tmp_path, "rft_dev")
    assert [(v["before"], v["solved"], v["kept"]) for v in verdicts] == [(2, 1, False), (2, 2, True)]
    start, after_first, after_second = judged
    assert not same(start, after_first)  # round 1 trained, and was undone:
    assert same(started[1], start)  # round 2 started from the weights before round 1
    exported = load_file(str(tmp_path / "rft_policy" / "model.safetensors"))
    assert same(exported, after_second)  # round 2 kept: the rounds end on it
    assert not same(exported, start)


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def test_validation_without_dev_tasks_says_so(tmp_path: Path) -> None:
    data = tiny_run(
        run_dir=str(tmp_path),
        trainer="rft",
        env={"dev": 0},
        sft=SFT_SECTION,
        rollout=ROLLOUT,
        rft=RFT | {"dev_tasks": 3},
    )
    with pytest.raises(ValueError, match=r"rft\.dev_tasks needs dev tasks"):
        run_trainer(RunConfig.model_validate(data))


def test_the_clean_judge_keeps_a_solved_episode_only_when_no_step_was_charged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    verdicts = {"solved-clean": None, "solved-charged": "charged by policy_error", "unsolved-clean": None}
    store = {name: SimpleNamespace(name=name) for name in verdicts}
    run: Any = SimpleNamespace(
        store=SimpleNamespace(get=store.__getitem__),
        shaper=SimpleNamespace(engine=SimpleNamespace(score=lambda s, learn: s)),
    )
    monkeypatch.setattr(rft, "dense_verdict", lambda session, vector: verdicts[session.name])
    monkeypatch.setattr(rft, "policy_turns", lambda session, advantages: [session])
    ran = [SimpleNamespace(session_id=name, success=name.startswith("solved")) for name in verdicts]
    clean = rft.judge(run, "clean", ran)
    assert [s.name for s in clean.kept] == ["solved-clean"]
    assert clean.rejected == {"charged by policy_error": 1, "task not solved": 1}
    task = rft.judge(run, "task", ran)
    assert [s.name for s in task.kept] == ["solved-clean", "solved-charged"]
    dense = rft.judge(run, "dense", ran)
    assert [s.name for s in dense.kept] == ["solved-clean", "unsolved-clean"]


GRPO_AFTER_RFT = {
    "trainer": "grpo",
    "sft": SFT_SECTION,
    "rollout": ROLLOUT,
    "rft": RFT,
    "rl": {
        "iterations": 1,
        "tasks_per_iteration": 2,
        "sampling": {"max_new_tokens": 16},
        "trainer": {"group_size": 2, "token_budget": 2048},
    },
}


def test_grpo_with_an_rft_section_samples_judges_and_imitates_between_the_gate_and_grpo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rft, "judge", keep_all)
    result = run_trainer(RunConfig.model_validate(tiny_run(run_dir=str(tmp_path), **GRPO_AFTER_RFT)))
    assert isinstance(result, TrainResult)
    assert result.stage is Stage.RL
    assert set(result.report) == {"sft", "rft", "rl"}
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    order = [r["stage"] for r in lines if r["stage"] in {"rft", "rft_update", "rl"}]
    gate = next(i for i, r in enumerate(lines) if r.get("label") == "gate")
    first_rft = next(i for i, r in enumerate(lines) if r["stage"] == "rft")
    assert gate < first_rft  # the gate judged the imitation policy, before any rejection sampling
    assert order[:3] == ["rft", "rft_update", "rft_update"]
    assert order[-1] == "rl"
    sft = load_file(str(tmp_path / "sft_policy" / "model.safetensors"))
    rft_weights = load_file(str(tmp_path / "rft_policy" / "model.safetensors"))
    assert any(not torch.equal(sft[k], rft_weights[k]) for k in sft)


def test_grpo_without_an_rft_section_goes_from_the_gate_to_grpo(tmp_path: Path) -> None:
    data = tiny_run(run_dir=str(tmp_path), **GRPO_AFTER_RFT)
    del data["rft"]
    result = run_trainer(RunConfig.model_validate(data))
    assert isinstance(result, TrainResult)
    assert set(result.report) == {"sft", "rl"}
    assert records(tmp_path, "rft") == []


def test_a_run_resumed_before_its_rounds_replays_the_demonstrations_it_reads_back(
    batches: list[list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(*_: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(rft, "judge", keep_all)
    replaying = RFT | {"replay": 0.5, "trainer": RFT["trainer"] | {"batch_sessions": 4}}
    config = RunConfig.model_validate(tiny_run(run_dir=str(tmp_path), **GRPO_AFTER_RFT | {"rft": replaying}))
    with monkeypatch.context() as stopped:
        stopped.setattr(rft, "rejection_rounds", interrupted)
        with pytest.raises(KeyboardInterrupt):
            run_trainer(config)
    assert batches == []
    result = run_trainer(config, resume=True)
    assert isinstance(result, TrainResult)
    assert result.stage is Stage.RL
    assert [sum(i.startswith("demo-") for i in ids) for ids in batches] == [2, 2]
