"""The launcher of a study's trial (``hadar-slurm tune``'s array tasks):

    python3 -m hadar_slurm.studies.trial TRIALS.json -- COMMAND [ARG...]

It reads this task's index from ``SLURM_ARRAY_TASK_ID``, puts the trial's configuration in the
environment and replaces itself with the command (no shell):

* ``HADAR_TRIAL_INDEX``: the index;
* ``HADAR_TRIAL_CONFIG``: the configuration, a JSON object (``{"lr": 0.003, "width": 128}``);
* ``HADAR_STUDY``, ``HADAR_STUDY_METRIC``, ``HADAR_STUDY_MODE``: the study's name, the metric the
  trial reports and which way is better;
* ``HADAR_STUDY_STEPS``, ``HADAR_STUDY_RUNGS``, ``HADAR_STUDY_ETA``, ``HADAR_STUDY_RULE``: a
  trial's budget and the halving schedule, which the trial's
  :class:`~hadar_slurm.studies.reporter.StudyTrial` reports by.

Exit status 2, with one line naming what is wrong, when the index or the file is not usable.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence

PROG = "hadar_slurm.studies.trial"


def _fail(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


def trial_environment(trials_path: str, index_text: str | None,
                      env: dict[str, str]) -> dict[str, str] | str:
    """The command's environment, or the problem (a str)."""
    if index_text is None or not index_text.isdigit():
        return (f"SLURM_ARRAY_TASK_ID is {index_text!r}, not an array task's index (run it as "
                "a task of the study's job array)")
    try:
        with open(trials_path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as exc:
        return f"cannot read the trials file {trials_path!r}: {exc}"
    trials = doc.get("trials") if isinstance(doc, dict) else None
    if not isinstance(trials, list):
        return f"{trials_path!r} has no list 'trials' (write it with hadar-slurm tune)"
    index = int(index_text)
    if index >= len(trials):
        return (f"task {index} has no trial: {trials_path!r} holds {len(trials)} (array "
                f"0-{len(trials) - 1})")
    out = dict(env)
    out["HADAR_TRIAL_INDEX"] = str(index)
    out["HADAR_TRIAL_CONFIG"] = json.dumps(trials[index], sort_keys=True)
    for key, var in (("study", "HADAR_STUDY"), ("metric", "HADAR_STUDY_METRIC"),
                     ("mode", "HADAR_STUDY_MODE"), ("rule", "HADAR_STUDY_RULE")):
        if isinstance(doc.get(key), str):
            out[var] = doc[key]
    for key, var in (("steps", "HADAR_STUDY_STEPS"), ("rungs", "HADAR_STUDY_RUNGS"),
                     ("eta", "HADAR_STUDY_ETA")):
        value = doc.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            out[var] = str(value)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[1] != "--":
        return _fail("usage: python3 -m hadar_slurm.studies.trial TRIALS.json -- COMMAND "
                     "[ARG...]")
    env = trial_environment(args[0], os.environ.get("SLURM_ARRAY_TASK_ID"), dict(os.environ))
    if isinstance(env, str):
        return _fail(env)
    command = args[2:]
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        return _fail(f"cannot run {command[0]!r}: {exc.strerror}")
    return 0  # (not reached: execvpe replaced the process)


if __name__ == "__main__":
    sys.exit(main())
