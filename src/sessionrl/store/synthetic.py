"""Realistic Decision Sessions, generated from a seed, for demos, tests and benchmarks.

Each generated session is the list of events an agent would have produced: it is created, plans (an LLM
call and a plan DAG), runs 3–8 tool calls whose latencies and failures follow per-tool profiles (timeouts
are retried, bad parameters are not), makes 1–4 LLM calls, answers with claims that cite the calls they
came from, and later receives 0–2 pieces of feedback (ratings 1–5 with comments in English or Chinese).

Session `index` of `seed` is always the same session, whatever else is generated: its random stream is
seeded from `(seed, index)` alone, and its timestamps are counted from a fixed day.

>>> [type(e).__name__ for e in session_events(seed=0, index=0)][:3]
['SessionCreated', 'StateChanged', 'LLMCallRecorded']
>>> session_events(seed=0, index=0) == session_events(seed=0, index=0)
True
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from sessionrl.errors import SessionRLError
from sessionrl.session.events import (
    Event,
    FeedbackAdded,
    LLMCallRecorded,
    OutputSet,
    PlanSet,
    SessionCreated,
    StateChanged,
    ToolCallRecorded,
)
from sessionrl.session.model import (
    Anchor,
    CallStatus,
    Claim,
    Feedback,
    FeedbackType,
    FinalOutput,
    LLMCall,
    Message,
    Plan,
    SessionCreate,
    SessionState,
    SubGoal,
    ToolCall,
)
from sessionrl.store.hot import SessionStore

EPOCH = datetime(2025, 3, 1, tzinfo=UTC)
"""Day the generated traffic starts; sessions are spread over the `SPAN_DAYS` days that follow."""

SPAN_DAYS = 30


@dataclass(frozen=True)
class ToolProfile:
    """How one tool behaves: typical latency, timeout and failure rates."""

    median_ms: float
    timeout_ms: float
    p_timeout: float
    p_bad_params: float


TOOLS: dict[str, ToolProfile] = {
    # clinical triage
    "lab_result_parser": ToolProfile(180, 5_000, 0.01, 0.05),
    "patient_history_lookup": ToolProfile(90, 3_000, 0.02, 0.02),
    "guideline_retriever": ToolProfile(420, 8_000, 0.04, 0.03),
    "drug_interaction_check": ToolProfile(140, 4_000, 0.02, 0.08),
    "crp_test_request": ToolProfile(650, 6_000, 0.08, 0.04),
    # customer service and orders
    "customer.verify": ToolProfile(45, 2_000, 0.01, 0.04),
    "order.lookup": ToolProfile(60, 2_000, 0.01, 0.03),
    "inventory.check": ToolProfile(75, 2_000, 0.02, 0.02),
    "address.update": ToolProfile(110, 3_000, 0.01, 0.10),
    "refund.trigger": ToolProfile(300, 5_000, 0.03, 0.10),
    "sms.send": ToolProfile(220, 4_000, 0.05, 0.01),
    # finance research
    "db_query": ToolProfile(260, 10_000, 0.03, 0.09),
    "pdf_parse": ToolProfile(1_400, 15_000, 0.06, 0.04),
    "news_search": ToolProfile(500, 6_000, 0.04, 0.01),
    "ratio_calculator": ToolProfile(20, 1_000, 0.00, 0.06),
}
"""Latency and failure profile of every generated tool (timeouts are retryable, bad parameters are not)."""

Choices = dict[str, tuple[Any, ...]]

PARAMS: dict[str, Choices] = {
    "lab_result_parser": {"format": ("hl7", "pdf", "csv"), "panel": ("CBC", "CMP", "CBC+CMP")},
    "patient_history_lookup": {"fields": ("conditions", "conditions,medication")},
    "guideline_retriever": {"topic": ("community pneumonia", "sepsis", "fever of unknown origin")},
    "drug_interaction_check": {"drugs": ("metformin,amoxicillin", "lisinopril,ibuprofen")},
    "crp_test_request": {"priority": ("routine", "urgent"), "site": ("ward-3", "ed", "clinic-b")},
    "customer.verify": {"method": ("otp", "email_link")},
    "order.lookup": {"order_id": ("W4821", "W7730", "W1904", "W5512")},
    "inventory.check": {"sku": ("JKT-BLU-M", "SHO-RED-42", "BAG-BLK")},
    "address.update": {"zip": ("200001", "10115", "94107"), "line1": ("12 Elm St", "88 Nanjing Rd")},
    "refund.trigger": {"amount": (19.9, 49.0, 129.0), "reason": ("damaged", "not_received")},
    "sms.send": {"template": ("refund_ok", "address_ok", "status_update")},
    "db_query": {"table": ("fundamentals", "prices"), "ticker": ("ACME", "NWD", "GLBX")},
    "pdf_parse": {"doc": ("10-K 2024", "10-Q Q3", "annual report"), "pages": ("1-40", "all")},
    "news_search": {"q": ("ACME margin", "Globex revenue", "Northwind risk")},
    "ratio_calculator": {"ratio": ("gross_margin", "debt_to_assets", "current_ratio")},
}
"""Each tool's parameters and the values a caller draws them from."""

OUTPUTS: dict[str, Choices] = {
    "lab_result_parser": {"wbc": (6.1, 9.8, 11.4, 13.2, 15.7), "flags": ("H", "H,L", "")},
    "patient_history_lookup": {"conditions": ("none", "type 2 diabetes", "COPD,hypertension")},
    "guideline_retriever": {"guideline": ("NICE NG138", "IDSA CAP 2019", "WHO IMCI"), "score": (0.71, 0.92)},
    "drug_interaction_check": {"interactions": (0, 1, 2), "severity": ("none", "moderate", "major")},
    "crp_test_request": {"order_id": ("LAB-2231", "LAB-5817", "LAB-9044"), "eta_min": (30, 45, 90)},
    "customer.verify": {"verified": (True,)},
    "order.lookup": {"status": ("shipped", "processing", "delivered"), "items": (1, 2, 3)},
    "inventory.check": {"available": (0, 3, 12, 40), "warehouse": ("SH-1", "BJ-2")},
    "address.update": {"updated": (True,)},
    "refund.trigger": {"refund_id": ("RF-1182", "RF-7764"), "state": ("pending", "approved")},
    "sms.send": {"message_id": ("SM-01", "SM-77", "SM-93")},
    "db_query": {"rows": (4, 12, 48), "cached": (True, False)},
    "pdf_parse": {"pages": (38, 112, 240), "tables": (6, 14, 31)},
    "news_search": {"hits": (3, 8, 20)},
    "ratio_calculator": {"value": (0.31, 0.42, 0.58, 1.7)},
}
"""Each tool's output fields and the values a successful call draws them from (all JSON scalars)."""


@dataclass(frozen=True)
class Step:
    """A sub-goal template: what it achieves, the tool it uses (None: LLM reasoning), its dependencies."""

    id: str
    description: str
    tool: str | None
    depends_on: tuple[str, ...] = ()
    p_included: float = 1.0


@dataclass(frozen=True)
class Scenario:
    """A domain of traffic: its requests, plan template, and the people who rate it."""

    name: str
    root_goal: str
    queries: tuple[str, ...]
    steps: tuple[Step, ...]
    annotators: tuple[str, ...]
    praise: tuple[str, ...]
    complaints: tuple[str, ...]
    tags: tuple[str, ...]


CHRONIC_COMMENTS = (
    "Recommendation ignores the patient's chronic disease history (type 2 diabetes).",
    "Needs to weigh the chronic disease (COPD) before ruling out infection.",
    "未考虑患者的慢性病史（高血压），建议重新评估。",
    "慢性病患者应先查CRP再决定是否使用抗生素。",
)
"""Clinical comments that mention chronic disease, in English and Chinese."""

CLINIC = Scenario(
    name="clinical_triage",
    root_goal="Triage the patient from lab results and recommend the next step",
    queries=(
        "68-year-old with fever 38.6°C, productive cough, WBC 13.2. What next?",
        "Patient reports fatigue and joint pain for three weeks; CBC attached.",
        "发热三天，咳嗽，白细胞偏高，请给出分诊建议。",
        "Post-op day 4, low-grade fever, wound looks clean. Lab panel attached.",
    ),
    steps=(
        Step("g1", "Parse the attached lab results", "lab_result_parser"),
        Step("g2", "Look up the patient's history and comorbidities", "patient_history_lookup"),
        Step("g3", "Retrieve the matching clinical guideline", "guideline_retriever", ("g1",)),
        Step("g4", "Check interactions with current medication", "drug_interaction_check", ("g2",), 0.5),
        Step("g5", "Request a CRP test if inflammation is suspected", "crp_test_request", ("g1", "g3"), 0.4),
        Step("g6", "Draft the triage recommendation", None, ("g3",)),
    ),
    annotators=("dr_li", "dr_okafor", "nurse_chen", "dr_moreau"),
    praise=("Clear recommendation, guideline cited correctly.", "分诊建议清晰，引用的指南正确。"),
    complaints=("Missed the elevated WBC in the summary.", "建议过于笼统，缺少具体的随访时间。"),
    tags=("clinic", "triage"),
)

ORDERS = Scenario(
    name="customer_service",
    root_goal="Resolve the customer's order request",
    queries=(
        "My order #W4821 arrived damaged, I want a refund.",
        "Can you change the delivery address for order #W7730?",
        "我的订单三天了还没发货，能查一下吗？",
        "Order #W1904 shows delivered but I never got it.",
    ),
    steps=(
        Step("g1", "Verify the customer's identity", "customer.verify"),
        Step("g2", "Look up the order", "order.lookup", ("g1",)),
        Step("g3", "Check inventory for a replacement", "inventory.check", ("g2",), 0.5),
        Step("g4", "Update the delivery address", "address.update", ("g2",), 0.3),
        Step("g5", "Trigger the refund", "refund.trigger", ("g2",), 0.5),
        Step("g6", "Notify the customer by SMS", "sms.send", ("g2",)),
        Step("g7", "Write the reply to the customer", None, ("g6",)),
    ),
    annotators=("cs_qa_1", "cs_qa_2", "customer"),
    praise=("Fast and polite, solved in one go.", "问题解决得很快，谢谢！"),
    complaints=("Refund was triggered twice.", "地址修改没有生效。"),
    tags=("orders",),
)

FINANCE = Scenario(
    name="finance_research",
    root_goal="Answer the research question from filings and market data",
    queries=(
        "How did ACME's gross margin change from 2022 to 2024?",
        "Summarise the risk factors in the latest 10-K of Northwind.",
        "比较两家公司的资产负债率。",
    ),
    steps=(
        Step("g1", "Query fundamentals from the warehouse", "db_query"),
        Step("g2", "Parse the relevant filing", "pdf_parse"),
        Step("g3", "Search recent news", "news_search", (), 0.5),
        Step("g4", "Compute the ratios", "ratio_calculator", ("g1", "g2")),
        Step("g5", "Write the research note", None, ("g4",)),
    ),
    annotators=("analyst_kim", "analyst_rossi"),
    praise=("Numbers match the filing.", "结论有数据支撑，很好。"),
    complaints=("Used the wrong fiscal year.", "Ratio computed on restated figures without saying so."),
    tags=("finance",),
)

SCENARIOS: dict[str, Scenario] = {s.name: s for s in (CLINIC, ORDERS, FINANCE)}
"""Every built-in scenario by name."""

_SCENARIO_WEIGHTS = (0.4, 0.4, 0.2)
MAX_TOOL_CALLS = 8


class _Builder:
    """Accumulates the events of one session with a clock that only moves forward."""

    def __init__(self, rng: random.Random, session_id: str, start: datetime) -> None:
        self.rng = rng
        self.session_id = session_id
        self.now = start
        self.events: list[Event] = []

    def tick(self, ms: float) -> datetime:
        """Advance the clock by `ms` milliseconds and return the new time."""
        self.now += timedelta(milliseconds=ms)
        return self.now

    def add(self, make: Callable[..., Event], **fields: Any) -> None:
        """Append an event with the next deterministic id, stamped with the current time."""
        self.events.append(make(event_id=f"{self.session_id}.e{len(self.events)}", at=self.now, **fields))

    def state(self, state: SessionState, reason: str | None = None) -> None:
        self.tick(self.rng.uniform(1, 20))
        self.add(StateChanged, state=state, reason=reason)


def session_events(seed: int, index: int) -> list[Event]:
    """The events of session `index` of the traffic generated from `seed`, in append order."""
    rng = random.Random(f"sessionrl:{seed}:{index}")
    scenario = rng.choices(list(SCENARIOS.values()), weights=_SCENARIO_WEIGHTS)[0]
    session_id = f"s{seed}-{index:07d}"
    start = EPOCH + timedelta(seconds=rng.uniform(0, SPAN_DAYS * 86_400))
    b = _Builder(rng, session_id, start)
    chronic = scenario is CLINIC and rng.random() < 0.3
    _open(b, scenario, chronic)
    plan = _plan(b, scenario, chronic)
    b.state(SessionState.EXECUTING)
    calls = _run_tools(b, plan)
    outcome = rng.random()
    if outcome < 0.02:
        return b.events  # still executing: in-flight traffic
    if outcome < 0.05:
        b.state(SessionState.REJECTED, "provenance check failed: a claim cites no executed call")
    else:
        _answer(b, scenario, calls)
        b.state(SessionState.FINISHED)
    _feedback(b, scenario, calls, chronic)
    return b.events


def generate(n: int, seed: int = 0, start: int = 0) -> Iterator[list[Event]]:
    """The event lists of sessions `start` .. `start + n - 1` of `seed`."""
    for index in range(start, start + n):
        yield session_events(seed, index)


def _open(b: _Builder, scenario: Scenario, chronic: bool) -> None:
    rng = b.rng
    create = SessionCreate(
        session_id=b.session_id,
        trace_id=f"{rng.getrandbits(128) | 1:032x}",
        user_query=rng.choice(scenario.queries),
        scenario=scenario.name,
        tags=scenario.tags,
        user_id=f"u{rng.randrange(5000):04d}",
        metadata={"channel": rng.choice(("web", "app", "api")), "chronic_condition": chronic},
    )
    b.add(SessionCreated, session_id=b.session_id, trace_id=create.trace_id, create=create)
    b.state(SessionState.PLANNING)


def _plan(b: _Builder, scenario: Scenario, chronic: bool) -> Plan:
    """Choose the sub-goals (keeping dependencies intact), record the planning LLM call and the plan."""
    rng = b.rng
    kept: list[Step] = []
    for step in scenario.steps:
        p = 0.65 if step.tool == "crp_test_request" and chronic else step.p_included
        if rng.random() < p and all(d in {k.id for k in kept} for d in step.depends_on):
            kept.append(step)
    subgoals = tuple(
        SubGoal(id=s.id, description=s.description, tool=s.tool, depends_on=s.depends_on) for s in kept
    )
    plan = Plan(root_goal=scenario.root_goal, subgoals=subgoals)
    text = "; ".join(f"{g.id}: {g.tool or 'reason'}" for g in subgoals)
    _llm(b, "plan", f"Plan the steps for: {scenario.root_goal}.", f"Plan: {text}")
    b.add(PlanSet, plan=plan)
    return plan


def _llm(b: _Builder, purpose: str, prompt: str, response: str) -> LLMCall:
    rng = b.rng
    started = b.now
    prompt_tokens, completion_tokens = rng.randint(300, 1800), rng.randint(40, 400)
    call = LLMCall(
        call_id=f"{b.session_id}.l{sum(isinstance(e, LLMCallRecorded) for e in b.events)}",
        purpose=purpose,
        messages=(Message(role="user", content=prompt),),
        response=response,
        policy_version=rng.choice((3, 4)),
        tokens_used=prompt_tokens + completion_tokens,
        started_at=started,
        finished_at=b.tick(completion_tokens * rng.uniform(12, 30)),
    )
    b.add(LLMCallRecorded, call=call)
    return call


def _run_tools(b: _Builder, plan: Plan) -> list[ToolCall]:
    """Call the tool of every tool sub-goal, retrying timeouts once or twice, within `MAX_TOOL_CALLS`."""
    calls: list[ToolCall] = []
    tool_goals = [g for g in plan.subgoals if g.tool is not None]
    for position, goal in enumerate(tool_goals):
        reserved = len(tool_goals) - position - 1
        for _ in range(3):
            call = _tool_call(b, goal, len(calls))
            calls.append(call)
            b.add(ToolCallRecorded, call=call)
            if not call.retryable or len(calls) + reserved >= MAX_TOOL_CALLS or b.rng.random() < 0.2:
                break
    for goal in plan.subgoals:
        if goal.tool is None:
            _llm(b, "step", goal.description, f"Reasoned over {len(calls)} tool results for {goal.id}.")
    return calls


def _tool_call(b: _Builder, goal: SubGoal, k: int) -> ToolCall:
    """One call drawn from the tool's profile: success, timeout (retryable) or bad parameters."""
    rng = b.rng
    assert goal.tool is not None
    profile = TOOLS[goal.tool]
    params = {name: rng.choice(values) for name, values in PARAMS[goal.tool].items()}
    started = b.tick(rng.uniform(5, 60))
    roll = rng.random()
    common: dict[str, Any] = {"call_id": f"{b.session_id}.t{k}", "subgoal_id": goal.id, "tool": goal.tool}
    if roll < profile.p_timeout:
        status, code, message, retryable = (
            CallStatus.TIMEOUT,
            "timeout",
            f"no answer in {profile.timeout_ms:.0f} ms",
            True,
        )
        latency, output = profile.timeout_ms, None
    elif roll < profile.p_timeout + profile.p_bad_params:
        name = rng.choice(list(params))
        params[name] = f"{params[name]}?"
        status, code, retryable = CallStatus.ERROR, "invalid_params", False
        message = f"parameter {name!r}: value {params[name]!r} is not accepted"
        latency, output = rng.uniform(3, 25), None
    else:
        status, code, message, retryable = CallStatus.SUCCESS, None, None, False
        latency = profile.median_ms * math.exp(rng.gauss(0.0, 0.5))
        output = {name: rng.choice(values) for name, values in OUTPUTS[goal.tool].items()}
    return ToolCall(
        **common,
        params=params,
        output=output,
        status=status,
        error_code=code,
        error_message=message,
        retryable=retryable,
        latency_ms=round(latency, 3),
        started_at=started,
        finished_at=b.tick(latency),
    )


def _answer(b: _Builder, scenario: Scenario, calls: Sequence[ToolCall]) -> None:
    """The final LLM call and an output whose claims cite the successful calls they rest on."""
    ok = [c for c in calls if c.status is CallStatus.SUCCESS]
    final = _llm(b, "final", f"Answer: {scenario.root_goal}.", f"Final answer drawing on {len(ok)} results.")
    claims = tuple(Claim(text=f"From {c.tool}: {_summary(c.output)}", call_ids=(c.call_id,)) for c in ok[:3])
    conclusion = Claim(
        text="Recommended next step follows from the evidence above.", call_ids=(final.call_id,)
    )
    text = (
        f"{scenario.root_goal}: answered from {len(ok)} tool results." if ok else "No tool result was usable."
    )
    b.add(OutputSet, output=FinalOutput(text=text, claims=(*claims, conclusion)))


def _summary(output: Any) -> str:
    if not isinstance(output, dict):
        return "no output"
    return ", ".join(f"{k}={v}" for k, v in sorted(output.items()))


def _feedback(b: _Builder, scenario: Scenario, calls: Sequence[ToolCall], chronic: bool) -> None:
    """0–2 late feedback items: a human rating with a comment, then possibly an automatic validation."""
    rng = b.rng
    count = rng.choices((0, 1, 2), weights=(0.35, 0.4, 0.25))[0]
    if count == 0:
        return
    failed = sum(c.status is not CallStatus.SUCCESS for c in calls)
    called_crp = any(c.tool == "crp_test_request" and c.status is CallStatus.SUCCESS for c in calls)
    penalty = 0.7 * failed + (1.2 if chronic and not called_crp else 0.0)
    score = min(5, max(1, round(rng.gauss(4.4 - penalty, 0.8))))
    if chronic and rng.random() < 0.6:
        comment: str | None = rng.choice(CHRONIC_COMMENTS)
    elif rng.random() < 0.75:
        comment = rng.choice(scenario.praise if score >= 4 else scenario.complaints)
    else:
        comment = None
    b.tick(rng.expovariate(1 / 3_600_000))  # ratings arrive about an hour later on average
    _add_feedback(
        b, FeedbackType.HUMAN_RATING, float(score), comment, rng.choice(scenario.annotators), Anchor()
    )
    ok = [c for c in calls if c.status is CallStatus.SUCCESS]
    if count == 2 and ok:
        b.tick(rng.uniform(1_000, 60_000))
        target = rng.choice(ok)
        passed = rng.random() < 0.85
        _add_feedback(
            b, FeedbackType.AUTO_VALIDATION, float(passed), None, "validator", Anchor(call_id=target.call_id)
        )


def _add_feedback(
    b: _Builder, kind: FeedbackType, score: float, comment: str | None, annotator: str, anchor: Anchor
) -> None:
    occurred = b.now
    delay = b.rng.choice((0.5, 2.0, 30.0, 600.0, 86_400.0))  # seconds; some feedback reaches us a day late
    feedback = Feedback(
        feedback_id=f"{b.session_id}.f{sum(isinstance(e, FeedbackAdded) for e in b.events)}",
        type=kind,
        score=score,
        comment=comment,
        annotator=annotator,
        anchor=anchor,
        occurred_at=occurred,
        received_at=occurred + timedelta(seconds=delay),
    )
    b.add(FeedbackAdded, feedback=feedback)


def batch_items(events: Sequence[Event]) -> list[tuple[str, Event, int | None]]:
    """One session's events as `append_batch` items (no version expectations)."""
    first = events[0]
    if not isinstance(first, SessionCreated):
        raise ValueError("a generated session starts with its SessionCreated event")
    return [(first.session_id, event, None) for event in events]


def ingest(
    store: SessionStore,
    n: int,
    seed: int = 0,
    *,
    batch_sessions: int = 250,
    progress: bool = False,
    console: Console | None = None,
) -> int:
    """Append `n` generated sessions through `append_batch`, `batch_sessions` sessions per transaction.

    Returns the number of events appended. Any rejected event raises: generated traffic is always valid,
    so a rejection means the store disagrees with the session model.
    """
    bar = Progress(
        TextColumn("[bold]ingest"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not progress,
    )
    appended = 0
    with bar:
        task = bar.add_task("sessions", total=n)
        for first in range(0, n, batch_sessions):
            size = min(batch_sessions, n - first)
            items = [item for events in generate(size, seed, first) for item in batch_items(events)]
            for result in store.append_batch(items):
                if isinstance(result, SessionRLError):
                    raise result
            appended += len(items)
            bar.advance(task, size)
    return appended
