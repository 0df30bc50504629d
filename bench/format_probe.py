"""How much imitation teaches SmolLM2-135M-Instruct to write tool calls: the parse rate on held-out turns.

The run of `examples/retail-smollm2.yaml` (sizes and prompt from the flags) records `--demos` expert
sessions, keeps the last `--held` of them out, and takes LoRA SFT steps of `--batch` demonstrations on
the others. At each step listed in `--checks` the policy answers, greedily, the held-out conversations up
to each expert tool call (the first `--turns` whose prompt fits `--max-prompt` tokens); a reply counts as
parsed when the policy's format reads a tool call in it, as right when it names the expert's tool, and as
exact when its arguments are the expert's too.

One line per check, then one JSON object: ``checks`` (step, parsed, right, exact, valid, turns, seconds)
and ``minutes``. Steps are cheap next to `bench/real_model.py`'s evaluations, which play whole episodes.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import torch
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))

from real_model import EXAMPLE
from sessionrl.policy.llm import HFPolicy, SamplingConfig
from sessionrl.policy.toolcalls import parse_reply
from sessionrl.train.config import EnvSection, RunConfig
from sessionrl.train.llm.data import Reply, demonstration_replies
from sessionrl.train.llm.imitation import demonstrations, record_demonstrations
from sessionrl.train.llm.run import build_policy, open_run
from sessionrl.train.llm.sft import SFTTrainer


def configured(args: argparse.Namespace) -> RunConfig:
    """The example's run for `--env`, with the imitation sizes and the prompt the flags ask for."""
    base = RunConfig.load(EXAMPLE)
    options = {"data": args.data} if args.env == "retail" and args.data else {}
    rollout = dataclasses.replace(
        base.rollout, full_schemas=args.prompt == "full", domain_policy=args.prompt != "short"
    )
    steps = max(args.checks)
    trainer = dataclasses.replace(
        base.sft.trainer, steps=steps, batch_sessions=args.batch, lr=args.lr, warmup_steps=min(5, steps)
    )
    sft = base.sft.model_copy(update={"demos": args.demos, "trainer": trainer})
    update = {"run_dir": args.out / args.env, "env": EnvSection(name=args.env, options=options)}
    return RunConfig.model_validate(
        base.model_copy(update={**update, "rollout": rollout, "sft": sft}).model_dump()
    )


def check(policy: HFPolicy, replies: list[Reply], prompts: list[list[int]], step: int) -> dict[str, Any]:
    """The held-out turns answered greedily at `step`: how many replies parse, and are right and exact."""
    started = time.monotonic()
    view = policy.view(SamplingConfig(max_new_tokens=48, temperature=0.0, max_prompt_tokens=4096))
    answers = view.sample_prompts(prompts)
    fmt = policy.tool_format
    parsed = right = exact = valid = 0
    for reply, answer in zip(replies, answers, strict=True):
        (want,) = parse_reply(fmt, reply.text).tool_calls
        got = parse_reply(fmt, answer.text)
        valid += got.valid
        parsed += bool(got.tool_calls)
        if got.tool_calls and got.tool_calls[0].name == want.name:
            right += 1
            exact += orjson.loads(got.tool_calls[0].arguments) == orjson.loads(want.arguments)
    seconds = round(time.monotonic() - started, 1)
    found = {"step": step, "parsed": parsed, "right": right, "exact": exact, "valid": valid}
    return found | {"turns": len(replies), "seconds": seconds, "example": answers[0].text[:120]}


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/format_probe"), help="where the run goes")
    parser.add_argument("--data", default=os.environ.get("SESSIONRL_RETAIL_DATA"), help="retail data folder")
    parser.add_argument("--env", default="retail", help="domain")
    parser.add_argument("--prompt", choices=["full", "brief", "short"], default="short", help="system prompt")
    parser.add_argument("--demos", type=int, default=24, help="expert sessions recorded")
    parser.add_argument("--held", type=int, default=3, help="of them, kept out of training")
    parser.add_argument("--turns", type=int, default=8, help="held-out tool-call turns answered")
    parser.add_argument("--max-prompt", type=int, default=1100, help="longest held-out prompt, in tokens")
    parser.add_argument("--batch", type=int, default=1, help="demonstrations per SFT step")
    parser.add_argument("--lr", type=float, default=2e-3, help="SFT learning rate")
    parser.add_argument("--checks", type=lambda s: [int(x) for x in s.split(",")], default=[0, 15, 30])
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    return parser.parse_args()


def main() -> None:
    args = arguments()
    torch.set_num_threads(args.threads)
    started = time.monotonic()
    cfg = configured(args)
    with open_run(cfg) as run:
        demos = record_demonstrations(run, Console())
        run.policy = policy = build_policy(cfg, [], run.folder / "base")
        train, held = demos[: -args.held], demos[-args.held :]
        sequences = demonstrations(run, policy, train)
        calls = [
            r
            for s in held
            for r in demonstration_replies(s, run.system, cfg.rollout.max_tool_chars, policy.tool_format)
            if parse_reply(policy.tool_format, r.text).tool_calls
        ]
        fitting = [(r, p) for r in calls if len(p := policy.encode_prompt(r.messages)) <= args.max_prompt]
        replies, prompts = [r for r, _ in fitting[: args.turns]], [p for _, p in fitting[: args.turns]]
        trainer = SFTTrainer(policy.model, cfg.sft.trainer, policy.tokenizer.pad_token_id)
        rng, found = random.Random(cfg.seed), []
        for step in range(max(args.checks) + 1):
            if step in args.checks:
                found.append(check(policy, replies, prompts, step))
                print(orjson.dumps(found[-1]).decode(), flush=True)
            if step < max(args.checks):
                stats = trainer.step(rng.sample(sequences, min(args.batch, len(sequences))))
                policy.version += 1  # new weights: the engine drops what it kept from the old ones
                print(f"  step {step}: loss {stats.loss:.3f}", flush=True)
    minutes = round((time.monotonic() - started) / 60, 2)
    print(
        orjson.dumps(
            {"checks": [{k: v for k, v in c.items() if k != "example"} for c in found], "minutes": minutes}
        ).decode()
    )


if __name__ == "__main__":
    main()
