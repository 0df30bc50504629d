"""The dashboard's settings: where the runs are, which skill contracts give SLAs, and the thresholds the
evaluation page draws."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_THRESHOLDS = {"tcsr": 0.9, "dvr": 0.95, "er5": 0.8, "cu": 0.0, "spt": 8.0}


class UIConfig(BaseModel):
    """Settings of the dashboard pages."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    runs_dir: Path = Field(default=Path("runs"), description="Folder of training runs (`runs/<name>/`).")
    skills_dir: Path | None = Field(default=None, description="Skill contracts; their SLAs label tool calls.")
    thresholds: dict[str, float] = Field(
        default_factory=lambda: dict(DEFAULT_THRESHOLDS),
        description="Evaluation thresholds by dimension (a run's `evaluation.thresholds` overrides them).",
    )
    auto_pause_falls: int | None = Field(
        default=None,
        ge=1,
        description="Auto-pause rule of the evaluation page: pause when a dimension got worse this many "
        "evaluations in a row (a run's `evaluation.auto_pause_falls` overrides it; None: no rule).",
    )
    page_size: int = Field(default=50, ge=1, le=1000, description="Sessions per page of the list.")
    live_for_s: float = Field(
        default=30.0, gt=0, description="How long one live-count stream runs before the browser reconnects."
    )
