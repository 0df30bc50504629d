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
RESULTS = [
    ("inventory_check", {"sku": "SKU-26908", "on_hand": 12, "sizes": ["S", "M"]}),
    ("waybill_generate", {"created_at": 1754986497}),
]


def test_references_resolve_with_their_json_type_or_as_text() -> None:
    ctx = Context.of(REQUEST, RESULTS)
    action = {
        "order_id": "{{user.order}}",
        "timestamp": "{{waybill_generate.created_at}}",
        "variables": {
            "text": "Order {{user.order}}: {{inventory_check.on_hand}} left",
            "size": "{{inventory_check.sizes.1}}",
        },
        "list": ["{{ user.phone }}"],
    }
    assert resolve(action, ctx) == {
        "order_id": "O-716424",
        "timestamp": 1754986497,
        "variables": {"text": "Order O-716424: 12 left", "size": "M"},
        "list": ["19993376103"],
    }


def test_unknown_references_stay_as_written() -> None:
    ctx = Context.of(REQUEST, RESULTS)
    # no sms_send result, `waybill` labels nothing in the request, paths that lead nowhere
    missing = (
        "{{sms_send.code}}",
        "{{user.waybill}}",
        "{{inventory_check.missing}}",
        "{{inventory_check.sizes.5}}",
    )
    for ref in missing:
        assert resolve(ref, ctx) == ref
    assert resolve("keep {{sms_send.a}} as is", ctx) == "keep {{sms_send.a}} as is"


def test_context_reads_the_request_and_the_latest_successful_result_of_each_tool() -> None:
    messages = [
        Message(role="system", content="sys"),
        Message(role="user", content=REQUEST),
        Message(role="assistant", content="{}"),
        tool_message(tool="inventory_check", ok=True, output={"sku": "SKU-1"}),
        tool_message(tool="sms_send", ok=False, error_code="UNAVAILABLE"),
        tool_message(tool=None, ok=False, error_code="UNPARSEABLE_ACTION"),
        tool_message(tool="inventory_check", ok=True, output={"sku": "SKU-2"}),
        Message(role="tool", content='{"tool":"sms_send","ok":true,"output":{"cut": "tex'),  # cut: unreadable
    ]
    ctx = Context.from_messages(messages)
    assert ctx.request == REQUEST
    assert ctx.results == (("inventory_check", {"sku": "SKU-1"}), ("inventory_check", {"sku": "SKU-2"}))
    assert resolve("{{inventory_check.sku}}", ctx) == "SKU-2"  # a retried call: its latest result counts


def test_abstract_prefers_the_request_form_field_then_the_earliest_result() -> None:
    ctx = Context.of(REQUEST, [("lookup", {"order": "O-716424", "stock": 12}), ("count", {"stock": 12})])
    assert abstract({"order_id": "O-716424", "n": 12, "flag": True, "name": "mug"}, ctx) == {
        "order_id": "{{user.order}}",
        "n": "{{lookup.stock}}",
        "flag": True,
        "name": "mug",
    }
    assert abstract("Order O-716424 has 12 units; 1 is reserved.", ctx) == (
        "Order {{user.order}} has {{lookup.stock}} units; 1 is reserved."
    )


ids = st.from_regex(r"[A-Z]{0,3}-?[0-9]{3,9}", fullmatch=True)


@given(
    st.lists(ids, min_size=1, max_size=4, unique=True),
    st.dictionaries(st.sampled_from("abcd"), ids, max_size=4),
)
def test_resolve_undoes_abstract(request_ids: list[str], output: dict[str, str]) -> None:
    request = " · ".join(f"field{i} {v}" for i, v in enumerate(request_ids))
    ctx = Context.of(request, [("lookup", output)])
    literal = {"first": request_ids[0], "all": list(output.values()), "text": f"id {request_ids[-1]} done"}
    assert resolve(abstract(literal, ctx), ctx) == literal


def test_a_label_in_any_script_resolves_as_abstract_wrote_it() -> None:
    ctx = Context.of("我搬家了。改寄到 369 Zhongshan Avenue · order O-756514", [])
    address = "369 Zhongshan Avenue"
    written = abstract({"new_address": address}, ctx)
    assert written == {"new_address": "{{user.改寄到}} Zhongshan Avenue"}
    assert resolve(written, ctx) == {"new_address": address}
