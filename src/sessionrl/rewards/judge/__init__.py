"""Judge refinement: free-text comments become structured corrections priced by a penalty table."""

from sessionrl.rewards.judge.base import Judge, JudgeError, judge_messages, parse_reply
from sessionrl.rewards.judge.endpoint import EndpointJudge
from sessionrl.rewards.judge.hf import HFJudge
from sessionrl.rewards.judge.offline import OfflineJudge
from sessionrl.rewards.judge.runner import Backend, JudgeConfig, Judgement, JudgeRunner, build_judge
from sessionrl.rewards.judge.table import (
    Correction,
    PenaltyTable,
    PenaltyTableError,
    Severity,
    default_table_path,
    load_penalty_table,
    parse_penalty_table,
)

__all__ = [
    "Backend",
    "Correction",
    "EndpointJudge",
    "HFJudge",
    "Judge",
    "JudgeConfig",
    "JudgeError",
    "JudgeRunner",
    "Judgement",
    "OfflineJudge",
    "PenaltyTable",
    "PenaltyTableError",
    "Severity",
    "build_judge",
    "default_table_path",
    "judge_messages",
    "load_penalty_table",
    "parse_penalty_table",
    "parse_reply",
]
