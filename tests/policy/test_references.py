"""Value references in actions: resolution keeps types, text references become text, `abstract` inverts."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sessionrl.policy.llm import tool_message
from sessionrl.policy.references import Context, abstract, resolve
from sessionrl.session.model import Message

REQUEST = (
    "Can you change where order O-716424 goes?\n[ticket: wrong address] · order O-716424 · phone 19993376103"
)
OUTPUTS = [{"sku": "SKU-26908", "on_hand": 12, "sizes": ["S", "M"]}, None, {"created_at": 1754986497}]


def test_references_resolve_with_their_json_type_or_as_text() -> None:
    ctx = Context.of(REQUEST, OUTPUTS)
    action = {
        "order_id": "{{user.order}}",
        "timestamp": "{{3.created_at}}",
        "variables": {"text": "Order {{user.order}}: {{1.on_hand}} left", "size": "{{1.sizes.1}}"},
        "list": ["{{ user.phone }}"],
    }
    assert resolve(action, ctx) == {
        "order_id": "O-716424",
        "timestamp": 1754986497,
        "variables": {"text": "Order O-716424: 12 left", "size": "M"},
        "list": ["19993376103"],
    }


def test_unknown_references_stay_as_written() -> None:
    ctx = Context.of(REQUEST, OUTPUTS)
    # result 2 failed (no output), result 9 does not exist, `waybill` labels nothing in the request
    for ref in ("{{2.sku}}", "{{9.sku}}", "{{user.waybill}}", "{{1.missing}}", "{{1.sizes.5}}", "{{x.y}}"):
        assert resolve(ref, ctx) == ref
    assert resolve("keep {{9.a}} as is", ctx) == "keep {{9.a}} as is"


def test_context_reads_the_request_and_tool_messages_of_a_conversation() -> None:
    messages = [
        Message(role="system", content="sys"),
        Message(role="user", content=REQUEST),
        Message(role="assistant", content="{}"),
        tool_message(number=1, ok=True, output={"sku": "SKU-1"}),
        tool_message(number=2, ok=False, error_code="TIMEOUT"),
        Message(role="tool", content='{"n":3,"ok":true,"output":{"cut": "tex'),  # cut short: unreadable
    ]
    ctx = Context.from_messages(messages)
    assert ctx.request == REQUEST
    assert ctx.outputs == ({"sku": "SKU-1"}, None, None)


def test_abstract_prefers_the_request_form_field_then_the_earliest_result() -> None:
    ctx = Context.of(REQUEST, [{"order": "O-716424", "stock": 12}, {"stock": 12}])
    assert abstract({"order_id": "O-716424", "n": 12, "flag": True, "name": "mug"}, ctx) == {
        "order_id": "{{user.order}}",
        "n": "{{1.stock}}",
        "flag": True,
        "name": "mug",
    }
    assert abstract("Order O-716424 has 12 units; 1 is reserved.", ctx) == (
        "Order {{user.order}} has {{1.stock}} units; 1 is reserved."
    )


ids = st.from_regex(r"[A-Z]{0,3}-?[0-9]{3,9}", fullmatch=True)


@given(
    st.lists(ids, min_size=1, max_size=4, unique=True),
    st.dictionaries(st.sampled_from("abcd"), ids, max_size=4),
)
def test_resolve_undoes_abstract(request_ids: list[str], output: dict[str, str]) -> None:
    request = " · ".join(f"field{i} {v}" for i, v in enumerate(request_ids))
    ctx = Context.of(request, [output])
    literal = {"first": request_ids[0], "all": list(output.values()), "text": f"id {request_ids[-1]} done"}
    assert resolve(abstract(literal, ctx), ctx) == literal
