"""Every config in examples/, run small: its RL stage ends no worse than its imitation policy on held-out
tasks (not significantly: `SIGNIFICANCE`), or it stopped early and said why (the collapse watch,
`sessionrl.eval.collapse`).

"Small" keeps each example's recipe (its RL trainer, sampling, rewards, faults, group size, evaluation
faults) and shrinks what only sets the length: a tiny model, fewer demonstrations, imitation steps, tasks,
iterations and tokens. Imitation is trained long enough that most replies parse, so a recipe that unlearns
the format shows it within a few iterations (`examples/orders-grpo.yaml` with its old learning rate of
1e-3 did: TCSR 0.18 -> 0 by the third iteration).

The orders GRPO examples share one small imitation stage (their sections that shape it are the same once
made small), trained once and copied; each then resumes with its own RL stage. `cluster.yaml` runs its
recipe in this process: Ray rollouts and the shared PostgreSQL store are tested in tests/cluster.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from math import comb
from pathlib import Path
from typing import Any

import pytest
import yaml

from sessionrl.eval.collapse import unparseable_share
from sessionrl.session import CallStatus
from sessionrl.train.config import RunConfig
from sessionrl.train.dispatch import run_trainer
from sessionrl.train.llm.checkpoint import Stage
from sessionrl.train.llm.evaluation import Evaluation
from sessionrl.train.llm.loop import TrainResult
from sessionrl.train.llm.reflection import StagesResult
from sessionrl.train.structured.run import StructuredResult
from tiny_run_support import merged

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SIGNIFICANCE = 0.05
"""A small run's held-out figures count as below imitation's when a one-sided exact test says so at this
level (`fewer_p`): on 8 tasks and a dozen calls one call more or less moves TCSR by 0.08, while a collapse
(replies that stop being actions, calls that stop working) is far past it."""

SMALL_LLM: dict[str, Any] = {
    "env": {"train": 48, "dev": 8, "test": 8},  # 8 held-out tasks, whichever split an example evaluates on
    "model": {
        "tiny": {
            "vocab_size": 1024,
            "hidden_size": 64,
            "num_layers": 2,
            "num_heads": 2,
            "intermediate_size": 128,
        }
    },
    "rollout": {"max_steps": 4},
    "sft": {"demos": 16, "trainer": {"lr": 0.01, "steps": 120, "batch_sessions": 4, "token_budget": 4096}},
    "rl": {"iterations": 6, "tasks_per_iteration": 4, "sampling": {"max_new_tokens": 32}},
    "evaluation": {"tasks": 8, "gate_tasks": 4, "gate_min_success": 0.0, "max_new_tokens": 32},
}
"""The sizes of a small LLM run (the gate is opened: a tiny model trained for seconds solves nothing)."""
SMALL_RETAIL: dict[str, Any] = {"sft": {"trainer": {"steps": 60, "batch_sessions": 2}}}
"""Retail's sessions are five times as long as orders': fewer sessions per imitation step, and fewer steps."""
SMALL_STAGES: dict[str, Any] = {
    "reflection": {"tasks": 4, "held_out": 2, "trainer": {"steps": 2, "batch_sessions": 2}}
}
SMALL_DPO: dict[str, Any] = {
    "dpo": {"tasks": 4, "episodes_per_task": 2, "sampling": {"max_new_tokens": 32}, "trainer": {"steps": 10}}
}
SMALL_SFT: dict[str, Any] = {"sft": {"trainer": {"steps": 10}}}
"""Imitation alone has no later stage to compare with: a few steps show it runs."""
SMALL_RFT: dict[str, Any] = {
    "sft": {"demos": 4, "trainer": {"steps": 0}},
    "rft": {
        "rounds": 1,
        "tasks": 4,
        "samples": 2,
        "min_kept": 1,  # 8 episodes a round at this size: train on whatever the judge keeps
        "sampling": {"max_new_tokens": 32},
        "trainer": {"steps": 10},
    },
}
"""Rejection sampling starts from the shared orders imitation policy (`model.path`; rft keeps no checkpoint
to resume from): one round of 4 tasks x 2 episodes, 10 steps on what the judge kept."""
SMALL_STRUCTURED: dict[str, Any] = {"env": {"test": 50}, "evaluation": {"tasks": 50}}
"""The structured examples train as shipped (half a minute each): only their evaluation is shorter."""
SHARED_IMITATION = {
    "orders-grpo": "orders-grpo",
    "orders-grpo-small": "orders-grpo",
    "orders-stages": "orders-grpo",
    "cluster": "orders-grpo",
    "retail": "retail",
    "retail-smollm2": "retail",
    "orders-smollm2-grpo": "orders-grpo",
}
"""The GRPO examples whose small runs start from one imitation stage: that of the example named."""
Imitation = Callable[[str, "Path | None"], Path]


def small(path: Path, run_dir: Path, retail_data: Path | None = None) -> dict[str, Any]:
    """The example at `path` made small (see the module doc), running in `run_dir`."""
    data: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    data.pop("cluster", None)
    trainer = data.get("trainer", "grpo")
    if trainer in ("ppo", "aaac"):
        data = merged(data, SMALL_STRUCTURED)
    else:
        data = merged(data, {k: v for k, v in SMALL_LLM.items() if k != "rl" or trainer == "grpo"})
        data = merged(data, {"dpo": SMALL_DPO, "sft": SMALL_SFT, "rft": SMALL_RFT}.get(trainer, {}))
        data = merged(data, SMALL_STAGES if data.get("stages") else {})
        data["model"].pop(
            "gguf", None
        )  # a SmolLM2 example's recipe on the tiny model (SmolLM2 takes minutes)
        data["model"].pop("lora", None)
        data["model"].pop("path", None)  # a recipe stage's start: the earlier stage's policy (see SMALL_RFT)
        rules = (data.get("rewards") or {}).get("rules")
        if rules is not None:  # written relative to the repository, as the README runs the examples
            data["rewards"]["rules"] = str(EXAMPLES.parent / rules)
        data["sft"]["trainer"].pop("warmup_steps", None)  # so that retail and retail-smollm2 imitate alike
    if data["env"].get("name") == "retail":
        data = merged(data, SMALL_RETAIL) | {"env": {"name": "retail", "data": str(retail_data)}}
    return data | {"run_dir": str(run_dir)}


def example_ids() -> list[str]:
    return sorted(p.stem for p in EXAMPLES.glob("*.yaml"))


SAME_SMALL = {"orders-smollm2-sft": "orders-sft", "orders-smollm2-reflection": "orders-stages"}
"""Examples whose small run would repeat another's once the model is made tiny: imitation alone on orders
(only fault rates and the report's split differ), and the three stages on orders (the small run trains the
policy `model.path` names with imitation and GRPO, then reflects; reflection on a loaded policy is
tests/train/llm/test_stages_from_policy.py)."""


def skip_reason(path: Path) -> str | None:
    """Why an example cannot run here, or None."""
    if path.stem in SAME_SMALL:
        return f"made small, it runs as {SAME_SMALL[path.stem]} does"
    model = yaml.safe_load(path.read_text(encoding="utf-8")).get("model") or {}
    if model.get("vllm") is not None:
        return "samples on a vLLM server (a GPU machine, docs/engines.md)"
    return None


@pytest.fixture(scope="module")
def imitation(tmp_path_factory: pytest.TempPathFactory) -> Imitation:
    """The small imitation stage and gate (RL not started) of an example, trained when first asked for
    and kept for the module, to copy."""
    folders: dict[str, Path] = {}

    def made(name: str, retail_data: Path | None) -> Path:
        if name not in folders:
            folder = tmp_path_factory.mktemp("imitation") / name
            data = merged(small(EXAMPLES / f"{name}.yaml", folder, retail_data), {"rl": {"iterations": 0}})
            run_trainer(RunConfig.model_validate(data))
            folders[name] = folder
        return folders[name]

    return made


def fewer_p(before: tuple[int, int], after: tuple[int, int]) -> float:
    """One-sided Fisher exact p of (hits, trials) `after` having as few hits as it has, were `before` and
    `after` one rate: the hypergeometric chance of `after`'s hits or fewer among all the hits."""
    (b, n), (a, m) = before, after
    hits = a + b
    return sum(comb(m, k) * comb(n, hits - k) for k in range(a + 1)) / comb(n + m, hits)


def counts(evaluation: Evaluation) -> dict[str, tuple[int, int]]:
    """Hits and trials behind an evaluation's task success, TCSR, and share of replies that parsed."""
    sessions = evaluation.sessions
    calls = [c.status == CallStatus.SUCCESS for s in sessions for c in s.tool_calls]
    replies = sum(len(s.llm_calls) for s in sessions)
    refused = round(unparseable_share(sessions) * replies)
    solved = round(evaluation.metrics.success * len(sessions))
    return {
        "success": (solved, len(sessions)),
        "TCSR": (sum(calls), len(calls)),
        "parsed replies": (replies - refused, replies),
    }


def problems(before: Evaluation, after: Evaluation) -> list[str]:
    """Where `after` ends significantly below `before` on the same held-out tasks (empty: nowhere)."""
    old, new = counts(before), counts(after)
    return [
        f"{name} {old[name][0]}/{old[name][1]} -> {new[name][0]}/{new[name][1]} (p = {p:.3g})"
        for name in old
        if (p := fewer_p(old[name], new[name])) < SIGNIFICANCE
    ]


def test_fewer_p_is_fishers_one_sided_exact_test() -> None:
    assert fewer_p((2, 2), (0, 2)) == pytest.approx(1 / 6)  # C(2,0) C(2,2) / C(4,2)
    assert fewer_p((1, 1), (0, 1)) == pytest.approx(1 / 2)
    assert fewer_p((0, 5), (0, 5)) == 1.0  # no hits on either side: nothing fell
    assert fewer_p((9, 11), (0, 14)) < 1e-4 < fewer_p((9, 11), (10, 14))  # a collapse, one call less


@pytest.mark.parametrize("name", example_ids())
def test_every_example_holds_or_stops_and_says_why(
    name: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if (reason := skip_reason(EXAMPLES / f"{name}.yaml")) is not None:
        pytest.skip(reason)
    retail = request.getfixturevalue("retail_data") if "retail" in name else None
    run_dir = tmp_path / "run"
    data = small(EXAMPLES / f"{name}.yaml", run_dir, retail)
    resume = name in SHARED_IMITATION
    if resume:
        made: Imitation = request.getfixturevalue("imitation")
        shutil.copytree(made(SHARED_IMITATION[name], retail), run_dir)
    if data.get("trainer") == "rft":
        start = request.getfixturevalue("imitation")("orders-grpo", None) / "sft_policy"
        data = merged(data, {"model": {"path": str(start)}})
    result = run_trainer(RunConfig.model_validate(data), resume=resume)
    trained = result.train if isinstance(result, StagesResult) else result
    if isinstance(trained, StructuredResult):
        before, after = trained.report["imitation"], trained.report[str(trained.trainer)]
        assert after.completion >= before.completion, f"{name}: {before} -> {after}"
        return
    assert isinstance(trained, TrainResult)
    report = trained.report
    later = next((label for label in ("rl", "dpo", "rft") if label in report), None)
    if later is None:  # imitation alone: nothing after it to compare
        assert trained.stage is Stage.SFT
        return
    stopped = trained.stage is Stage.PAUSED and (run_dir / "pause_report.json").is_file()
    found = problems(report["sft"], report[later])
    assert stopped or not found, f"{name}: {later} below imitation without stopping: {found}"
