"""The RL stage's collapse guard: `sessionrl.eval.collapse` applied to the loop's iterations, with the
weights to roll back to.

Iteration i's rollouts are played by the weights of policy version i, so they judge those weights; the
update that follows makes version i + 1, judged by the next iteration's rollouts. `Guard` keeps a copy of
the weights whose judgement is pending and, when the rollouts find them healthy, writes them to
`good_policy.safetensors` in the run folder: the last good checkpoint. The weights RL starts from are the
imitation policy's, the watch's baseline, and are written there first. Only trainable parameters are
kept (all of a tiny model, the adapters of a LoRA one).

On a collapse, `stop_collapsed` rolls the model back to that file (with `action: rollback`), writes the
`collapse` record of metrics.jsonl and `pause_report.json`, and says so on the console; the loop then
stops RL, has dev validation (`rl.dev_tasks`) judge what the model holds, and exports it. A resumed run
rebuilds the watch from the iteration records of its checkpoint and finds the good weights on disk.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from sessionrl.eval.autopause import REPORT, diagnose, write_report
from sessionrl.eval.collapse import CollapseConfig, CollapseWatch, Health, Verdict
from sessionrl.session.model import Session
from sessionrl.train.llm.run import Run

GOOD = "good_policy.safetensors"
"""The last healthy policy's trainable weights, in the run folder."""
UNDONE = "dev_undone"
"""The key of an iteration record (`rl`) whose update dev validation undid."""


def trainable_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of the parameters that train (on the CPU, contiguous)."""
    return {
        name: p.detach().to("cpu", copy=True).contiguous()
        for name, p in model.named_parameters()
        if p.requires_grad
    }


def restore_weights(model: torch.nn.Module, saved: Mapping[str, torch.Tensor], source: str) -> None:
    """Copy `saved` (as `trainable_weights` took them) back into `model`'s trainable parameters; `source`
    names where they came from in the error when some are missing."""
    trained = {name: p for name, p in model.named_parameters() if p.requires_grad}
    if missing := sorted(trained.keys() - saved.keys()):
        raise ValueError(f"{source} lacks {len(missing)} trained weights ({missing[0]}, ...)")
    with torch.no_grad():
        for name, p in trained.items():
            p.copy_(saved[name].to(p.device))


class Guard:
    """The collapse watch of one RL stage (see the module doc)."""

    def __init__(
        self, config: CollapseConfig, model: torch.nn.Module, folder: Path, curve: Sequence[Mapping[str, Any]]
    ) -> None:
        self.config = config
        self.model = model
        self.path = folder / GOOD
        self.watch = CollapseWatch(config)
        for record in curve:  # a resumed run: the iterations already judged, and the undone updates
            self.watch.observe(int(record["iteration"]), Health.from_record(record))
            if record.get(UNDONE):
                self.watch.restart()
        self.pending = trainable_weights(model)
        """The weights the next rollout plays (not judged yet)."""
        if not self.path.is_file():
            self._save_good(self.pending, iteration=-1)  # the imitation policy: the baseline itself

    def judge(self, iteration: int, sessions: Sequence[Session], record: dict[str, Any]) -> Verdict:
        """Judge iteration `iteration` from its rollouts and record (its health is added to `record`); the
        weights that played it become the last good ones when it is healthy."""
        health = Health.of(sessions, record)
        record.update(health.as_record())
        verdict = self.watch.observe(iteration, health)
        if verdict.healthy:
            self._save_good(self.pending, iteration)
        self.pending = trainable_weights(self.model)  # after this iteration's update
        return verdict

    def undone(self, weights: dict[str, torch.Tensor]) -> None:
        """Dev validation undid the updates since the weights it kept: `weights` (those) play next, and the
        unhealthy streak of the undone ones ends."""
        self.pending = weights
        self.watch.restart()

    def roll_back(self) -> int:
        """Load the last good weights into the model; the iteration whose rollouts judged them (-1: the
        weights RL started from, not judged yet)."""
        weights, metadata = read_weights(self.path)
        restore_weights(self.model, weights, str(self.path))
        return int(metadata["iteration"])

    def _save_good(self, weights: Mapping[str, torch.Tensor], iteration: int) -> None:
        save_weights(self.path, weights, {"iteration": str(iteration)})


def save_weights(path: Path, weights: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> None:
    """Write `weights` (as `trainable_weights` takes them) with `metadata` to `path` in one step: a crash
    leaves the file before or after, never half of it."""
    tmp = path.with_name(path.name + ".tmp")
    save_file(dict(weights), str(tmp), metadata=dict(metadata))
    tmp.replace(path)


def read_weights(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The weights and metadata `save_weights` wrote to `path`."""
    with safe_open(str(path), framework="pt") as f:
        metadata = f.metadata()
    return load_file(str(path)), dict(metadata)


def last_healthy(back: int | None) -> str:
    """The weights in `GOOD`, in words, from the iteration whose rollouts judged them healthy (`back`,
    counted from 0; -1 or None: none, the weights RL started from). The console counts from 1, and the
    weights that played iteration 0 are the imitation policy's."""
    if back is None or back <= 0:
        return "the imitation policy's weights"
    return f"the weights that played iteration {back + 1}"


def stop_collapsed(
    run: Run,
    guard: Guard,
    verdict: Verdict,
    sessions: Sequence[Session],
    console: Console,
    *,
    judged: bool = False,
) -> str:
    """Act on a collapse (roll back, or not, as configured), log it, write the report and say so; returns
    the message printed. `judged`: dev validation judges the weights next, and may undo them."""
    why = guard.watch.describe()
    holds = "dev validation judges it next" if judged else "rl_policy/ holds it"
    if guard.config.action == "rollback":
        back = guard.roll_back()
        done = f"rolled back to {last_healthy(back)}, the last healthy; {holds}"
    else:
        back = None
        done = f"kept the collapsed weights (rl.collapse.action: stop); {holds}"
    message = f"RL stopped at iteration {verdict.iteration + 1}: the policy collapsed ({why}); {done}."
    run.log.write(
        "collapse",
        verdict.iteration,
        {"reason": why, "action": guard.config.action, "rolled_back_to": back, "message": message},
    )
    streak = [{"iteration": v.iteration, "problems": list(v.problems)} for v in guard.watch.streak]
    write_report(
        run.folder / REPORT, {**diagnose("collapse", [], sessions), "history": streak, "reason": why}
    )
    console.print(f"[bold red]collapse:[/bold red] {message}", soft_wrap=True)
    return message


def warn_blind(run: Run, guard: Guard, console: Console) -> str | None:
    """When the baseline leaves some of the watch's rules unable to fire (`CollapseWatch.blind`), say so
    once, after the iteration that set it, and log it (`blind` record): the watch is then narrower than its
    configuration reads. Returns the message printed, or None."""
    blind = guard.watch.blind
    if not blind or not guard.config.enabled:
        return None
    message = (
        f"the collapse watch cannot fire on {' or '.join(blind)} in this RL stage; its baseline is the"
        " imitation policy's rollouts in the first iteration. rl.dev_tasks judges the weights on dev tasks"
        " (docs/collapse.md)."
    )
    run.log.write("blind", run.state.step, {"rules": list(blind)})
    console.print(f"[bold yellow]warning:[/bold yellow] {message}", soft_wrap=True)
    return message


def warn_unsettled(run: Run, guard: Guard, console: Console, exported: str = "the last update") -> str | None:
    """When RL ended on unhealthy iterations too few to call a collapse (`CollapseWatch.unsettled`), say
    so and log it (`unsettled` record): rl_policy/ holds `exported` (the last update, unless dev
    validation undid it), and the last healthy weights stay in the run folder. Returns the message
    printed, or None."""
    watch = guard.watch
    if not watch.unsettled:
        return None
    back = watch.last_good
    message = (
        f"RL ended on unhealthy rollouts ({watch.describe()}), fewer in a row than rl.collapse.patience ="
        f" {guard.config.patience}: rl_policy/ holds {exported}; {last_healthy(back)}, the last judged"
        f" healthy, are in {GOOD}."
    )
    run.log.write("unsettled", run.state.step, {"reason": watch.describe(), "last_good": back})
    console.print(f"[bold yellow]warning:[/bold yellow] {message}", soft_wrap=True)
    return message


__all__ = [
    "GOOD",
    "UNDONE",
    "Guard",
    "read_weights",
    "restore_weights",
    "save_weights",
    "stop_collapsed",
    "trainable_weights",
    "warn_blind",
    "warn_unsettled",
]
