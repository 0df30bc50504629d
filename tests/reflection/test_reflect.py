"""The offline extractor on real orders episodes: each way of spoiling the expert's plan is reflected on
with the root cause it is, in a record that goes into feedback and into the retry's request."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

import pytest

from sessionrl.envs.base import ErrorKind, ExpertPlan, Split, Task, error_kinds
from sessionrl.envs.faults import Faults
from sessionrl.envs.orders import DomainConfig, IssueType, OrdersEnv, Ticket
from sessionrl.episodes import EpisodeSpec, ScriptedAgent, run_episodes
from sessionrl.reflection import RootCause, parse_root_cause, reflect, root_cause_answer, with_reflection
from sessionrl.session import FeedbackType, Session
from sessionrl.store import SessionStore

ENV = OrdersEnv(DomainConfig(train=12, dev=1, test=1, time_factor=0))


def task_of(issue: IssueType) -> Task:
    return next(t for t in ENV.tasks(Split.TRAIN) if Ticket.from_payload(t.payload).issue is issue)


def run(task: Task, spoil: Callable[[ExpertPlan], ExpertPlan], faults: Faults | None = None) -> Session:
    plan = spoil(ENV.expert(task))
    spec = EpisodeSpec(task, faults=faults)
    with SessionStore.open("sqlite:///:memory:") as store:
        (ran,) = asyncio.run(run_episodes(ENV, [spec], ScriptedAgent("t", lambda _: plan), store))
        return store.get(ran.session_id)


def drop(tool: str) -> Callable[[ExpertPlan], ExpertPlan]:
    def spoil(plan: ExpertPlan) -> ExpertPlan:
        kept = tuple(s for s in plan.steps if s.tool != tool)
        ids = {s.id for s in kept}
        kept = tuple(
            dataclasses.replace(s, depends_on=tuple(d for d in s.depends_on if d in ids)) for s in kept
        )
        return dataclasses.replace(plan, steps=kept)

    return spoil


def change(tool: str, **params: object) -> Callable[[ExpertPlan], ExpertPlan]:
    def spoil(plan: ExpertPlan) -> ExpertPlan:
        steps = tuple(
            dataclasses.replace(s, params={**s.params, **params}) if s.tool == tool else s for s in plan.steps
        )
        return dataclasses.replace(plan, steps=steps)

    return spoil


def repeat(tool: str) -> Callable[[ExpertPlan], ExpertPlan]:
    """The plan with its `tool` step done a second time, right after the first: a call nobody asked for."""

    def spoil(plan: ExpertPlan) -> ExpertPlan:
        first = next(s for s in plan.steps if s.tool == tool)
        again = dataclasses.replace(first, id=f"{first.id}_again", depends_on=(first.id,))
        at = plan.steps.index(first) + 1
        return dataclasses.replace(plan, steps=(*plan.steps[:at], again, *plan.steps[at:]))

    return spoil


def reply(text: str) -> Callable[[ExpertPlan], ExpertPlan]:
    return lambda plan: dataclasses.replace(plan, final_message=text)


CASES = [
    # the refund is booked before the stock check: PRECONDITION_FAILED, never made good
    (IssueType.DAMAGED_ITEM, drop("inventory_check"), RootCause.WRONG_ORDER),
    # the expedite went to a waybill that does not exist
    (IssueType.LATE_DELIVERY, change("express_contact", waybill="SF0000000000"), RootCause.BAD_PARAMETER),
    # a refund amount within the order but not the one due: the call succeeds, the pattern does not
    (IssueType.DAMAGED_ITEM, change("refund_trigger", amount=0.5), RootCause.BAD_PARAMETER),
    # the ERP booking never happens
    (IssueType.LOST_PARCEL, drop("erp_sync"), RootCause.MISSING_STEP),
    # every call right, the reply says nothing of the outcome
    (IssueType.WRONG_ADDRESS, reply("All done, thanks!"), RootCause.HALLUCINATED_RESULT),
    # the address is changed a second time: an effectful call the ticket did not ask for
    (IssueType.WRONG_ADDRESS, repeat("order_update_address"), RootCause.WRONG_TOOL),
]


@pytest.mark.parametrize(
    ("issue", "spoil", "cause"), CASES, ids=[c[2].value + str(i) for i, c in enumerate(CASES)]
)
def test_spoiled_plans_are_reflected_with_their_root_cause(
    issue: IssueType, spoil: Callable[[ExpertPlan], ExpertPlan], cause: RootCause
) -> None:
    task = task_of(issue)
    failed = run(task, spoil)
    reflection = reflect(failed, ENV.expert(task), error_kinds(ENV))
    assert reflection is not None
    assert reflection.root_cause is cause, reflection
    assert reflection.plan
    assert reflection.check in reflection.hypothesis
    assert parse_root_cause(root_cause_answer(cause)) is cause
    feedback = reflection.as_feedback()
    assert feedback.type == FeedbackType.COMMENT
    assert feedback.data["reflection"]["root_cause"] == cause.value
    assert cause.value in with_reflection(task, reflection).instruction


def test_a_solved_session_needs_no_reflection_and_the_generic_extractor_still_names_a_cause() -> None:
    task = task_of(IssueType.LOST_PARCEL)
    assert reflect(run(task, lambda plan: plan)) is None
    failed = run(task, drop("erp_sync"))
    assert reflect(failed) is not None  # without the expert's plan: a cause, a generic plan


def test_a_call_that_kept_failing_is_an_ignored_error() -> None:
    task = task_of(IssueType.STOCK_INQUIRY)
    failed = run(task, lambda plan: plan, Faults(tool_error=1.0))
    reflection = reflect(failed, ENV.expert(task), error_kinds(ENV))
    assert reflection is not None
    assert reflection.root_cause is RootCause.IGNORED_ERROR
    assert reflection.call_id == failed.tool_calls[0].call_id  # the first failure never made good


def test_what_an_error_code_means_comes_from_the_environment() -> None:
    """The refund before the stock check fails with PRECONDITION_FAILED: the orders env says that is a
    call out of order; without the env's word the extractor knows only that an error was left unfixed."""
    task = task_of(IssueType.DAMAGED_ITEM)
    failed = run(task, drop("inventory_check"))
    code = next(c.error_code for c in failed.tool_calls if c.error_code is not None)
    assert (code, ENV.error_kinds[code]) == ("PRECONDITION_FAILED", ErrorKind.PRECONDITION)
    with_env = reflect(failed, ENV.expert(task), error_kinds(ENV))
    without = reflect(failed, ENV.expert(task))
    assert with_env is not None
    assert without is not None
    assert (with_env.root_cause, without.root_cause) == (RootCause.WRONG_ORDER, RootCause.IGNORED_ERROR)
    # a code the env names a parameter error is one, whatever its name
    as_parameter = reflect(failed, ENV.expert(task), {"PRECONDITION_FAILED": ErrorKind.PARAMETER})
    assert as_parameter is not None
    assert as_parameter.root_cause is RootCause.BAD_PARAMETER


def test_every_code_the_orders_env_classifies_is_one_its_contracts_declare() -> None:
    declared = {code for contract in ENV.contracts() for code in contract.errors}
    assert set(ENV.error_kinds) <= declared
    assert error_kinds(object()) == {}
