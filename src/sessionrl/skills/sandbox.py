"""Untrusted Python skills, each call in a fresh subprocess with CPU, memory and wall-clock limits.

The child (`_sandbox_child.py`) starts with a scrubbed environment (no inherited secrets), caps its own
CPU seconds (`RLIMIT_CPU`), address space (`RLIMIT_AS`) and core dumps, runs the function and answers as
JSON. The parent waits on an asyncio subprocess, so the event loop keeps serving other calls, and turns
every way the child can end into a result: `SANDBOX_TIMEOUT` (killed at the wall limit), `SANDBOX_CPU`
(CPU limit), `SANDBOX_MEMORY` (allocation refused), `SANDBOX_CRASH` (a signal such as SIGSEGV, or no
answer).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field

from sessionrl.skills._sandbox_child import EXIT_MEMORY
from sessionrl.skills.clock import Clock
from sessionrl.skills.contract import SkillContract
from sessionrl.skills.errors import ErrorCode, SkillError
from sessionrl.skills.skill import JsonValue, Skill

Json = dict[str, Any]
CHILD: Final = Path(__file__).with_name("_sandbox_child.py")
_STDERR_TAIL = 2000
_CHUNK = 1 << 16


class SandboxLimits(BaseModel):
    """What one sandboxed call may use."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpu_s: int = Field(default=2, ge=1, description="CPU seconds before the child is stopped (RLIMIT_CPU).")
    memory_bytes: int = Field(default=512 << 20, ge=64 << 20, description="Address-space cap (RLIMIT_AS).")
    wall_s: float = Field(default=10.0, gt=0, description="Wall-clock seconds before the child is killed.")
    max_output_bytes: int = Field(default=1 << 20, ge=1024, description="Largest answer accepted.")


def scrubbed_env() -> dict[str, str]:
    """The child's whole environment: a search path and a locale, nothing inherited beyond that."""
    return {"PATH": os.environ.get("PATH", os.defpath), "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


class SandboxedSkill(Skill):
    """See `sandboxed_skill`."""

    def __init__(
        self, contract: SkillContract, target: str, *, source: str | None, limits: SandboxLimits
    ) -> None:
        super().__init__(contract)
        if source is None:
            module, _, function = target.partition(":")
            if not module or not function:
                raise ValueError(
                    f"target must be 'package.module:function' when no source is given, got {target!r}"
                )
        else:
            module, function = "", target
        self._request: Json = {
            "module": module or None,
            "source": source,
            "function": function,
            "cpu_s": limits.cpu_s,
            "memory_bytes": limits.memory_bytes,
        }
        self.limits = limits

    async def invoke(self, params: Json, clock: Clock) -> JsonValue:
        """Run the function once in a new child process."""
        sys_path = [p for p in sys.path if p]
        payload = json.dumps({**self._request, "params": params, "sys_path": sys_path}).encode()
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            str(CHILD),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=scrubbed_env(),
            start_new_session=True,
        )
        try:
            async with asyncio.timeout(self.limits.wall_s):
                (answer, overflow), (errors, _), _ = await asyncio.gather(
                    _read_capped(process.stdout, self.limits.max_output_bytes),
                    _read_capped(process.stderr, _STDERR_TAIL, keep_tail=True),
                    _feed(process.stdin, payload),
                )
                returncode = await process.wait()
        except TimeoutError:
            raise SkillError(
                ErrorCode.SANDBOX_TIMEOUT, f"killed after {self.limits.wall_s} s of wall time"
            ) from None
        finally:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                await process.wait()
        if overflow:
            raise SkillError(
                ErrorCode.INVALID_OUTPUT, f"answer larger than {self.limits.max_output_bytes} bytes"
            )
        return _decode(returncode, answer, errors.decode(errors="replace"), self.limits)


async def _feed(stream: asyncio.StreamWriter | None, payload: bytes) -> None:
    if stream is None:
        return
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        stream.write(payload)
        await stream.drain()
        stream.close()


async def _read_capped(
    stream: asyncio.StreamReader | None, cap: int, keep_tail: bool = False
) -> tuple[bytes, bool]:
    """Read a pipe to its end, keeping at most `cap` bytes (the first, or the last with `keep_tail`)."""
    kept, overflow = b"", False
    while stream is not None and (chunk := await stream.read(_CHUNK)):
        kept += chunk
        if len(kept) > cap:
            overflow = True
            kept = kept[-cap:] if keep_tail else kept[:cap]
    return kept, overflow


def _decode(returncode: int, answer: bytes, errors: str, limits: SandboxLimits) -> JsonValue:
    tail = errors.strip().splitlines()[-1] if errors.strip() else "no output on stderr"
    if returncode == EXIT_MEMORY:
        raise SkillError(
            ErrorCode.SANDBOX_MEMORY, f"allocation refused at the {limits.memory_bytes >> 20} MiB cap"
        )
    if returncode == -signal.SIGXCPU:
        raise SkillError(ErrorCode.SANDBOX_CPU, f"stopped after {limits.cpu_s} CPU seconds")
    if returncode < 0:
        name = signal.Signals(-returncode).name
        raise SkillError(ErrorCode.SANDBOX_CRASH, f"the skill process died from {name} ({tail})")
    try:
        message = json.loads(answer)
    except ValueError:
        raise SkillError(
            ErrorCode.SANDBOX_CRASH, f"exited with status {returncode} without answering ({tail})"
        ) from None
    if isinstance(message, dict) and "output" in message:
        return message["output"]
    if isinstance(message, dict) and isinstance(message.get("error_code"), str):
        raise SkillError(message["error_code"], str(message.get("message", "")))
    raise SkillError(ErrorCode.SANDBOX_CRASH, f"malformed answer from the skill process ({tail})")


def sandboxed_skill(
    contract: SkillContract,
    target: str,
    *,
    source: str | None = None,
    limits: SandboxLimits | None = None,
) -> SandboxedSkill:
    """Bind `contract` to an untrusted function run in a limited subprocess, one process per call.

    `target` is `"package.module:function"`, importable from this process's `sys.path`; or, with `source`
    (Python text), the name of the function that the text defines. The function takes the parameters
    dict and returns any JSON value (it may be async); an exception with a string `code` attribute (such as
    `SkillError`) fails the call with that code, any other exception with `INTERNAL`.
    """
    return SandboxedSkill(contract, target, source=source, limits=limits or SandboxLimits())
