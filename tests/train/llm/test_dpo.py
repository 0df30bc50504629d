"""DPO: the preference convention read from stored sessions, reply tokens, and training on the tiny model."""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator, Sequence

import pytest
import torch

from sessionrl.policy.llm import HFPolicy, final_action, tool_action
from sessionrl.policy.tiny import TinyModelConfig, build_tiny_policy
from sessionrl.session import FeedbackAdded, LLMCallRecorded, SessionCreate
from sessionrl.session.model import Feedback, FeedbackType, LLMCall, Message
from sessionrl.store import SessionStore
from sessionrl.train.llm.data import TokenSequence, collate
from sessionrl.train.llm.dpo import (
    DPOConfig,
    DPOTrainer,
    Preference,
    reply_logprobs,
    session_preferences,
    stored_preferences,
    tokenize_preference,
)

PROMPT = (
    Message(role="system", content="You resolve fulfilment tickets. Answer with one JSON object."),
    Message(role="user", content="Is SKU-12345 in stock?"),
)
GOOD = tool_action("inventory_check", {"sku": "SKU-12345"})
BAD = final_action("I cannot help with that.")


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> HFPolicy:
    """A tiny chat LM whose tokenizer saw the prompt and both replies."""
    texts = [m.content for m in PROMPT] + [GOOD, BAD] * 4
    config = TinyModelConfig(vocab_size=400, hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128)
    model, tokenizer = build_tiny_policy(texts, config, tmp_path_factory.mktemp("tiny"))
    return HFPolicy(model, tokenizer)


@pytest.fixture
def store() -> Iterator[SessionStore]:
    with SessionStore.open("sqlite://") as opened:
        yield opened


def _session_with_calls(store: SessionStore, sid: str, responses: list[str]) -> None:
    store.create(SessionCreate(user_query=PROMPT[1].content, session_id=sid))
    for i, response in enumerate(responses):
        call = LLMCall(call_id=f"{sid}-l{i}", purpose="act", messages=PROMPT, response=response)
        store.append(sid, LLMCallRecorded(call=call))


def _prefer(store: SessionStore, sid: str, **data: str) -> None:
    store.append(sid, FeedbackAdded(feedback=Feedback(type=FeedbackType.PREFERENCE, data=data)))


def test_preferences_follow_the_convention(store: SessionStore) -> None:
    """Two call ids, or a text on one side: the prompt is the named call's messages either way."""
    _session_with_calls(store, "s1", [BAD, GOOD])
    _prefer(store, "s1", chosen_call_id="s1-l1", rejected_call_id="s1-l0")
    _session_with_calls(store, "s2", [BAD])
    _prefer(store, "s2", chosen=GOOD, rejected_call_id="s2-l0")
    _session_with_calls(store, "s3", [GOOD])  # no preference: not read
    found = stored_preferences(store)
    assert [(p.session_id, p.chosen, p.rejected) for p in found] == [("s1", GOOD, BAD), ("s2", GOOD, BAD)]
    assert all(p.messages == PROMPT for p in found)


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ({"chosen": GOOD, "rejected": BAD}, "names no call"),
        ({"chosen_call_id": "s-l0"}, "exactly one of rejected_call_id and rejected"),
        ({"chosen_call_id": "s-l0", "chosen": GOOD, "rejected": BAD}, "exactly one of chosen_call_id"),
        ({"chosen_call_id": "nope", "rejected": BAD}, "no LLM call of the session"),
    ],
)
def test_malformed_preferences_are_refused(store: SessionStore, data: dict[str, str], problem: str) -> None:
    _session_with_calls(store, "s", [GOOD])
    _prefer(store, "s", **data)
    with pytest.raises(ValueError, match=problem):
        session_preferences(store.get("s"))


def test_replies_to_different_conversations_are_refused(store: SessionStore) -> None:
    _session_with_calls(store, "s", [GOOD])
    other = LLMCall(call_id="other", messages=(PROMPT[1],), response=BAD)
    store.append("s", LLMCallRecorded(call=other))
    _prefer(store, "s", chosen_call_id="s-l0", rejected_call_id="other")
    with pytest.raises(ValueError, match="different conversations"):
        session_preferences(store.get("s"))


class LetterEncoder:
    """A stand-in `ChatEncoder`: one id per character, replies end with id 0."""

    def encode_prompt(self, messages: Sequence[Message]) -> list[int]:
        return [ord(c) for m in messages for c in m.content]

    def encode_reply(self, text: str) -> list[int]:
        return [ord(c) for c in text] + [0]


def test_pairs_are_tokenised_by_the_policys_encoder() -> None:
    pair = tokenize_preference(
        Preference("s", "f", (Message(role="user", content="hi"),), "ok", "no"), LetterEncoder()
    )
    assert pair.prompt == (ord("h"), ord("i"))
    assert (pair.chosen, pair.rejected) == ((ord("o"), ord("k"), 0), (ord("n"), ord("o"), 0))


def test_reply_logprobs_sum_only_reply_tokens(policy: HFPolicy) -> None:
    """Padding a batch changes nothing; the sum equals the per-token log-softmax summed by hand."""
    model = policy.model
    prompt, reply = [5, 9, 14, 20], [30, 31]

    def row(p: list[int], r: list[int]) -> TokenSequence:
        zeros = (0.0,) * (len(p) + len(r))
        return TokenSequence(tuple(p + r), (False,) * len(p) + (True,) * len(r), zeros, zeros)

    with torch.no_grad():
        alone = reply_logprobs(model, collate([row(prompt, reply)], pad_id=0))
        batched = reply_logprobs(model, collate([row(prompt, reply), row([7], [8, 9, 10, 11, 12])], pad_id=0))
        logits = model(input_ids=torch.tensor([prompt + reply])).logits[0].float()
    by_hand = sum(torch.log_softmax(logits[3 + j], -1)[tok].item() for j, tok in enumerate(reply))
    assert alone.item() == pytest.approx(by_hand, abs=1e-4)
    assert batched[0].item() == pytest.approx(alone.item(), abs=1e-4)


def test_training_grows_the_chosen_margin(policy: HFPolicy, store: SessionStore) -> None:
    """A few DPO steps on stored preferences: the loss leaves log 2, the implicit margin turns positive,
    the policy's own log-prob gap (chosen - rejected) grows, and the reference does not move."""
    policy = HFPolicy(copy.deepcopy(policy.model), policy.tokenizer)
    for i in range(4):
        _session_with_calls(store, f"s{i}", [BAD, GOOD])
        _prefer(store, f"s{i}", chosen_call_id=f"s{i}-l1", rejected_call_id=f"s{i}-l0")
    preferences = stored_preferences(store)
    trainer = DPOTrainer(policy, DPOConfig(steps=8, batch_size=4, lr=3e-3, beta=0.1))
    pairs = [tokenize_preference(p, policy) for p in preferences]
    with torch.no_grad():
        chosen0, rejected0 = trainer.logprobs(policy.model, pairs)
    logs = trainer.fit(preferences)
    with torch.no_grad():
        chosen1, rejected1 = trainer.logprobs(policy.model, pairs)
        ref_chosen, ref_rejected = trainer.logprobs(trainer.reference, pairs)
    assert logs[0].loss == pytest.approx(math.log(2), abs=1e-4)  # policy == reference at step 0
    assert logs[-1].loss < logs[0].loss
    assert logs[-1].margin > 0.1
    assert logs[-1].accuracy == 1.0
    assert (chosen1 - rejected1).mean() > (chosen0 - rejected0).mean() + 1.0
    torch.testing.assert_close(ref_chosen, chosen0)
    torch.testing.assert_close(ref_rejected, rejected0)
    assert policy.version == 8


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="beta > 0"):
        DPOConfig(beta=0.0)
    with pytest.raises(ValueError, match="steps >= 1"):
        DPOConfig(steps=0)
