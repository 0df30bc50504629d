"""A skill served by an HTTP endpoint: the parameters go out as a JSON POST, the payload comes back as JSON
(any JSON value: an object, an array, a string, ...).

A failed response maps to an error code: a JSON body `{"error_code": "...", "message": "..."}` names the
code itself; otherwise the status decides (`STATUS_CODES`, anything else is `INTERNAL`). Transport
failures are `UNAVAILABLE`, client-side timeouts `TIMEOUT`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import httpx

from sessionrl.skills.clock import Clock
from sessionrl.skills.contract import SkillContract
from sessionrl.skills.errors import ErrorCode, SkillError
from sessionrl.skills.skill import JsonValue, Skill

Json = dict[str, Any]
STATUS_CODES: Final[dict[int, ErrorCode]] = {
    400: ErrorCode.INVALID_PARAMS,
    408: ErrorCode.TIMEOUT,
    422: ErrorCode.INVALID_PARAMS,
    429: ErrorCode.RATE_LIMITED,
    502: ErrorCode.UNAVAILABLE,
    503: ErrorCode.UNAVAILABLE,
    504: ErrorCode.TIMEOUT,
}
_MAX_TEXT = 300


class HttpSkill(Skill):
    """See `http_skill`."""

    def __init__(
        self,
        contract: SkillContract,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        super().__init__(contract)
        self._url = url
        self._headers = dict(headers or {})
        self._client = client
        self._owns_client = client is None

    async def invoke(self, params: Json, clock: Clock) -> JsonValue:
        """POST the parameters and decode the answer."""
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.contract.sla.timeout_s)
        try:
            response = await self._client.post(self._url, json=params, headers=self._headers)
        except httpx.TimeoutException as error:
            raise SkillError(ErrorCode.TIMEOUT, f"{self._url}: {type(error).__name__}") from error
        except httpx.TransportError as error:
            raise SkillError(
                ErrorCode.UNAVAILABLE, f"{self._url}: {type(error).__name__}: {error}"
            ) from error
        decoded, body = _json(response)
        if response.is_success:
            if not decoded:
                raise SkillError(ErrorCode.INVALID_OUTPUT, f"{self._url} answered with no JSON")
            return body
        raise _error_for(response, body)

    async def aclose(self) -> None:
        """Close the HTTP client when this skill made it."""
        if self._owns_client and self._client is not None:
            await self._client.aclose()
            self._client = None


def _json(response: httpx.Response) -> tuple[bool, Any]:
    """(True, the decoded body), or (False, None) when the body is not JSON."""
    try:
        return True, response.json()
    except ValueError:
        return False, None


def _error_for(response: httpx.Response, body: Any) -> SkillError:
    if isinstance(body, dict) and isinstance(body.get("error_code"), str):
        return SkillError(body["error_code"], str(body.get("message", "")))
    code = STATUS_CODES.get(response.status_code, ErrorCode.INTERNAL)
    return SkillError(code, f"HTTP {response.status_code}: {response.text[:_MAX_TEXT]}")


def http_skill(
    contract: SkillContract,
    url: str,
    *,
    headers: Mapping[str, str] | None = None,
    client: httpx.AsyncClient | None = None,
) -> HttpSkill:
    """Bind `contract` to a JSON-over-HTTP endpoint at `url`.

    Pass `client` to share one `httpx.AsyncClient` (its owner closes it); otherwise the skill opens its
    own on first use and closes it in `aclose`.
    """
    return HttpSkill(contract, url, headers=headers, client=client)
