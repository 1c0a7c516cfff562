"""The chaos run's task: the quickstart's, changed so that an hour of training keeps its reward signal
(bench/chaos.py, docs/chaos.md).

The quickstart's tiny model masters its task in about ten steps; from then on every group is eight answers at
reward 1.0, the trainer drops each as without signal and never steps again, and the faults that wait for a
trainer moment (a push, a checkpoint) never come. Two changes keep it stepping:

- **A damping coin:** the score step multiplies one reward in `DAMPED_ONE_IN` by `DAMPING` (bash's `$RANDOM`,
  drawn per scoring). A group of mastered answers still has a reward below the others with probability
  1 - (1 - 1/4)^8 = 90%; before the take-off it adds a small zero-mean noise. The reward's mean is
  (1 - (1 - DAMPING) / DAMPED_ONE_IN) = 0.9 times the quickstart's, so the rise is still the quickstart's.
- **More tasks:** the quickstart's 480, `COPIES` times over under new ids, so that a run that steps all hour
  does not use them up.
"""

from __future__ import annotations

from lodestar.v1 import rollout_pb2

COPIES = 6
DAMPED_ONE_IN = 4
DAMPING = 0.6
QUICKSTART_AWK = ("awk -v h=", 'printf "%.6f\\n", h / d ')
"""Where the quickstart's score step (examples/quickstart/run.yaml) is given the coin: its awk call, its ratio."""


def damped_score(score: str) -> str:
    """The quickstart's score step with the damping coin (module docstring)."""
    call, ratio = QUICKSTART_AWK
    if score.count(call) != 1 or score.count(ratio) != 1:
        raise ValueError("the quickstart's score step changed: bench/chaos_task.py no longer knows where to damp it")
    coin = f"damp=$(( RANDOM % {DAMPED_ONE_IN} == 0 )); "
    score = score.replace(call, 'awk -v c="$damp" -v h=').replace(ratio, f"{ratio.rstrip()} * (c ? {DAMPING} : 1) ")
    return coin + score


def chaos_spec(quickstart: rollout_pb2.RunSpec) -> rollout_pb2.RunSpec:
    """The quickstart's run spec with the coin and `COPIES` times its tasks."""
    spec = rollout_pb2.RunSpec()
    spec.CopyFrom(quickstart)
    spec.name = f"{quickstart.name}-chaos"
    del spec.tasks[:]
    for copy in range(COPIES):
        for task in quickstart.tasks:
            added = spec.tasks.add()
            added.CopyFrom(task)
            added.task_id = task.task_id if copy == 0 else f"{task.task_id}-{copy + 1}"
    score = spec.verifier.config.fields["score"].string_value
    spec.verifier.config.fields["score"].string_value = damped_score(score)
    return spec
