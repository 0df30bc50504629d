"""The memory store: facts round-trip, fresher facts rank first, relations, encoders kept apart, the
skills through the executor, and retrieval by meaning with the packaged MiniLM encoder."""

from __future__ import annotations

from pathlib import Path

import pytest

from research.memory import EncoderMismatch, MemoryStore, freshness, memory_skills
from sessionrl.policy.encoder import minilm_path
from sessionrl.skills import SkillExecutor, check_skill

DAY = 86_400.0


def test_facts_round_trip_by_subject_with_relations(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    with MemoryStore(path, encoder="hash") as memory:
        fact = memory.write("p1", "order O-1 is late", ["O-1"], [("has_order", "O-1")], session_id="s1", at=0)
        memory.write("p2", "order O-2 is late", ["O-2"], at=0)
    with MemoryStore(path, encoder="hash") as memory:  # it outlives the process that wrote it
        (hit,) = memory.search("p1", "late order", k=5, now=0)
        assert (hit.fact_id, hit.text, hit.entities, hit.age_s) == (fact, "order O-1 is late", ("O-1",), 0)
        assert [(r.relation, r.object) for r in memory.relations("p1")] == [("has_order", "O-1")]
        assert memory.relations("p1", "bought") == []
        assert (memory.count(), memory.count("p2")) == (2, 1)
    with pytest.raises(EncoderMismatch, match="hash:64"):
        MemoryStore(path, encoder=_Wide())  # type: ignore[arg-type]  # a stand-in with another name


class _Wide:
    """Another encoder than the one that wrote the store."""

    dim = 8

    def encode(self, texts: object) -> object:
        raise AssertionError("never called")


def test_fresher_of_two_equal_facts_ranks_first() -> None:
    memory = MemoryStore(encoder="hash", half_life_s=10 * DAY)
    old = memory.write("p", "the parcel is late", at=0)
    new = memory.write("p", "the parcel is late", at=20 * DAY)
    hits = memory.search("p", "parcel late", k=2, now=20 * DAY)
    assert [h.fact_id for h in hits] == [new, old]
    assert hits[1].score == pytest.approx(hits[0].score * freshness(20 * DAY, 10 * DAY))
    assert hits[1].score == pytest.approx(hits[0].score / 4)


async def test_memory_skills_pass_the_checker_and_run_through_the_executor() -> None:
    memory = MemoryStore(encoder="hash")
    skills = memory_skills(memory, session_id="s9")
    for skill in skills:
        assert await check_skill(skill.contract, skill) == ()
    async with SkillExecutor(skills) as executor:
        wrote = await executor.call(
            "memory_write",
            {
                "subject": "p",
                "text": "order O-7",
                "entities": ["O-7"],
                "relations": [{"relation": "has_order", "object": "O-7"}],
            },
        )
        found = await executor.call("memory_search", {"subject": "p", "query": "my order"})
        refused = await executor.call("memory_search", {"subject": "p"})
    assert wrote.ok
    assert found.ok
    assert found.output["hits"][0]["entities"] == ["O-7"]
    assert not refused.ok  # the query is required
    assert [r.object for r in memory.relations("p", "has_order")] == ["O-7"]


@pytest.mark.skipif(
    minilm_path() is None, reason="the packaged MiniLM encoder (extra `text`) is not installed"
)
def test_retrieval_by_meaning_with_the_packaged_minilm() -> None:
    memory = MemoryStore(encoder="minilm")
    assert memory.encoder_name == "minilm:384"
    facts = {
        "parcel": "order O-123456 shipped with SF, waybill SF1234560000, and the delivery is running late",
        "evening": "the customer prefers deliveries in the evening after 7 pm",
        "stock": "asked whether the rice cooker SKU-11111 is back in stock",
    }
    ids = {name: memory.write("p", text, at=0) for name, text in facts.items()}
    queries = {
        "parcel": "my package still has not arrived",
        "evening": "what time of day should we deliver",
        "stock": "is the cooker available to buy",
    }
    for name, query in queries.items():
        assert memory.search("p", query, k=1, now=0)[0].fact_id == ids[name], query
