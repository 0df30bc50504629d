"""DPO with counterfactual hard negatives against DPO with random negatives, on orders.

A tiny model imitates expert demonstrations briefly (`--sft-steps`), then plays training tasks it never
imitated; each failed episode gives one pair at its failing step (`sessionrl.train.llm.negatives`): the
best replayed alternative as chosen, and as rejected either the worst replayed alternative (counterfactual)
or a random action of another task (random). Both pair sets share prompts and chosen replies. Two copies of
the imitation policy are trained by DPO, one per set, with the same settings, then evaluated greedily with
the imitation policy on the same test tasks and faults.

Last line: one JSON object with `random_success`, `counterfactual_success`, `sft_success`, `pairs`,
`failures` and `minutes`.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import random
import tempfile
import time
from pathlib import Path

import orjson

from sessionrl.envs import build
from sessionrl.envs.base import DecisionEnv, Split, Task, stream_seed
from sessionrl.episodes import EpisodeSpec, RolloutConfig, expert, run_episodes
from sessionrl.episodes.llm import PolicyAgent, prompt_messages
from sessionrl.eval.metrics import success_rate, task_success
from sessionrl.policy.llm import HFPolicy, SamplingConfig
from sessionrl.policy.tiny import TinyModelConfig, build_tiny_policy
from sessionrl.session import Session
from sessionrl.store import SessionStore
from sessionrl.train.llm.data import demonstration_turns, merge_turns
from sessionrl.train.llm.dpo import DPOConfig, DPOTrainer
from sessionrl.train.llm.negatives import counterfactual_pair, random_pair
from sessionrl.train.llm.run import split_digits, tokenizer_corpus
from sessionrl.train.llm.sft import SFTConfig, SFTTrainer

ROLLOUT = RolloutConfig(max_steps=7, full_schemas=False, domain_policy=False, max_tool_chars=300)


def play(env: DecisionEnv, policy: HFPolicy, tasks: list[Task], label: str) -> list[Session]:
    """One greedy episode per task, seeded by the task (no faults, so only the policy differs)."""
    store = SessionStore.open("sqlite://")
    specs = [EpisodeSpec(t, f"{label}-{t.task_id}", seed=stream_seed("negatives", t.task_id)) for t in tasks]
    greedy = copy.copy(policy)
    greedy.sampling = SamplingConfig(max_new_tokens=64, temperature=0.0)
    ran = asyncio.run(run_episodes(env, specs, PolicyAgent(greedy, 0), store, ROLLOUT))
    return [store.get(r.session_id) for r in ran]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demos", type=int, default=120)
    parser.add_argument("--sft-steps", type=int, default=40)
    parser.add_argument("--pair-tasks", type=int, default=40)
    parser.add_argument("--dpo-steps", type=int, default=30)
    parser.add_argument("--eval-tasks", type=int, default=30)
    parser.add_argument("--hidden-size", type=int, default=64)
    args = parser.parse_args()
    started = time.monotonic()
    env = build("orders", train=args.demos + args.pair_tasks, dev=1, test=args.eval_tasks, time_factor=0)
    # imitation
    store = SessionStore.open("sqlite://")
    demo_tasks = env.tasks(Split.TRAIN)[: args.demos]
    ran = asyncio.run(run_episodes(env, [EpisodeSpec(t) for t in demo_tasks], expert(env), store, ROLLOUT))
    demos = [store.get(r.session_id) for r in ran if r.success]
    system = prompt_messages(env, demo_tasks[0], ROLLOUT)[0].content
    shape = TinyModelConfig(vocab_size=1024, hidden_size=args.hidden_size, num_layers=2, num_heads=2)
    with tempfile.TemporaryDirectory() as folder:
        model, tokenizer = build_tiny_policy(tokenizer_corpus(env, system, demos, 300), shape, Path(folder))
        split_digits(tokenizer)
    policy = HFPolicy(model, tokenizer, SamplingConfig(max_new_tokens=64))
    data = [seq for s in demos for seq in merge_turns(demonstration_turns(s, system, policy, 300))]
    trainer = SFTTrainer(
        policy.model, SFTConfig(lr=5e-3, steps=args.sft_steps, batch_sessions=8), tokenizer.pad_token_id
    )
    for step in range(args.sft_steps):
        trainer.step(random.Random(step).sample(data, min(8, len(data))))
    # pairs at the failing steps of the imitation policy's failures on unseen training tasks
    tried = play(env, policy, list(env.tasks(Split.TRAIN)[args.demos :]), "try")
    tasks = {t.task_id: t for t in env.tasks(Split.TRAIN)}
    failed = [s for s in tried if task_success(s) is False]
    rng = random.Random(0)
    hard, easy = [], []
    for session in failed:
        found = counterfactual_pair(env, tasks[str(session.metadata["task_id"])], session, system, 300)
        if found is not None:
            hard.append(found[0])
            easy.append(random_pair(found[0], env, rng))
    print(f"{len(failed)} failures of {len(tried)} episodes; {len(hard)} pairs")
    # DPO, one copy per pair set, then the same held-out tasks
    test = list(env.tasks(Split.TEST))
    results = {"sft": success_rate(play(env, policy, test, "sft"))}
    for name, pairs in (("random", easy), ("counterfactual", hard)):
        student = HFPolicy(copy.deepcopy(policy.model), tokenizer, SamplingConfig(max_new_tokens=64))
        if pairs:
            DPOTrainer(student, DPOConfig(beta=0.1, lr=5e-4, steps=args.dpo_steps, batch_size=8)).fit(pairs)
        results[name] = success_rate(play(env, student, test, name))
        print(f"{name}: success {results[name]:.3f}")
    summary = {
        "random_success": results["random"],
        "counterfactual_success": results["counterfactual"],
        "sft_success": results["sft"],
        "pairs": len(hard),
        "failures": len(failed),
        "eval_tasks": len(test),
        "minutes": round((time.monotonic() - started) / 60, 2),
    }
    print(orjson.dumps(summary).decode())


if __name__ == "__main__":
    main()
