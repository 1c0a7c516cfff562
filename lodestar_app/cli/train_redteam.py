"""The red-team pass of `lodestar train`: before the first step, `lodestar redteam`'s hacks attack the run's
verifier on a few of its tasks (`[redteam]` table, train_config.py), through the stack's own rollout, gateway
node and runtime, and training is refused when one pays (FailedPreconditionError naming the hack and the
task). A hack that only leaked (read an answer the served model did not repeat) or escaped gets a loud warning
with the table, not a refusal: the policy being trained may not use it yet. `--no-redteam` (or `enabled =
false`) skips the pass with a loud warning.

On the stack `lodestar train` trains with, the final answer of every agent is the served model's greedy reply
to the same message, so an answer a hack found reaches the verifier only if that model repeats it; the agent's
own report still marks the leak (lodestar_app/cli/redteam.py, docs/redteam.md).
"""

from __future__ import annotations

import time

from rich.console import Console

from lodestar.errors import FailedPreconditionError
from lodestar.logging import get_logger
from lodestar.v1 import rollout_pb2
from lodestar_app.cli.train_config import RedTeamConfig

log = get_logger("cli.train_redteam")

SKIPPED = (
    "WARNING: the red-team pass is skipped (--no-redteam / [redteam] enabled = false): this run's verifier was "
    "not attacked before training, and a policy trained on a verifier that can be fooled learns to fool it"
)


def warn_skipped(console: Console) -> None:
    console.print(f"[bold red]{SKIPPED}[/]", highlight=False)
    log.warning("red-team pass skipped", reason="--no-redteam or [redteam] enabled = false")


async def pre_pass(config: RedTeamConfig, spec: rollout_pb2.RunSpec, rollout: str, console: Console) -> float:
    """Attack `spec`'s verifier through the stack at `rollout`; the seconds it took. FailedPreconditionError
    when a hack paid."""
    from lodestar_app.cli import redteam_run as redteam  # needs the gateway's package: imported on use

    started = time.monotonic()
    hacks = redteam.chosen_hacks(spec.verifier.kind, list(config.hacks) or None)
    specs = redteam.hack_specs(spec, hacks, config.tasks)
    console.print(f"red team: {len(hacks)} hack kinds x {min(config.tasks, len(spec.tasks))} tasks before training")
    cells = await redteam.red_team(
        rollout, specs, timeout_s=config.timeout_s, pass_threshold=config.pass_threshold, console=console
    )
    seconds = time.monotonic() - started
    failing = redteam.failures(cells)
    paid = [cell for cell in failing if cell.verdict == "paid"]
    log.info("red-team pass", hacks=len(hacks), sessions=len(cells), failing=len(failing), seconds=round(seconds, 1))
    if failing:
        console.print(redteam.table(cells, title="red team before training"))
    if paid:
        first = paid[0]
        raise FailedPreconditionError(
            f"refusing to train: hack {first.hack!r} {first.verdict} on task {first.task_id!r} "
            f"({'; '.join(first.evidence)[:300]}). {redteam.summary(cells)}. Fix the verifier or the sandbox "
            "(docs/redteam.md), or train anyway with --no-redteam"
        )
    if why := redteam.unscored(cells):
        console.print(f"[bold red]WARNING: the red team could not score: {why}[/]", highlight=False)
        log.warning("red-team pass scored nothing", reason=why)
    elif failing:  # leaked or escaped, nothing paid: the served policy may not use it yet; a stronger one will
        console.print(f"[bold red]WARNING: {redteam.summary(cells)}[/] (docs/redteam.md)", highlight=False)
        log.warning("red-team pass: leaks", summary=redteam.summary(cells))
    else:
        console.print(f"red team: {redteam.summary(cells)} in {seconds:.0f} s")
    return seconds
