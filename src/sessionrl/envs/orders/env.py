"""The orders domain as a `DecisionEnv`: e-commerce fulfilment tickets, eight skills, a judge and an expert.

Skills are simulated stand-ins (see `envs.simulated`) whose answers come from the episode's `World`. The
logistics API (`express_contact`) is the slow one, 820 ± 340 ms; the others answer in 60–300 ms.
`DomainConfig(time_factor=0)` gives instant episodes for tests; `transient_failures=True` adds the
contracts' failure rates.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from sessionrl.envs.base import ErrorKind, ExpertPlan, Outcome, Split, Task, entities_named
from sessionrl.envs.faults import Faults
from sessionrl.envs.orders import structured
from sessionrl.envs.orders.expert import expert_plan
from sessionrl.envs.orders.followups import Conversation, conversations
from sessionrl.envs.orders.judge import judge
from sessionrl.envs.orders.tasks import generate
from sessionrl.envs.orders.ticket import LATE_COMPENSATION, Ticket
from sessionrl.envs.orders.tools import ERROR_KINDS, TOOLS, World
from sessionrl.envs.simulated import DomainConfig, SimulatedEnv, SimulatedEpisode
from sessionrl.skills import Skill, SkillContract

Json = dict[str, Any]
CONTRACTS_DIR: Final = Path(__file__).parent / "contracts"

SYSTEM_PROMPT: Final = f"""You resolve e-commerce fulfilment tickets with the tools given. Rules:
- Wrong address: check the item in inventory, text the customer a verify_code, then change the address of
  the unshipped order with the code they read back.
- Damaged item: check the item in inventory and confirm the return came back before refunding the damaged
  units at their unit price (reason quality); book the refund in the ERP and text a refund_notice.
- Late delivery: ask the courier to expedite, check the item, refund {LATE_COMPENSATION:.0%} of the order
  amount (reason late_delivery) and text a delay_apology.
- Lost parcel: trace it; once the courier confirms the loss, check stock, ship a replacement with the same
  courier and the item's package size, book the reshipment in the ERP and text a reship_notice.
- Wrong item: confirm the return came back, check stock, ship the right item with the same courier and the
  item's package size, book the exchange in the ERP and text an exchange_notice.
- Stock inquiry: check the item and tell the customer how many units are on hand, or when it is restocked.
Never refund returned goods before the return is confirmed, never refund twice, never ship again before a
loss or a return is confirmed. Amounts have two decimals. End with a reply that states the order number
and the outcome (the new address, the amount refunded, the new waybill, or the stock)."""


class OrdersEnv(SimulatedEnv):
    """Seeded fulfilment tickets over eight simulated skills (see `DomainConfig`).

    `shared_skills` are offered by every episode beside the eight, one instance for all of them: long-term
    memory (`bench/research/memory`, `memory_skills(store)`) outlives a conversation. `conversations` gives
    two-turn tasks whose follow-up needs what the first turn said.
    """

    name = "orders"
    feature_names = structured.FEATURES
    error_kinds: Mapping[str, ErrorKind] = ERROR_KINDS
    """What its skills' error codes say about a call (`sessionrl.envs.base.ClassifiesErrors`)."""

    def __init__(self, config: DomainConfig | None = None, *, shared_skills: Sequence[Skill] = ()) -> None:
        super().__init__(config, contracts_dir=CONTRACTS_DIR, generate=generate)
        self.shared_skills = tuple(shared_skills)

    def contracts(self) -> Sequence[SkillContract]:
        """The eight skills' contracts, then the shared skills'."""
        return (*super().contracts(), *(skill.contract for skill in self.shared_skills))

    def conversations(self, split: Split, size: int) -> tuple[tuple[Task, Task], ...]:
        """`size` two-turn conversations of `split` (first ticket, follow-up), seeded by the config."""
        return conversations(self.config.seed, split, size)

    def expected_entities(self, task: Task) -> list[str]:
        """Entities the request names that the expert passes to its tools, then those a follow-up must
        remember from its first turn."""
        named = entities_named(task, self.expert(task))
        conversation = Conversation.of(task)
        remembered = conversation.remembered if conversation is not None else ()
        return [*named, *(e for e in remembered if e not in named)]

    def system_prompt(self) -> str:
        """The fulfilment rules a policy follows."""
        return SYSTEM_PROMPT

    def episode(self, task: Task, *, seed: int = 0, faults: Faults | None = None) -> OrdersEpisode:
        """A fresh world for `task`; `seed` drives latencies, transient failures and `faults`."""
        return OrdersEpisode(self, task, seed=seed, faults=faults)

    def expert(self, task: Task) -> ExpertPlan:
        """The issue's resolution pattern with exact parameters, then a reply stating the key facts."""
        return expert_plan(Ticket.from_payload(task.payload))


class OrdersEpisode(SimulatedEpisode[World]):
    """One ticket over its own `World` (see `SimulatedEpisode` for what it shares with the other domains)."""

    def __init__(self, env: OrdersEnv, task: Task, *, seed: int, faults: Faults | None) -> None:
        world = World.open(Ticket.from_payload(task.payload))
        super().__init__(SimulatedEnv.contracts(env), task, world, TOOLS, seed=seed, faults=faults)
        self._shared = env.shared_skills

    @property
    def world(self) -> World:
        """The episode's state (read it; change it only through the skills)."""
        return self._state

    def skills(self) -> Sequence[Skill]:
        """The eight skills bound to this episode's world, then the env's shared skills."""
        return [*super().skills(), *self._shared]

    @property
    def terminated(self) -> bool:
        """Always False: no orders skill ends the conversation."""
        return False

    def features(self) -> tuple[float, ...]:
        """Numeric features in `OrdersEnv.feature_names` order."""
        return structured.features(self._state)

    def param_bounds(self) -> Mapping[str, Mapping[str, tuple[float, float]]]:
        """Episode-specific ranges of numeric parameters, by skill and parameter."""
        return structured.bounds(self._state)

    def bind(self, skill: str, chosen: Mapping[str, Any]) -> Json:
        """Full parameters of a call to `skill` from a structured policy's `chosen` bounded values."""
        return structured.bind(self._state, skill, chosen)

    def summary(self) -> str:
        """A reply to the customer stating what the episode did."""
        return structured.summary(self._state)

    def outcome(self, messages_to_user: Sequence[str]) -> Outcome:
        """Pattern, no extra actions, no risk, facts stated (see `orders.judge`)."""
        return judge(self._state, messages_to_user)
