"""The session graph and its gated-attention GNN: attention weights by hand, shapes, builders."""

from __future__ import annotations

import doctest
import math
from datetime import UTC, datetime

import numpy as np
import pytest
import torch

from sessionrl.envs.base import Split
from sessionrl.envs.gym import DecisionGymEnv
from sessionrl.envs.orders import DomainConfig, OrdersEnv
from sessionrl.policy import graph
from sessionrl.policy.graph import (
    CALL,
    CALLED,
    DEPENDS_ON,
    ENTITY,
    MENTIONS,
    PRODUCED,
    REQUEST,
    SERVES,
    SKILL,
    SUBGOAL,
    GatedAttention,
    GraphEncoder,
    ObservationLayout,
    SessionGraph,
    observation_graphs,
    segment_softmax,
    session_graph,
)
from sessionrl.policy.structured import GRAPH_LR_SCALE, build_policy, flatten_observation
from sessionrl.session.model import Plan, Session, SubGoal, ToolCall


def test_doctests_pass() -> None:
    assert doctest.testmod(graph).failed == 0


def one_dim_layer(a: tuple[float, float]) -> GatedAttention:
    """W_h = 1, W_r = 2 (one relation), a as given: scores are LeakyReLU(a0·h_i + a1·2·h_j)."""
    layer = GatedAttention(1, relations=1)
    with torch.no_grad():
        layer.w_h.weight.fill_(1.0)
        layer.w_r.fill_(2.0)
        layer.a.copy_(torch.tensor(a))
    return layer


H = torch.tensor([[1.0], [2.0], [3.0]])
EDGES = torch.tensor([[1, 2, 0], [0, 0, 1]])  # 1 → 0, 2 → 0, 0 → 1; node 2 hears nobody
RELATION = torch.zeros(3, dtype=torch.long)


def test_attention_on_three_nodes_by_hand() -> None:
    alpha = one_dim_layer((1.0, 1.0)).attention(H, EDGES, RELATION)
    # e_01 = 1 + 2·2 = 5, e_02 = 1 + 2·3 = 7 (positive: LeakyReLU passes them); node 1 has one neighbour
    expected = [1 / (1 + math.exp(2)), math.exp(2) / (1 + math.exp(2)), 1.0]
    assert alpha.tolist() == pytest.approx(expected, rel=1e-6)


def test_attention_leaky_relu_scales_negative_scores() -> None:
    alpha = one_dim_layer((1.0, -1.0)).attention(H, EDGES, RELATION)
    # e_01 = LeakyReLU(1 - 4) = -0.6, e_02 = LeakyReLU(1 - 6) = -1.0: softmax of (-0.6, -1.0)
    low = 1 / (1 + math.exp(-0.4))
    assert alpha.tolist() == pytest.approx([low, 1 - low, 1.0], rel=1e-6)


def test_layer_update_by_hand() -> None:
    layer = one_dim_layer((1.0, 1.0))
    out = layer(H, EDGES, RELATION)
    a01 = 1 / (1 + math.exp(2))
    node0 = 1 + math.tanh(1 + a01 * 2 * 2 + (1 - a01) * 2 * 3)
    node1 = 2 + math.tanh(2 + 2 * 1)
    node2 = 3 + math.tanh(3)  # no in-edges: its own projection only
    assert out.squeeze(-1).tolist() == pytest.approx([node0, node1, node2], rel=1e-6)


def test_relations_have_their_own_weights() -> None:
    layer = GatedAttention(4, relations=2)
    h = torch.randn(3, 4)
    same = layer.attention(h, EDGES, RELATION)
    mixed = layer.attention(h, EDGES, torch.tensor([0, 1, 0]))
    assert not torch.allclose(same, mixed)


def test_segment_softmax_sums_to_one_per_target_and_is_stable() -> None:
    scores = torch.tensor([1000.0, 1001.0, -5.0, 3.0])
    weights = segment_softmax(scores, torch.tensor([0, 0, 2, 2]), 3)
    assert torch.isfinite(weights).all()
    assert weights[:2].sum().item() == pytest.approx(1.0)
    assert weights[2:].sum().item() == pytest.approx(1.0)


def tiny_graphs() -> SessionGraph:
    """Two graphs of 3 and 2 nodes with 6-wide features."""
    return SessionGraph(
        x=torch.randn(5, 6),
        node_type=torch.tensor([REQUEST, SKILL, ENTITY, REQUEST, CALL]),
        edge_index=torch.tensor([[1, 0, 4], [0, 2, 3]]),
        edge_type=torch.tensor([SERVES, MENTIONS, SERVES]),
        graph=torch.tensor([0, 0, 0, 1, 1]),
        graphs=2,
    )


def test_encoder_reads_one_vector_per_graph_and_graphs_do_not_mix() -> None:
    torch.manual_seed(0)
    encoder = GraphEncoder(6, 8, layers=2)
    g = tiny_graphs()
    out = encoder(g)
    assert out.shape == (2, 8)
    x = g.x.clone()
    x[4] += 1.0  # a node of the second graph
    moved = encoder(SessionGraph(x, g.node_type, g.edge_index, g.edge_type, g.graph, g.graphs))
    assert torch.equal(moved[0], out[0])
    assert not torch.equal(moved[1], out[1])
    out.sum().backward()
    assert all(p.grad is not None for p in encoder.parameters())


@pytest.fixture(scope="module")
def gym_env() -> DecisionGymEnv:
    env = OrdersEnv(DomainConfig(train=10, dev=0, test=0, time_factor=0, transient_failures=False))
    return DecisionGymEnv(env, Split.TRAIN, seed=0)


def test_observation_graph_has_the_session_parts(gym_env: DecisionGymEnv) -> None:
    obs, _ = gym_env.reset(seed=0)
    skills = len(gym_env.skill_names)
    features = int(np.asarray(obs["features"]).size)
    layout = ObservationLayout(skills, features, text_dim=4)
    flat = torch.from_numpy(flatten_observation(obs))[None].repeat(2, 1)
    flat[1, 1] = 1.0  # the second observation: skill 0 succeeded once
    g = observation_graphs(flat, torch.zeros(2, 4), layout)
    present = int((np.asarray(obs["features"]) > 0).sum())
    first = 1 + (skills + 1) + present
    assert g.graphs == 2
    assert g.x.shape == (2 * first + 1, layout.width)
    assert g.graph.tolist() == [0] * first + [1] * (first + 1)
    kinds = g.node_type[g.graph == 1].tolist()
    assert kinds.count(REQUEST) == 1
    assert kinds.count(SKILL) == skills + 1
    assert kinds.count(CALL) == 1
    assert kinds.count(ENTITY) == present
    second = g.edge_type[g.graph[g.edge_index[0]] == 1].tolist()
    assert second.count(CALLED) == 1
    assert second.count(PRODUCED) == present
    assert second.count(SERVES) == skills + 1
    assert second.count(MENTIONS) == present
    assert g.edge_type[g.graph[g.edge_index[0]] == 0].tolist().count(CALLED) == 0
    assert (g.graph[g.edge_index[0]] == g.graph[g.edge_index[1]]).all()  # no edge crosses graphs


def test_graph_policy_acts_and_masks(gym_env: DecisionGymEnv) -> None:
    obs, _ = gym_env.reset(seed=1)
    torch.manual_seed(0)
    policy = build_policy(gym_env, text_dim=4, hidden=16, state="graph")
    flat = torch.from_numpy(flatten_observation(obs))[None].repeat(3, 1)
    mask = torch.from_numpy(np.asarray(obs["action_mask"], np.int64))[None].repeat(3, 1)
    out = policy(flat, torch.randn(3, 4), mask)
    assert out.value.shape == out.risk_value.shape == (3,)
    probs = out.dist.skill_logits.softmax(-1)
    assert (probs[mask == 0] == 0).all()
    action = out.dist.sample(torch.Generator().manual_seed(0))
    out.dist.log_prob(action).sum().backward()
    assert policy.graph is not None
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.graph.parameters())


def test_the_graph_encoder_learns_at_a_scaled_rate(gym_env: DecisionGymEnv) -> None:
    graph_policy = build_policy(gym_env, text_dim=4, hidden=16, state="graph")
    trunks, encoder = graph_policy.param_groups(0.01)
    assert graph_policy.graph is not None
    assert {id(p) for p in encoder["params"]} == {id(p) for p in graph_policy.graph.parameters()}
    assert (trunks["lr"], encoder["lr"]) == (0.01, pytest.approx(0.01 * GRAPH_LR_SCALE))
    every = [id(p) for p in trunks["params"] + encoder["params"]]
    assert sorted(every) == sorted(id(p) for p in graph_policy.parameters())  # each once
    [only] = build_policy(gym_env, text_dim=4, hidden=16).param_groups(0.01)
    assert only["lr"] == 0.01


def test_session_graph_from_a_stored_session() -> None:
    now = datetime.now(UTC)
    plan = Plan(
        root_goal="refund",
        subgoals=(
            SubGoal(id="g1", description="look up the order", tool="lookup"),
            SubGoal(id="g2", description="refund it", tool="refund", depends_on=("g1",)),
        ),
    )
    calls = (
        ToolCall(call_id="c1", subgoal_id="g1", tool="lookup", params={"order": "O-1"}, status="success"),
        ToolCall(call_id="c2", subgoal_id="g2", tool="refund", params={"order": "O-1"}, status="error"),
        ToolCall(call_id="c3", subgoal_id="g2", tool="refund", params={"cents": 5}, status="success"),
    )
    session = Session(
        session_id="s",
        trace_id="t",
        user_query="refund order O-1",
        plan=plan,
        tool_calls=calls,
        created_at=now,
        updated_at=now,
    )
    g = session_graph(session, lambda texts: torch.ones(len(texts), 3))
    kinds = g.node_type.tolist()
    # request, 2 sub-goals, skills lookup and refund, 3 calls, entities order=O-1 and cents=5
    assert kinds == [REQUEST, SUBGOAL, SUBGOAL, SKILL, CALL, ENTITY, SKILL, CALL, CALL, ENTITY]
    edges = {(s, t, r) for (s, t), r in zip(g.edge_index.T.tolist(), g.edge_type.tolist(), strict=True)}
    assert (1, 2, DEPENDS_ON) in edges
    assert (1, 0, SERVES) in edges
    assert (3, 0, SERVES) in edges
    assert {(3, 4, CALLED), (1, 4, CALLED), (6, 7, CALLED), (2, 7, CALLED), (2, 8, CALLED)} <= edges
    assert {(4, 5, PRODUCED), (7, 5, PRODUCED), (8, 9, PRODUCED)} <= edges
    assert (0, 5, MENTIONS) in edges
    assert (0, 9, MENTIONS) not in edges
    assert (
        len(edges) == g.edge_index.shape[1] == 15
    )  # serves 4, depends_on 1, called 6, produced 3, mentions 1
    assert GraphEncoder(3, 4)(g).shape == (1, 4)
