"""Memory as skills: `memory_search` and `memory_write` over a `MemoryStore`, so a policy reaches long-term
memory through the executor like any tool, and every use is a tool call in its session (and so can be
rewarded, replayed and audited)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from research.memory.store import MemoryStore
from sessionrl.skills import Skill, SkillContract, callable_skill, load_contracts

CONTRACTS_DIR: Final = Path(__file__).parent / "contracts"
MEMORY_SKILLS: Final = ("memory_search", "memory_write")


def memory_contracts() -> tuple[SkillContract, ...]:
    """The contracts of the memory skills, sorted by name."""
    contracts = load_contracts(CONTRACTS_DIR)
    return tuple(contracts[name] for name in MEMORY_SKILLS)


def memory_skills(store: MemoryStore, *, session_id: str | None = None) -> list[Skill]:
    """The memory skills bound to `store`; facts they write name `session_id` as their source."""
    search, write = memory_contracts()

    def run_search(params: dict[str, Any]) -> dict[str, Any]:
        hits = store.search(params["subject"], params["query"], int(params.get("k", 3)))
        return {"hits": [hit.as_json() for hit in hits]}

    def run_write(params: dict[str, Any]) -> dict[str, Any]:
        relations = [(str(r["relation"]), str(r["object"])) for r in params.get("relations", [])]
        fact_id = store.write(
            params["subject"],
            params["text"],
            params.get("entities", []),
            relations,
            session_id=session_id,
        )
        return {"fact_id": fact_id}

    return [callable_skill(search, run_search), callable_skill(write, run_write)]


__all__ = ["CONTRACTS_DIR", "MEMORY_SKILLS", "memory_contracts", "memory_skills"]
