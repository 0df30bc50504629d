"""Sandboxed skills: each way an untrusted function can end becomes a result, and this process carries on."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from skills_support import ContractFactory

from sessionrl.skills import (
    ErrorCode,
    ExecutorConfig,
    SandboxLimits,
    SkillContract,
    SkillExecutor,
    sandboxed_skill,
)

ONCE = ExecutorConfig(max_attempts=1)


def _source(body: str) -> str:
    return "def run(params):\n" + "".join(f"    {line}\n" for line in body.strip().splitlines())


async def _call(
    contract: SkillContract, body: str, **limits: float
) -> tuple[str | None, str | None, dict | None]:
    skill = sandboxed_skill(contract, "run", source=_source(body), limits=SandboxLimits(**limits))
    result = await SkillExecutor([skill], ONCE).call(contract.name, {"amount": 3})
    return result.error_code, result.error_message, result.output


@pytest.fixture
def contract(make_contract: ContractFactory) -> SkillContract:
    return make_contract(sla={"timeout_s": 30.0})


async def test_a_well_behaved_function_answers(contract: SkillContract):
    code, _, output = await _call(
        contract, "print('chatter goes to stderr')\nreturn {'total': params['amount'] * 2}"
    )
    assert (code, output) == (None, {"total": 6})


async def test_a_function_named_by_module_path_answers(contract: SkillContract):
    skill = sandboxed_skill(contract, "skills_sandbox_targets:double")
    result = await SkillExecutor([skill]).call("probe", {"amount": 4})
    assert result.output == {"total": 8}


async def test_an_infinite_loop_is_stopped_by_the_cpu_limit(contract: SkillContract):
    code, message, _ = await _call(contract, "while True:\n    pass", cpu_s=1, wall_s=20)
    assert (code, message) == (ErrorCode.SANDBOX_CPU, "stopped after 1 CPU seconds")


async def test_a_hang_is_killed_at_the_wall_limit_while_the_loop_keeps_running(contract: SkillContract):
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.create_task(tick())
    code, message, _ = await _call(contract, "import time\ntime.sleep(60)", wall_s=0.5)
    ticker.cancel()
    assert (code, message) == (ErrorCode.SANDBOX_TIMEOUT, "killed after 0.5 s of wall time")
    assert ticks > 0


async def test_a_ten_gib_allocation_is_refused(contract: SkillContract):
    code, message, _ = await _call(contract, "block = bytearray(10 * 2**30)\nreturn {'total': len(block)}")
    assert (code, message) == (ErrorCode.SANDBOX_MEMORY, "allocation refused at the 512 MiB cap")


async def test_a_segfault_is_a_crash(contract: SkillContract):
    code, message, _ = await _call(contract, "import ctypes\nctypes.string_at(0)")
    assert code == ErrorCode.SANDBOX_CRASH
    assert message is not None
    assert message.startswith("the skill process died from SIGSEGV")


async def test_errors_with_a_code_keep_it_and_others_are_internal(contract: SkillContract):
    raising = "class Refused(Exception):\n    code = 'BROKEN'\nraise Refused('no stock')"
    assert (await _call(contract, raising))[:2] == ("BROKEN", "no stock")
    assert (await _call(contract, "return 1 / 0"))[:2] == (
        ErrorCode.INTERNAL,
        "ZeroDivisionError: division by zero",
    )
    assert (await _call(contract, "return [1]"))[:2] == (
        ErrorCode.INVALID_OUTPUT,
        "output: [1] is not of type 'object'",  # the probe contract's output schema asks for an object
    )
    assert (await _call(contract, "return float('nan')"))[0] == ErrorCode.INVALID_OUTPUT


@pytest.mark.parametrize(
    ("body", "expected"), [("return [1, 2]", [1, 2]), ("return 'ok'", "ok"), ("return None", None)]
)
async def test_any_json_value_answers_when_the_contract_allows_it(
    contract: SkillContract, body: str, expected: object
):
    anything = contract.model_copy(update={"output_schema": {}})
    assert await _call(anything, body) == (None, None, expected)


async def test_the_environment_is_scrubbed(contract: SkillContract, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SESSIONRL_SECRET_TOKEN", "hunter2")
    env_contract = contract.model_copy(update={"output_schema": {"type": "object"}})
    _, _, output = await _call(env_contract, "import os\nreturn {'keys': sorted(os.environ)}")
    assert output is not None
    assert "PATH" in output["keys"]
    assert set(output["keys"]) <= {"PATH", "LANG", "LC_ALL", "LC_CTYPE"}


async def test_an_executor_timeout_kills_the_child(contract: SkillContract, tmp_path: Path):
    pid_file = tmp_path / "pid"
    body = f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(60)"
    short = contract.model_copy(update={"sla": contract.sla.model_copy(update={"timeout_s": 1.0})})
    code, _, _ = await _call(short, body, wall_s=60)
    assert code == ErrorCode.TIMEOUT
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


def test_a_target_without_a_function_is_refused(contract: SkillContract):
    with pytest.raises(ValueError, match=r"target must be 'package\.module:function'"):
        sandboxed_skill(contract, "skills_sandbox_targets")
