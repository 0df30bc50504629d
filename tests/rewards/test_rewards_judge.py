"""Judges: offline extractor, reply parsing, caching and fallback, an endpoint on loopback, a local model."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from rewards_support import EN_COMMENT, ZH_COMMENT

from sessionrl.rewards.judge import (
    Correction,
    EndpointJudge,
    HFJudge,
    JudgeConfig,
    JudgeError,
    JudgeRunner,
    OfflineJudge,
    PenaltyTable,
    Severity,
    parse_reply,
)
from sessionrl.rewards.judge.runner import Backend, build_judge
from sessionrl.store.synthetic import CHRONIC_COMMENTS

HIGH_ACD = Correction(missing_element="chronic_disease_exclusion", severity=Severity.HIGH)


@pytest.mark.parametrize("comment", [ZH_COMMENT, EN_COMMENT])
def test_worked_example_in_both_languages(comment: str, table: PenaltyTable) -> None:
    corrections = OfflineJudge().extract(comment, table)
    assert corrections == (HIGH_ACD,)
    assert table.penalty(corrections[0]) == -0.2


@pytest.mark.parametrize(
    ("comment", "expected"),
    [
        ("Clear recommendation, guideline cited correctly.", {}),
        ("问题解决得很快，谢谢！", {}),
        ("建议过于笼统，缺少具体的随访时间。", {"follow_up_plan": Severity.MEDIUM}),
        ("Missed the elevated WBC in the summary.", {"abnormal_lab_value": Severity.MEDIUM}),
        ("Minor: forgot the follow-up date.", {"follow_up_plan": Severity.MEDIUM}),  # cue in another clause
        ("forgot the follow-up date (a minor slip)", {"follow_up_plan": Severity.LOW}),
        ("Failed to check drug interaction, this is dangerous", {"drug_interaction": Severity.HIGH}),
        (
            "慢性病患者应先查CRP再决定是否使用抗生素。",
            {"chronic_disease_exclusion": Severity.HIGH, "crp_test": Severity.MEDIUM},
        ),
        ("The guideline is mentioned and the source is cited.", {}),  # names elements, marks no omission
    ],
)
def test_offline_extractor_rules(comment: str, expected: dict[str, Severity], table: PenaltyTable) -> None:
    found = {c.missing_element: c.severity for c in OfflineJudge().extract(comment, table)}
    assert found == expected


def test_every_chronic_comment_of_the_generator_is_understood(table: PenaltyTable) -> None:
    for comment in CHRONIC_COMMENTS:
        elements = {c.missing_element for c in OfflineJudge().extract(comment, table)}
        assert "chronic_disease_exclusion" in elements, comment


def test_unknown_elements_cost_the_default_price(table: PenaltyTable) -> None:
    odd = Correction(missing_element="Allergy History", severity=Severity.MEDIUM)
    assert odd.missing_element == "allergy_history"
    assert table.penalty(odd) == -0.1
    dearer = Correction(missing_element="drug_interaction", severity=Severity.HIGH)
    assert table.penalty(dearer) == -0.3  # its own price list


@pytest.mark.parametrize(
    "reply",
    [
        '{"corrections": [{"missing_element": "crp_test", "severity": "high"}]}',
        'Here you go:\n```json\n[{"missing_element": "crp_test", "severity": "high"}]\n```',
        '{"missing_element": "crp_test", "severity": "high"}',
    ],
)
def test_parse_reply_accepts_the_usual_shapes(reply: str) -> None:
    assert parse_reply(reply) == (Correction(missing_element="crp_test", severity=Severity.HIGH),)


@pytest.mark.parametrize(
    "reply",
    ["no json here", '{"corrections": [{"missing_element": "x", "severity": "huge"}]}', '{"corrections": 3}'],
)
def test_parse_reply_rejects_everything_else(reply: str) -> None:
    with pytest.raises(JudgeError):
        parse_reply(reply)


class Counting:
    """A backend that answers from a script and counts its calls."""

    name = "counting"

    def __init__(self, answer: tuple[Correction, ...] | Exception) -> None:
        self.answer = answer
        self.calls = 0

    def extract(self, comment: str, table: PenaltyTable) -> tuple[Correction, ...]:
        self.calls += 1
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def test_runner_caches_by_content(table: PenaltyTable) -> None:
    backend = Counting((HIGH_ACD,))
    runner = JudgeRunner(backend, cache_size=2)
    for _ in range(3):
        assert runner.judge("same comment", table).corrections == (HIGH_ACD,)
    assert backend.calls == 1
    runner.judge("b", table)
    runner.judge("c", table)  # evicts "same comment" (cache of 2)
    runner.judge("same comment", table)
    assert backend.calls == 4


def test_runner_falls_back_to_offline_and_says_why(table: PenaltyTable) -> None:
    backend = Counting(JudgeError("endpoint down"))
    runner = JudgeRunner(backend)
    judgement = runner.judge(ZH_COMMENT, table)
    assert judgement.corrections == (HIGH_ACD,)
    assert (judgement.backend, judgement.fallback) == ("offline", "counting failed: endpoint down")
    runner.judge(ZH_COMMENT, table)
    assert backend.calls == 2  # fallbacks are not cached: a recovered backend is asked again


class Endpoint(BaseHTTPRequestHandler):
    """An OpenAI-compatible chat endpoint whose behaviour the test picks."""

    mode: ClassVar[str] = "good"
    requests: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Endpoint.requests.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
        if Endpoint.mode == "error":
            self.send_response(500)
            self.end_headers()
            return
        if Endpoint.mode == "slow":
            time.sleep(1.0)
        content = {
            "good": '{"corrections": [{"missing_element": "crp_test", "severity": "high"}]}',
            "garbage": "I am sure the answer is fine.",
            "slow": "[]",
        }[Endpoint.mode]
        payload = json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except BrokenPipeError:  # the client gave up waiting (the timeout case)
            return

    def log_message(self, format: str, *args: Any) -> None:
        return


@pytest.fixture
def endpoint() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Endpoint)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    Endpoint.requests.clear()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


def test_endpoint_judge_speaks_chat_completions(endpoint: str, table: PenaltyTable) -> None:
    Endpoint.mode = "good"
    judge = EndpointJudge(endpoint, "judge-1", api_key="k3y", timeout_s=5.0)
    judgement = JudgeRunner(judge).judge(EN_COMMENT, table)
    judge.close()
    assert judgement.corrections == (Correction(missing_element="crp_test", severity=Severity.HIGH),)
    assert judgement.fallback is None
    request = Endpoint.requests[0]
    assert request["path"] == "/v1/chat/completions"
    assert request["auth"] == "Bearer k3y"
    assert request["body"]["model"] == "judge-1"
    assert EN_COMMENT in request["body"]["messages"][-1]["content"]


@pytest.mark.parametrize(("mode", "reason"), [("garbage", "no JSON"), ("error", "500"), ("slow", "Timeout")])
def test_failing_endpoint_falls_back(endpoint: str, table: PenaltyTable, mode: str, reason: str) -> None:
    Endpoint.mode = mode
    judge = EndpointJudge(endpoint, "judge-1", timeout_s=0.2)
    judgement = JudgeRunner(judge).judge(ZH_COMMENT, table)
    judge.close()
    assert judgement.corrections == (HIGH_ACD,)  # the offline answer
    assert judgement.backend == "offline"
    assert judgement.fallback is not None
    assert reason in judgement.fallback


def test_unreachable_endpoint_falls_back(table: PenaltyTable) -> None:
    judge = build_judge(JudgeConfig(backend=Backend.OPENAI, base_url="http://127.0.0.1:9", timeout_s=0.5))
    judgement = JudgeRunner(judge).judge(ZH_COMMENT, table)
    assert judgement.fallback is not None
    assert judgement.corrections == (HIGH_ACD,)


def test_config_requires_what_each_backend_needs() -> None:
    with pytest.raises(ValueError, match="model_path"):
        JudgeConfig(backend=Backend.HF)
    with pytest.raises(ValueError, match="base_url"):
        JudgeConfig(backend=Backend.OPENAI)
    assert isinstance(build_judge(JudgeConfig()), OfflineJudge)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A randomly initialised tiny causal LM with a locally trained tokenizer: its output is noise."""
    from sessionrl.policy.tiny import TinyModelConfig, build_tiny_policy

    out = tmp_path_factory.mktemp("tiny-judge")
    config = TinyModelConfig(vocab_size=400, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    texts = [ZH_COMMENT, EN_COMMENT, '{"corrections": []}', *CHRONIC_COMMENTS] * 5
    build_tiny_policy(texts, config, out)
    return out


def test_local_model_noise_falls_back_to_offline(tiny_model: Path, table: PenaltyTable) -> None:
    judge = HFJudge(tiny_model, max_new_tokens=12)
    judgement = JudgeRunner(judge).judge(ZH_COMMENT, table)
    assert judgement.backend == "offline"
    assert judgement.fallback is not None
    assert "hf:" in judgement.fallback
    assert judgement.corrections == (HIGH_ACD,)


def test_local_model_reply_is_parsed(
    tiny_model: Path, table: PenaltyTable, monkeypatch: pytest.MonkeyPatch
) -> None:
    judge = HFJudge(tiny_model)
    prompts: list[str] = []

    def reply(prompt: str) -> str:
        prompts.append(prompt)
        return ' {"corrections": [{"missing_element": "follow_up_plan", "severity": "low"}]}<|end|>'

    monkeypatch.setattr(judge, "generate", reply)
    judgement = JudgeRunner(judge).judge(EN_COMMENT, table)
    assert judgement.corrections == (Correction(missing_element="follow_up_plan", severity=Severity.LOW),)
    assert judgement.backend == f"hf:{tiny_model}"
    assert prompts[0].rstrip().endswith("<|assistant|>")  # the chat template's generation prompt
    assert EN_COMMENT in prompts[0]


def test_missing_local_model_falls_back(tmp_path: Path, table: PenaltyTable) -> None:
    judgement = JudgeRunner(HFJudge(tmp_path / "nowhere")).judge(ZH_COMMENT, table)
    assert judgement.fallback is not None
    assert "cannot load" in judgement.fallback
