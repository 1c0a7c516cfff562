"""The chaos run's task: the quickstart's, changed so that an hour of training keeps its reward signal
(bench/chaos.py, docs/chaos.md).

The quickstart's tiny model masters its task in about ten steps; from then on every group is eight answers at
reward 1.0, the trainer drops each as without signal and never steps again, and the faults that wait for a
trainer moment (a push, a checkpoint) never come. Two changes keep it stepping:

- **A capping coin:** the score step caps one reward in `CAPPED_ONE_IN` at `CAP` (bash's `$RANDOM`, drawn per
  scoring). A group of mastered answers still has a reward below the others with probability
  1 - (1 - 1/4)^8 = 90%, and below the cap nothing changes: the run learns exactly as the quickstart does until
  its answers score above 0.8. (A first version scaled one reward in four by 0.6 at every score; its noise
  drowned the small reward differences before the take-off: no rise in 20 steps.) A mastered run's mean reward
  is 0.95.
- **More tasks:** the quickstart's 480, `COPIES` times over under new ids, so that a run that steps all hour
  does not use them up.
"""

from __future__ import annotations

from lodestar.v1 import rollout_pb2

COPIES = 6
CAPPED_ONE_IN = 4
CAP = 0.8
QUICKSTART_AWK = ("awk -v h=", 'printf "%.6f\\n", h / d ')
"""Where the quickstart's score step (examples/quickstart/run.yaml) is given the coin: its awk call, its ratio."""


def capped_score(score: str) -> str:
    """The quickstart's score step with the capping coin (module docstring)."""
    call, ratio = QUICKSTART_AWK
    if score.count(call) != 1 or score.count(ratio) != 1:
        raise ValueError("the quickstart's score step changed: bench/chaos_task.py no longer knows where to cap it")
    coin = f"cap=$(( RANDOM % {CAPPED_ONE_IN} == 0 )); "
    capped = f'r = h / d; if (c && r > {CAP}) r = {CAP}; printf "%.6f\\n", r '
    return coin + score.replace(call, 'awk -v c="$cap" -v h=').replace(ratio, capped)


def chaos_spec(quickstart: rollout_pb2.RunSpec) -> rollout_pb2.RunSpec:
    """The quickstart's run spec with the capping coin and `COPIES` times its tasks."""
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
    spec.verifier.config.fields["score"].string_value = capped_score(score)
    return spec
