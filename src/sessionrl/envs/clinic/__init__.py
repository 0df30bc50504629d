"""Anemia triage from lab results, with guideline retrieval and annotators whose ratings arrive late."""

from sessionrl.envs.clinic.case import Case, Diagnosis, Panel
from sessionrl.envs.clinic.env import ClinicEnv, ClinicEpisode
from sessionrl.envs.clinic.feedback import PANEL, Annotator, annotate, deliver, schedule, validate
from sessionrl.envs.clinic.tools import RISK_FLAGS, Chart
from sessionrl.envs.registry import config_factory, register
from sessionrl.envs.simulated import DomainConfig

register("clinic", config_factory(ClinicEnv, DomainConfig))

__all__ = [
    "PANEL",
    "RISK_FLAGS",
    "Annotator",
    "Case",
    "Chart",
    "ClinicEnv",
    "ClinicEpisode",
    "Diagnosis",
    "DomainConfig",
    "Panel",
    "annotate",
    "deliver",
    "schedule",
    "validate",
]
