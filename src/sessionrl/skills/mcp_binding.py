"""A skill served by one tool of an MCP server that this skill starts and talks to over stdio.

The server starts on the first call and stays up until `aclose`. The MCP client lives in a task of its
own, because the SDK's connection must be opened and closed by the same task while calls come from many.

A tool reports a contract error by failing with a message that contains `CODE: ...` for a code the
contract knows (an MCPServer tool raises `ToolError("PATIENT_NOT_FOUND: no patient p9")`); any other
failure is `INTERNAL`. The payload is the tool's structured content, or else its text content: parsed as
JSON when it is JSON (any value: an array, a number, ...), the text itself when it is not.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sessionrl.skills.clock import Clock
from sessionrl.skills.contract import SkillContract
from sessionrl.skills.errors import ErrorCode, SkillError
from sessionrl.skills.skill import JsonValue, Skill

if TYPE_CHECKING:
    from mcp import Client

Json = dict[str, Any]
_CODE_IN_TEXT = re.compile(r"\b([A-Z][A-Z0-9_]*):\s*")


class McpSkill(Skill):
    """See `mcp_skill`."""

    def __init__(
        self,
        contract: SkillContract,
        command: Sequence[str],
        *,
        tool: str | None,
        env: Mapping[str, str] | None,
        cwd: str | Path | None,
    ) -> None:
        super().__init__(contract)
        if not command:
            raise ValueError(
                "mcp_skill needs a command that starts the server, such as ['python', 'server.py']"
            )
        self._command = list(command)
        self._tool = tool or contract.name
        self._env = dict(env) if env is not None else None
        self._cwd = cwd
        self._client: Client | None = None
        self._failure: BaseException | None = None
        self._runner: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._lock = asyncio.Lock()

    async def _serve(self) -> None:
        from mcp import Client, StdioServerParameters

        server = StdioServerParameters(
            command=self._command[0], args=self._command[1:], env=self._env, cwd=self._cwd
        )
        try:
            async with Client(server) as client:
                self._client = client
                self._ready.set()
                await self._stop.wait()
        except Exception as error:
            self._failure = error
        finally:
            self._client = None
            self._ready.set()

    async def _connected(self) -> Client:
        async with self._lock:
            if self._runner is None or self._runner.done():
                self._ready.clear()
                self._stop.clear()
                self._failure = None
                self._runner = asyncio.create_task(self._serve(), name=f"mcp:{self.name}")
            await self._ready.wait()
        if self._client is None:
            reason = f"{type(self._failure).__name__}: {self._failure}" if self._failure else "server stopped"
            raise SkillError(
                ErrorCode.UNAVAILABLE, f"MCP server {self._command[0]!r} not reachable ({reason})"
            )
        return self._client

    async def invoke(self, params: Json, clock: Clock) -> JsonValue:
        """Call the tool and turn its result into a payload or a `SkillError`."""
        from mcp import MCPError

        client = await self._connected()
        try:
            result = await client.call_tool(self._tool, params)
        except MCPError as error:
            raise SkillError(ErrorCode.INTERNAL, f"MCP error {error.code}: {error.message}") from error
        text = "".join(getattr(block, "text", "") for block in result.content)
        if result.is_error:
            raise self._error_from_text(text)
        if result.structured_content is not None:
            return result.structured_content
        if not result.content:
            raise SkillError(ErrorCode.INVALID_OUTPUT, f"tool {self._tool!r} returned no content")
        return _json_or_text(text)

    def _error_from_text(self, text: str) -> SkillError:
        for match in _CODE_IN_TEXT.finditer(text):
            if self.contract.knows_code(match.group(1)):
                return SkillError(match.group(1), text[match.end() :])
        return SkillError(ErrorCode.INTERNAL, text or f"tool {self._tool!r} failed")

    async def aclose(self) -> None:
        """Stop the server and wait for its task to end."""
        if self._runner is not None:
            self._stop.set()
            await self._runner
            self._runner = None


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def mcp_skill(
    contract: SkillContract,
    command: Sequence[str],
    *,
    tool: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
) -> McpSkill:
    """Bind `contract` to the tool `tool` (default: the contract's name) of the stdio MCP server `command`.

    `env` adds variables to the MCP SDK's safe default environment for the server process.
    """
    return McpSkill(contract, command, tool=tool, env=env, cwd=cwd)
