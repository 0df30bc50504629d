"""The clinic domain as a `DecisionEnv`: anemia triage from lab results, seven skills, a judge and an expert.

Skills are simulated stand-ins (see `envs.simulated`) answering from the episode's `Chart`; lab tests are
the slow ones (600–900 ms). Submitting a diagnosis ends the episode. Late feedback on finished sessions
(a validator and annotators) lives in `clinic.feedback`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from sessionrl.envs.base import ErrorKind, ExpertPlan, Outcome, Task
from sessionrl.envs.clinic import structured
from sessionrl.envs.clinic.case import Case
from sessionrl.envs.clinic.expert import expert_plan
from sessionrl.envs.clinic.judge import judge
from sessionrl.envs.clinic.tasks import generate
from sessionrl.envs.clinic.tools import TOOLS, Chart
from sessionrl.envs.faults import Faults
from sessionrl.envs.simulated import DomainConfig, SimulatedEnv, SimulatedEpisode

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


class ClinicEnv(SimulatedEnv):
    """Seeded anemia cases over seven simulated skills (see `DomainConfig`)."""

    name = "clinic"
    feature_names = structured.FEATURES
    error_kinds: Mapping[str, ErrorKind] = {"PRECONDITION_FAILED": ErrorKind.PRECONDITION}
    """A test or the diagnosis before the blood count is parsed (`sessionrl.envs.base.ClassifiesErrors`)."""

    def __init__(self, config: DomainConfig | None = None) -> None:
        super().__init__(config, contracts_dir=CONTRACTS_DIR, generate=generate)

    def system_prompt(self) -> str:
        """The triage rules a policy follows."""
        return SYSTEM_PROMPT

    def episode(self, task: Task, *, seed: int = 0, faults: Faults | None = None) -> ClinicEpisode:
        """A fresh chart for `task`; `seed` drives latencies, transient failures and `faults`."""
        return ClinicEpisode(self, task, seed=seed, faults=faults)

    def expert(self, task: Task) -> ExpertPlan:
        """Parse, read the guideline, order the confirming tests, submit, report."""
        return expert_plan(Case.from_payload(task.payload))


class ClinicEpisode(SimulatedEpisode[Chart]):
    """One case over its own `Chart`; terminated once a diagnosis is submitted.

    See `SimulatedEpisode` for what it shares with the other domains.
    """

    def __init__(self, env: ClinicEnv, task: Task, *, seed: int, faults: Faults | None) -> None:
        chart = Chart(Case.from_payload(task.payload))
        super().__init__(env.contracts(), task, chart, TOOLS, seed=seed, faults=faults)

    @property
    def chart(self) -> Chart:
        """The episode's state (read it; change it only through the skills)."""
        return self._state

    @property
    def terminated(self) -> bool:
        """True once a diagnosis was submitted."""
        return self._state.submitted is not None

    def features(self) -> tuple[float, ...]:
        """Numeric features in `ClinicEnv.feature_names` order."""
        return structured.features(self._state)

    def param_bounds(self) -> Mapping[str, Mapping[str, tuple[float, float]]]:
        """No numeric parameter of the clinic has episode-specific bounds."""
        return {}

    def bind(self, skill: str, chosen: Mapping[str, Any]) -> Json:
        """Full parameters of a call to `skill` from a structured policy's `chosen` bounded values."""
        return structured.bind(self._state, skill, chosen)

    def summary(self) -> str:
        """The clinical report of what the episode submitted and saw."""
        return structured.summary(self._state)

    def outcome(self, messages_to_user: Sequence[str]) -> Outcome:
        """Diagnosis, evidence, no risk, diagnosis named (see `clinic.judge`)."""
        return judge(self._state, messages_to_user)
