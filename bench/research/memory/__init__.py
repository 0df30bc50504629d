"""Long-term memory (capability level L4): facts and entities from past sessions, retrieved by embedding,
with an entity-relation table, exposed to policies as the skills `memory_search` and `memory_write`.

Research code, not part of the package: nothing in the product offers it yet. tests/memory measure what it
is worth on two-turn orders conversations (`OrdersEnv(shared_skills=memory_skills(store))`)."""

from research.memory.skills import MEMORY_SKILLS, memory_contracts, memory_skills
from research.memory.store import EncoderMismatch, Hit, MemoryStore, Relation, freshness

__all__ = [
    "MEMORY_SKILLS",
    "EncoderMismatch",
    "Hit",
    "MemoryStore",
    "Relation",
    "freshness",
    "memory_contracts",
    "memory_skills",
]
