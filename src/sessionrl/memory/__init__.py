"""Long-term memory (capability level L4): facts and entities from past sessions, retrieved by embedding,
with an entity-relation table, exposed to policies as the skills `memory_search` and `memory_write`."""

from sessionrl.memory.skills import MEMORY_SKILLS, memory_contracts, memory_skills
from sessionrl.memory.store import EncoderMismatch, Hit, MemoryStore, Relation, freshness

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
