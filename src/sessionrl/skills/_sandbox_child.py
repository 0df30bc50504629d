"""The child side of the sandbox: limit itself, run one function, answer as JSON on stdout.

Run as a script (`python -I _sandbox_child.py`), so only the standard library is loaded before the
limits apply. The request arrives as one JSON object on stdin:
`{"sys_path": [...], "module": "pkg.mod" | null, "source": "..." | null, "function": "name",
"params": {...}, "cpu_s": 2, "memory_bytes": 536870912}`.
The answer is `{"output": <any JSON value>}` or `{"error_code": "...", "message": "..."}`. Running out
of memory exits with `EXIT_MEMORY` instead, because writing an answer may itself need memory.
Anything the function prints goes to stderr, so it cannot corrupt the answer.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import os
import resource
import sys
from typing import Any, Final

EXIT_MEMORY: Final = 86
"""Exit status that means the function ran out of memory (the parent reports SANDBOX_MEMORY)."""


def _limit(cpu_s: int, memory_bytes: int) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))


def _load(request: dict[str, Any]) -> Any:
    if request["source"] is not None:
        namespace: dict[str, Any] = {"__name__": "sandboxed"}
        exec(compile(request["source"], "<sandboxed skill>", "exec"), namespace)
        return namespace[request["function"]]
    return getattr(importlib.import_module(request["module"]), request["function"])


def _run(request: dict[str, Any]) -> dict[str, Any]:
    try:
        result = _load(request)(request["params"])
        if inspect.isawaitable(result):
            result = asyncio.run(_awaited(result))
    except MemoryError:
        raise
    except Exception as error:
        code = getattr(error, "code", None)
        if isinstance(code, str) and code:
            return {"error_code": code, "message": str(getattr(error, "message", error))}
        return {"error_code": "INTERNAL", "message": f"{type(error).__name__}: {error}"}
    return {"output": result}


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def main() -> None:
    """Read the request, apply the limits, run, answer."""
    request = json.loads(sys.stdin.buffer.read())
    answer_fd = os.dup(1)
    os.dup2(2, 1)
    sys.path[:0] = request["sys_path"]
    _limit(request["cpu_s"], request["memory_bytes"])
    try:
        answer = _run(request)
        data = json.dumps(answer, allow_nan=False).encode()
    except MemoryError:
        os._exit(EXIT_MEMORY)
    except (TypeError, ValueError) as error:
        data = json.dumps({"error_code": "INVALID_OUTPUT", "message": f"not JSON: {error}"}).encode()
    with os.fdopen(answer_fd, "wb") as answer_file:
        answer_file.write(data)


if __name__ == "__main__":
    main()
