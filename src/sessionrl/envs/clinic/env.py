"""The clinic domain as a `DecisionEnv`: anemia triage from lab results, seven skills, a judge and an expert.

Skills are simulated stand-ins (see `orders.simulated`) answering from the episode's `Chart`; lab tests are
the slow ones (600–900 ms). Submitting a diagnosis ends the episode. Late feedback on finished sessions
(a validator and annotators) lives in `clinic.feedback`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from sessionrl.envs.base import Episode, ExpertPlan, Outcome, Split, Task
from sessionrl.envs.clinic import structured
from sessionrl.envs.clinic.case import Case
from sessionrl.envs.clinic.expert import expert_plan
from sessionrl.envs.clinic.judge import judge
from sessionrl.envs.clinic.tasks import generate
from sessionrl.envs.clinic.tools import TOOLS, Chart
from sessionrl.envs.faults import Faults
from sessionrl.envs.orders.simulated import DomainConfig, build_contracts, simulated_skills
from sessionrl.skills import Skill, SkillContract

Json = dict[str, Any]
CONTRACTS_DIR: Final = Path(__file__).parent / "contracts"

SYSTEM_PROMPT: Final = """You triage anemia from laboratory results with the tools given. Work-up:
- Parse the blood count report first; tests and the diagnosis need it.
- Read the guideline for the red-cell size class: microcytic (MCV below 80 fL), normocytic (80 to 100 fL)
  or macrocytic (above 100 fL), and follow it.
- Confirm before you diagnose: iron deficiency and anemia of chronic disease need ferritin and CRP; a
  thalassemia trait needs a normal ferritin and a raised HbA2 on hemoglobin electrophoresis; B12 and folate
  deficiency need the B12 and folate levels.
- Submit exactly one diagnosis with your confidence and the findings it rests on; this closes the case.
End with a report to the clinician that names the diagnosis, the findings, what they exclude, and a
follow-up plan."""


class ClinicEnv:
    """Seeded anemia cases over seven simulated skills (see `DomainConfig`)."""

    name = "clinic"
    feature_names = structured.FEATURES

    def __init__(self, config: DomainConfig | None = None) -> None:
        self.config = config or DomainConfig()
        self._contracts = build_contracts(CONTRACTS_DIR, self.config)
        self._tasks = {split: generate(self.config.seed, split, self.config.size(split)) for split in Split}

    def system_prompt(self) -> str:
        """The triage rules a policy follows."""
        return SYSTEM_PROMPT

    def contracts(self) -> Sequence[SkillContract]:
        """The seven skill contracts, sorted by name."""
        return self._contracts

    def tasks(self, split: Split) -> Sequence[Task]:
        """The cases of `split` (ids `clinic-<split>-<index>`)."""
        return self._tasks[split]

    def episode(self, task: Task, *, seed: int = 0, faults: Faults | None = None) -> ClinicEpisode:
        """A fresh chart for `task`; `seed` drives latencies, transient failures and `faults`."""
        return ClinicEpisode(self, task, seed=seed, faults=faults)

    def expert(self, task: Task) -> ExpertPlan:
        """Parse, read the guideline, order the confirming tests, submit, report."""
        return expert_plan(Case.from_payload(task.payload))


class ClinicEpisode(Episode):
    """One case over its own `Chart`; terminated once a diagnosis is submitted.

    Beyond the `Episode` protocol it offers what structured policies need: `action_mask`, `risk_flags`,
    `features`, `param_bounds`, `bind` and `summary`.
    """

    def __init__(self, env: ClinicEnv, task: Task, *, seed: int, faults: Faults | None) -> None:
        self._task = task
        self._chart = Chart(Case.from_payload(task.payload))
        self._skills = simulated_skills(
            env.contracts(), self._bind, seed=seed, task_id=task.task_id, faults=faults
        )

    def _bind(self, name: str) -> Callable[[Json], Json]:
        tool = TOOLS[name]

        def run(params: Json) -> Json:
            params = copy.deepcopy(params)
            output = tool(self._chart, **params)
            self._chart.calls.append((name, params, output))
            return copy.deepcopy(output)

        return run

    @property
    def task(self) -> Task:
        """The task attempted."""
        return self._task

    @property
    def chart(self) -> Chart:
        """The episode's state (read it; change it only through the skills)."""
        return self._chart

    @property
    def terminated(self) -> bool:
        """True once a diagnosis was submitted."""
        return self._chart.submitted is not None

    @property
    def risk_flags(self) -> tuple[str, ...]:
        """Risky calls so far, in order (see `tools.RISK_FLAGS`)."""
        return tuple(self._chart.risk_flags)

    def skills(self) -> Sequence[Skill]:
        """The seven skills bound to this episode's chart."""
        return self._skills

    def action_mask(self) -> dict[str, bool]:
        """Which skills may succeed now, by name."""
        return self._chart.mask()

    def features(self) -> tuple[float, ...]:
        """Numeric features in `ClinicEnv.feature_names` order."""
        return structured.features(self._chart)

    def param_bounds(self) -> Mapping[str, Mapping[str, tuple[float, float]]]:
        """No numeric parameter of the clinic has episode-specific bounds."""
        return {}

    def bind(self, skill: str, chosen: Mapping[str, Any]) -> Json:
        """Full parameters of a call to `skill` from a structured policy's `chosen` bounded values."""
        return structured.bind(self._chart, skill, chosen)

    def summary(self) -> str:
        """The clinical report of what the episode submitted and saw."""
        return structured.summary(self._chart)

    def state_hash(self) -> str:
        """Digest of the chart as the calls left it."""
        return self._chart.state_hash()

    def outcome(self, messages_to_user: Sequence[str]) -> Outcome:
        """Diagnosis, evidence, no risk, diagnosis named (see `clinic.judge`)."""
        return judge(self._chart, messages_to_user)
