"""A session as a heterogeneous graph, and a GNN whose aggregation is gated attention over neighbours.

**Graph.** Nodes are typed (`NODE_TYPES`: the request, sub-goals, skills, tool calls, entities) and edges
are typed (`EDGE_TYPES`): a sub-goal *depends_on* another, a skill or sub-goal *serves* the request, a skill
was *called* (its call node), a call *produced* an entity, the request *mentions* an entity. A
`SessionGraph` holds a batch of such graphs as one disjoint union: node features ``x`` ``[N, F]``, node
types ``[N]``, edges ``[2, E]`` (row 0 the source, row 1 the target) with their types ``[E]``, and the graph
each node belongs to ``[N]``. Two builders fill it:

* `observation_graphs` turns a batch of structured observations (`sessionrl.envs.gym`) into graphs: the
  request (query embedding and step), one node per skill (finish included; its mask bit), one call node per
  skill that has been called (succeeded or failed) and one entity node per non-zero domain feature. The
  observation does not say which call revealed which feature, so every call *produced* every entity and
  the attention sorts out which matter; it carries no plan, so there are no sub-goals or *depends_on*;
* `session_graph` turns a stored `Session` (its plan's sub-goals, tool calls and their parameters) into one
  graph, with sub-goals and *depends_on* edges, nodes embedded by a text encoder.

**Layer.** `GatedAttention` updates node ``i`` from its in-neighbours ``j`` (over edges ``j → i`` of
relation ``r``) with the scores ``e_ij = LeakyReLU(aᵀ[W_h h_i ‖ W_r h_j])``, the weights
``α_ij = softmax_j(e_ij)`` over the neighbours of ``i``, and
``h_i' = h_i + tanh(W_h h_i + Σ_j α_ij W_r h_j)``.
Every edge type also runs backwards as its own relation, so a request hears its skills and they hear it.

**Why plain torch, not torch-geometric.** ``pip install torch_geometric --dry-run`` beside torch 2.13.0
would add only torch-geometric 2.8.1 (pure Python, torch untouched), so the library was an option. The layer
here is the seed's formula exactly (one ``a``, a ``W_r`` per relation) in some 30 lines: a segment softmax
by ``scatter_reduce``/``index_add_`` over graphs of a few dozen nodes. PyG's ``GATConv`` shares one ``W``
between both ends and ``GATv2Conv`` puts the nonlinearity before ``a``; matching the formula would mean a
custom ``MessagePassing`` subclass anyway, at the price of a new dependency.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from sessionrl.session.model import Session

NODE_TYPES: Final = ("request", "subgoal", "skill", "call", "entity")
EDGE_TYPES: Final = ("depends_on", "serves", "called", "produced", "mentions")
RELATIONS: Final = 2 * len(EDGE_TYPES)
"""Each edge type forwards (index ``t``) and backwards (index ``t + len(EDGE_TYPES)``)."""

REQUEST, SUBGOAL, SKILL, CALL, ENTITY = range(len(NODE_TYPES))
DEPENDS_ON, SERVES, CALLED, PRODUCED, MENTIONS = range(len(EDGE_TYPES))


@dataclass(frozen=True)
class SessionGraph:
    """A batch of typed graphs as one disjoint union (see the module doc for each field's shape)."""

    x: Tensor
    node_type: Tensor
    edge_index: Tensor
    edge_type: Tensor
    graph: Tensor
    graphs: int

    def with_reverse_edges(self) -> tuple[Tensor, Tensor]:
        """Edges ``[2, 2E]`` and relations ``[2E]``: each edge, then each backwards as its own relation."""
        backwards = self.edge_index.flip(0)
        edges = torch.cat([self.edge_index, backwards], dim=1)
        return edges, torch.cat([self.edge_type, self.edge_type + len(EDGE_TYPES)])


def segment_softmax(scores: Tensor, segment: Tensor, segments: int) -> Tensor:
    """Softmax of ``scores`` ``[E]`` within each segment (the edges into one node), ``[E]``.

    >>> segment_softmax(torch.tensor([0.0, 0.0, 5.0]), torch.tensor([0, 0, 1]), 2).tolist()
    [0.5, 0.5, 1.0]
    """
    top = torch.full((segments,), float("-inf"), dtype=scores.dtype, device=scores.device)
    top = top.scatter_reduce(0, segment, scores, reduce="amax", include_self=True)
    exp = (scores - top[segment]).exp()
    total = torch.zeros(segments, dtype=scores.dtype, device=scores.device).index_add_(0, segment, exp)
    return exp / total[segment]


class GatedAttention(nn.Module):
    """One round of gated attention over typed edges (see the module doc)."""

    def __init__(self, dim: int, relations: int = RELATIONS, slope: float = 0.2) -> None:
        super().__init__()
        self.w_h = nn.Linear(dim, dim, bias=False)
        self.w_r = nn.Parameter(torch.empty(relations, dim, dim))
        self.a = nn.Parameter(torch.empty(2 * dim))
        self.slope = slope
        nn.init.xavier_uniform_(self.w_r.view(relations * dim, dim))
        nn.init.normal_(self.a, std=(1.0 / dim) ** 0.5)

    def messages(self, h: Tensor, edges: Tensor, relation: Tensor) -> tuple[Tensor, Tensor]:
        """``(α [E], W_r h_j [E, D])`` for node states ``h`` ``[N, D]`` and edges ``j → i`` ``[2, E]``."""
        dim = h.shape[-1]
        source, target = edges
        own = self.w_h(h)
        projected = torch.einsum("rij,nj->rni", self.w_r, h)[relation, source]  # [E, D]
        scores = own[target] @ self.a[:dim] + projected @ self.a[dim:]
        alpha = segment_softmax(F.leaky_relu(scores, self.slope), target, h.shape[0])
        return alpha, projected

    def attention(self, h: Tensor, edges: Tensor, relation: Tensor) -> Tensor:
        """The weights ``α_ij`` ``[E]``; over the edges into each node they sum to 1."""
        return self.messages(h, edges, relation)[0]

    def forward(self, h: Tensor, edges: Tensor, relation: Tensor) -> Tensor:
        """Node states ``[N, D]`` after one round; a node without in-edges keeps ``h + tanh(W_h h)``."""
        alpha, projected = self.messages(h, edges, relation)
        gathered = torch.zeros_like(h).index_add_(0, edges[1], alpha[:, None] * projected)
        return h + torch.tanh(self.w_h(h) + gathered)


class GraphEncoder(nn.Module):
    """Typed input projections, `layers` rounds of `GatedAttention`, and a readout ``[G, dim]`` per graph:
    the mean over its nodes beside the state of its first node, which both builders make the request."""

    def __init__(self, features: int, dim: int, layers: int = 2) -> None:
        super().__init__()
        self.inputs = nn.ModuleList(nn.Linear(features, dim) for _ in NODE_TYPES)
        self.layers = nn.ModuleList(GatedAttention(dim) for _ in range(layers))
        self.readout = nn.Sequential(nn.Linear(2 * dim, dim), nn.Tanh())
        self.dim = dim

    def forward(self, g: SessionGraph) -> Tensor:
        h = torch.zeros((g.x.shape[0], self.dim), dtype=g.x.dtype, device=g.x.device)
        for kind, project in enumerate(self.inputs):
            rows = g.node_type == kind
            h[rows] = torch.tanh(project(g.x[rows]))
        edges, relation = g.with_reverse_edges()
        for layer in self.layers:
            h = layer(h, edges, relation)
        count = torch.zeros(g.graphs, dtype=h.dtype, device=h.device).index_add_(
            0, g.graph, torch.ones_like(g.graph, dtype=h.dtype)
        )
        mean = torch.zeros((g.graphs, self.dim), dtype=h.dtype, device=h.device).index_add_(0, g.graph, h)
        mean = mean / count.clamp_min(1.0)[:, None]
        first = torch.ones_like(g.graph, dtype=torch.bool)
        first[1:] = g.graph[1:] != g.graph[:-1]
        readout: Tensor = self.readout(torch.cat([mean, h[first]], dim=-1))
        return readout


@dataclass(frozen=True, slots=True)
class ObservationLayout:
    """Where an observation's parts sit in the flat vector (`structured.OBS_KEYS` order) and how wide node
    features are: ``skills`` callable skills (finish is one more), ``features`` domain features."""

    skills: int
    features: int
    text_dim: int

    @property
    def nodes(self) -> int:
        """Candidate nodes per observation: request, skills and finish, a call per skill, entities."""
        return 1 + (self.skills + 1) + self.skills + self.features

    @property
    def width(self) -> int:
        """Node feature width: wide enough for the widest node type, zero-padded."""
        return max(self.text_dim + 1, self.skills + 2, self.features + 1)

    def template(self) -> tuple[Tensor, Tensor]:
        """Every candidate edge of one observation (``[2, E]``, ``[E]``), by node position."""
        s, f = self.skills, self.features
        skill = [1 + k for k in range(s + 1)]
        call = [2 + s + k for k in range(s)]
        entity = [2 + 2 * s + k for k in range(f)]
        edges = [(k, 0, SERVES) for k in skill]
        edges += [(skill[k], call[k], CALLED) for k in range(s)]
        edges += [(c, e, PRODUCED) for c in call for e in entity]
        edges += [(0, e, MENTIONS) for e in entity]
        table = torch.tensor(edges, dtype=torch.long).T
        return table[:2], table[2]


def observation_graphs(obs: Tensor, text: Tensor, layout: ObservationLayout) -> SessionGraph:
    """Graphs ``G = B`` of a batch of flat observations ``[B, obs_dim]`` and query embeddings
    ``[B, text_dim]`` (see the module doc). Absent call and entity nodes are dropped with their edges."""
    b, s, f = obs.shape[0], layout.skills, layout.features
    step, succeeded = obs[:, :1], obs[:, 1 : 1 + s]
    failed, feats = obs[:, 1 + s : 1 + 2 * s], obs[:, 1 + 2 * s : 1 + 2 * s + f]
    mask = obs[:, 1 + 2 * s + f :]
    x = torch.zeros((b, layout.nodes, layout.width), dtype=obs.dtype)
    x[:, 0, : layout.text_dim + 1] = torch.cat([text, step], dim=-1)
    x[:, 1 : s + 2, : s + 1] = torch.eye(s + 1, dtype=obs.dtype)
    x[:, 1 : s + 2, s + 1] = mask
    x[:, s + 2 : 2 * s + 2, :s] = torch.eye(s, dtype=obs.dtype)
    x[:, s + 2 : 2 * s + 2, s] = succeeded
    x[:, s + 2 : 2 * s + 2, s + 1] = failed
    x[:, 2 * s + 2 :, :f] = torch.eye(f, dtype=obs.dtype)
    x[:, 2 * s + 2 :, f] = feats
    kinds = [REQUEST] + [SKILL] * (s + 1) + [CALL] * s + [ENTITY] * f
    node_type = torch.tensor(kinds, dtype=torch.long).expand(b, -1)
    present = torch.ones((b, layout.nodes), dtype=torch.bool)
    present[:, s + 2 : 2 * s + 2] = (succeeded + failed) > 0
    present[:, 2 * s + 2 :] = feats > 0
    edges, edge_type = layout.template()
    keep = present[:, edges[0]] & present[:, edges[1]]  # [B, E]
    new_id = present.reshape(-1).cumsum(0) - 1  # position of each kept node in the union
    offset = torch.arange(b)[:, None] * layout.nodes
    flat_edges = (edges[None, :, :] + offset[:, None, :]).transpose(0, 1)[:, keep]
    graph = torch.arange(b)[:, None].expand(b, layout.nodes)
    return SessionGraph(
        x=x[present],
        node_type=node_type[present],
        edge_index=new_id[flat_edges],
        edge_type=edge_type.expand(b, -1)[keep],
        graph=graph[present],
        graphs=b,
    )


def session_graph(session: Session, embed: Callable[[Sequence[str]], Tensor]) -> SessionGraph:
    """One stored session as a graph whose node features are `embed` ``[n, F]`` of a text per node:
    the user query, each sub-goal's description, each skill's name, each call's tool and status, and each
    parameter value (an entity) as ``name=value``. Edges: depends_on between sub-goals, serves from
    sub-goals and skills to the request, called from a skill to its calls, called from a call's sub-goal to
    the call, produced from a call to its parameter entities, mentions from the request to entities whose
    value the query contains."""
    texts, kinds, edges = [session.user_query], [REQUEST], []

    def node(text: str, kind: int) -> int:
        texts.append(text)
        kinds.append(kind)
        return len(texts) - 1

    subgoals = session.plan.subgoals if session.plan is not None else ()
    goal = {sub.id: node(sub.description, SUBGOAL) for sub in subgoals}
    edges += [(goal[sub.id], 0, SERVES) for sub in subgoals]
    edges += [
        (goal[dep], goal[sub.id], DEPENDS_ON) for sub in subgoals for dep in sub.depends_on if dep in goal
    ]
    skill: dict[str, int] = {}
    entity: dict[str, int] = {}
    for call in session.tool_calls:
        if call.tool not in skill:
            skill[call.tool] = node(call.tool, SKILL)
            edges.append((skill[call.tool], 0, SERVES))
        made = node(f"{call.tool} {call.status.value}", CALL)
        edges.append((skill[call.tool], made, CALLED))
        if call.subgoal_id in goal:
            edges.append((goal[call.subgoal_id], made, CALLED))
        for name, value in sorted(call.params.items()):
            key = f"{name}={value}"
            if key not in entity:
                entity[key] = node(key, ENTITY)
                if str(value) and str(value) in session.user_query:
                    edges.append((0, entity[key], MENTIONS))
            edges.append((made, entity[key], PRODUCED))
    table = torch.tensor(edges, dtype=torch.long).reshape(-1, 3).T
    return SessionGraph(
        x=embed(texts),
        node_type=torch.tensor(kinds, dtype=torch.long),
        edge_index=table[:2],
        edge_type=table[2],
        graph=torch.zeros(len(texts), dtype=torch.long),
        graphs=1,
    )


__all__ = [
    "EDGE_TYPES",
    "NODE_TYPES",
    "RELATIONS",
    "GatedAttention",
    "GraphEncoder",
    "ObservationLayout",
    "SessionGraph",
    "observation_graphs",
    "segment_softmax",
    "session_graph",
]
