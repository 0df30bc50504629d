"""The judge contract: a comment in, structured corrections out, and the reply format models speak.

Model-backed judges (a local Hugging Face model, an OpenAI-compatible endpoint) are prompted with
`judge_messages` and must answer with JSON that `parse_reply` accepts:

>>> parse_reply('{"corrections": [{"missing_element": "crp_test", "severity": "medium"}]}')
(Correction(missing_element='crp_test', severity=<Severity.MEDIUM: 'medium'>),)
>>> parse_reply('Sure! ```json\\n[]\\n```')
()
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from pydantic import ValidationError

from sessionrl.errors import SessionRLError
from sessionrl.rewards.judge.table import Correction, PenaltyTable


class JudgeError(SessionRLError):
    """A judge failed: it raised, timed out, or replied with something that is not a correction list."""


class Judge(Protocol):
    """Turns a free-text comment into corrections. `name` identifies the backend (and its model) in caches."""

    @property
    def name(self) -> str: ...

    def extract(self, comment: str, table: PenaltyTable) -> tuple[Correction, ...]:
        """The corrections the comment asks for; raises `JudgeError` when it cannot tell."""
        ...


SYSTEM_PROMPT = (
    "You read a reviewer's comment on an assistant's answer and list what the answer left out. "
    "Reply with JSON only, in the form "
    '{"corrections": [{"missing_element": "<element>", "severity": "low|medium|high"}]}. '
    "Use an element name from the list when one fits, otherwise a short snake_case name. "
    'Reply {"corrections": []} when nothing is missing.'
)


def judge_messages(comment: str, table: PenaltyTable) -> list[dict[str, str]]:
    """Chat messages asking a model for the corrections in `comment`."""
    known = "\n".join(f"- {name}: {e.description}" for name, e in sorted(table.elements.items()))
    user = f"Known elements:\n{known}\n\nComment:\n{comment}"
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def parse_reply(text: str) -> tuple[Correction, ...]:
    """The corrections in a model's reply: a JSON object with `corrections`, a list, or one correction.

    Text around the JSON (prose, code fences) is ignored; anything else raises `JudgeError`.
    """
    data = _first_json(text)
    items = data.get("corrections", [data]) if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise JudgeError(f"reply JSON holds no correction list: {text[:120]!r}")
    try:
        return tuple(Correction.model_validate(item) for item in items)
    except ValidationError as exc:
        raise JudgeError(f"reply holds an invalid correction: {exc.errors()[0]['msg']}") from exc


def _first_json(text: str) -> Any:
    """The first JSON object or array in `text`."""
    decoder = json.JSONDecoder()
    for i, ch in enumerate(text):
        if ch in "{[":
            try:
                value, _ = decoder.raw_decode(text, i)
            except json.JSONDecodeError:
                continue
            return value
    raise JudgeError(f"reply holds no JSON: {text[:120]!r}")
