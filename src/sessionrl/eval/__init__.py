"""Agent-level evaluation: metrics from sessions, and reports."""

from sessionrl.episodes.verdict import task_success
from sessionrl.eval.metrics import AgentMetrics, compute, correction_uplift
from sessionrl.eval.report import metrics_table

__all__ = ["AgentMetrics", "compute", "correction_uplift", "metrics_table", "task_success"]
