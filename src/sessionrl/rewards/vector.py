"""The reward vector: what a session earned, per step, per layer and per term, under which rules.

Assembly, for layer weights w_l, layer raw totals x_l (the sum of its terms' values) and running
statistics of the n_l totals seen before (centre m_l = n_l · mean_l / (n_l + 10), scale
σ_l = max(sqrt(var_l), 1); `sessionrl.rewards.layers`):

- normalised layer value z_l = clip((x_l - m_l) / σ_l), or x_l itself under `normalise: false`;
- layer contribution c_l = w_l · z_l;
- session reward = Σ c_l over the immediate layers; long-term reward = session reward + Σ c_l over the
  long-term layers (only `long_term`, in the five-layer scheme);
- step reward of a call = Σ over terms of w_l · a / σ_l, a being the term's attribution to the call. Steps
  are scaled like their layer but not centred: the mean is a session-level baseline, not a step's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from pydantic import BaseModel, ConfigDict

from sessionrl.rewards.layers import LAYERS, LONG_TERM_LAYERS, RunningStats, Scheme, TermKind, layer_of
from sessionrl.rewards.rules import RuleSet
from sessionrl.rewards.terms import Term, TermResult, add_steps, human_rating
from sessionrl.session.model import Session


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TermContribution(_Frozen):
    """One term's result for one session."""

    name: str
    kind: TermKind
    layer: str
    value: float
    steps: dict[str, float]
    explanation: str


class LayerValue(_Frozen):
    """One layer of one session: raw total, standardised value, weight, scale and weighted contribution."""

    raw: float
    normalised: float
    weight: float
    scale: float
    contribution: float
    mean: float | None = None
    """The centre the normaliser subtracted (`RunningStats.centre`; None in vectors stored before it was
    kept)."""
    seen: int | None = None
    """How many totals the normaliser had seen: its version. At 0 the raw total is used as is (clipped)."""


class RewardVector(_Frozen):
    """Everything a session earned, stamped with the rule-set version and the session version scored."""

    session_id: str
    session_version: int
    ruleset_version: str
    scheme: Scheme
    scored_at: datetime
    rating: float | None
    """The session's human rating (1–5) the vector reflects, if any: each rater's latest, combined by the
    rule file's `aggregate` (`sessionrl.rewards.terms.human_rating`)."""
    rated_by: tuple[str, ...] = ()
    """The sources (annotators) whose ratings `rating` combines."""
    step_rewards: dict[str, float]
    session_reward: float
    long_term_reward: float
    layers: dict[str, LayerValue]
    terms: tuple[TermContribution, ...]


def assemble(
    session: Session,
    ruleset: RuleSet,
    results: Sequence[tuple[Term, TermResult]],
    stats: Mapping[str, RunningStats],
    scored_at: datetime,
) -> RewardVector:
    """Combine the term results of one session into its reward vector (see the module doc for the maths)."""
    scheme, file = ruleset.file.scheme, ruleset.file
    weights = file.weights
    raw = dict.fromkeys(LAYERS[scheme], 0.0)
    contributions = []
    for term, result in results:
        layer = layer_of(scheme, term.kind, term.layer)
        raw[layer] += result.value
        contributions.append(
            TermContribution(
                name=term.name,
                kind=term.kind,
                layer=layer,
                value=result.value,
                steps=dict(result.steps),
                explanation=result.explanation,
            )
        )
    layers = {
        name: _layer(x, weights[name], stats.get(name), file.normalise, file.clip) for name, x in raw.items()
    }
    steps: dict[str, float] = {}
    for c in contributions:
        factor = layers[c.layer].weight / layers[c.layer].scale
        add_steps(steps, {call_id: factor * v for call_id, v in c.steps.items()})
    immediate = sum(v.contribution for k, v in layers.items() if k not in LONG_TERM_LAYERS)
    later = sum(v.contribution for k, v in layers.items() if k in LONG_TERM_LAYERS)
    rating = human_rating(session, file)
    return RewardVector(
        session_id=session.session_id,
        session_version=session.state_version,
        ruleset_version=ruleset.version,
        scheme=scheme,
        scored_at=scored_at,
        rating=rating.score if rating is not None else None,
        rated_by=rating.sources if rating is not None else (),
        step_rewards=steps,
        session_reward=immediate,
        long_term_reward=immediate + later,
        layers=layers,
        terms=tuple(contributions),
    )


def _layer(raw: float, weight: float, stats: RunningStats | None, normalise: bool, clip: float) -> LayerValue:
    stats = stats if normalise and stats is not None else RunningStats()
    z = stats.normalise(raw, clip) if normalise else raw  # `normalise: false`: the raw total, unclipped
    return LayerValue(
        raw=raw,
        normalised=z,
        weight=weight,
        scale=stats.scale,
        contribution=weight * z,
        mean=stats.centre,
        seen=stats.count,
    )
