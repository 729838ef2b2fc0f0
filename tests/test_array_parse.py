"""Job arrays as Slurm 22.05, 24.11 and 26.05 list them (``squeue --json`` captured on the
dev cluster: a hadar array of tasks 0-3, then task 2 split off by an update of ``1_2``, then
task 3 started by an update of ``1_3``; tests/data/slurm/arrays/capture.sh), and the task
lists and commands the sidecar reads and writes for them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from hadar_slurm.slurm import commands
from hadar_slurm.slurm.api import CliApi, task_refs
from hadar_slurm.slurm.errors import SlurmParseError
from hadar_slurm.slurm.parse import expand_array_tasks, parse_squeue_json

DATA = Path(__file__).parent / "data" / "slurm" / "arrays"
VERSIONS = ("22.05", "24.11", "26.05")


def records(version: str, stage: str) -> list[tuple[int, int | None, int | None, str, str]]:
    jobs = parse_squeue_json((DATA / f"{version}-squeue-{stage}.json").read_text())
    return sorted((j.job_id, j.array_job_id, j.array_task_id, j.array_tasks, j.state)
                  for j in jobs)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_pending_array_is_one_record_of_its_tasks(version: str) -> None:
    assert records(version, "pending") == [(1, 1, None, "0-3", "PENDING")]


@pytest.mark.parametrize("version", VERSIONS)
def test_an_updated_task_gets_a_record_of_its_own(version: str) -> None:
    assert records(version, "split") == [(1, 1, None, "0-1,3", "PENDING"),
                                         (2, 1, 2, "", "PENDING")]
    assert records(version, "running") == [(1, 1, None, "0-1", "PENDING"),
                                           (2, 1, 2, "", "PENDING"),
                                           (3, 1, 3, "", "RUNNING")]


def test_a_job_that_is_no_array_has_no_array_fields() -> None:
    other = Path(__file__).parent / "data" / "slurm" / "squeue-24.11.json"
    for j in parse_squeue_json(other.read_text()):
        assert (j.array_job_id, j.array_task_id, j.array_tasks) == (None, None, "")


@pytest.mark.parametrize("text, tasks", [
    ("0-3", (0, 1, 2, 3)), ("0-1,3", (0, 1, 3)), ("5", (5,)), ("0-31:8", (0, 8, 16, 24)),
    ("0-3%2", (0, 1, 2, 3)), (" 7,9 ", (7, 9)), ("", ()),
])
def test_task_lists(text: str, tasks: tuple[int, ...]) -> None:
    assert expand_array_tasks(text) == tasks


def test_task_lists_are_bounded_and_checked() -> None:
    assert expand_array_tasks("0-999999999", limit=3) == (0, 1, 2)
    for bad in ("3-1", "a-b", "0-3:0", "1,,2", "0-1234567890"):
        with pytest.raises(SlurmParseError, match="array_task_string"):
            expand_array_tasks(bad)


def test_splitting_a_task_is_one_update_of_that_task() -> None:
    assert commands.scontrol_split_array_task(41, 3, "hadar: waits for the sidecar args=0:") == [
        "scontrol", "update", "JobId=41_3", "AdminComment=hadar: waits for the sidecar args=0:"]
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError, match="task id"):
            commands.scontrol_split_array_task(41, bad, "")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        commands.scontrol_split_array_task(41, 3, "two\nlines")


class Recorder:
    """A runner that answers ``squeue --json`` with ``jobs`` and records every other command."""

    def __init__(self, squeue: str) -> None:
        self.squeue = squeue
        self.argv: list[list[str]] = []

    def run(self, argv: list[str], **_kw: object) -> subprocess.CompletedProcess[str]:
        if argv[0] == "squeue":
            return subprocess.CompletedProcess(argv, 0, self.squeue, "")
        self.argv.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")


def test_the_last_task_of_an_array_is_named_array_underscore_task() -> None:
    # the array's record once every other task has a record of its own: task 3 keeps id 1;
    # "scontrol release 1" would release every task of the array, so it is named 1_3
    doc = json.loads((DATA / "22.05-squeue-running.json").read_text())
    last = next(j for j in doc["jobs"] if j["job_id"] == 1)
    last.update(array_task_id=3, array_task_string="")
    other = next(j for j in doc["jobs"] if j["job_id"] == 2)
    runner = Recorder(json.dumps(doc))
    api = CliApi(runner)  # type: ignore[arg-type]
    assert task_refs(parse_squeue_json(json.dumps(doc))) == {1: "1_3"}
    api.read_jobs()
    api.hold(1)
    api.release(1)
    api.update_job(1, {"NodeList": "node2", "StartTime": "now"})
    api.signal(1, "USR1")
    api.cancel(1)
    api.release(other["job_id"])
    assert runner.argv == [
        ["scontrol", "hold", "1_3"], ["scontrol", "release", "1_3"],
        ["scontrol", "update", "JobId=1_3", "NodeList=node2", "StartTime=now"],
        ["scancel", "--signal=USR1", "--full", "1_3"], ["scancel", "1_3"],
        ["scontrol", "release", "2"]]


@pytest.mark.parametrize("bad", ["1_", "_3", "0_1", "1_3 ", "1_3;rm", "a_b"])
def test_a_task_name_is_digits_underscore_digits(bad: str) -> None:
    with pytest.raises(ValueError, match="ARRAY_TASK"):
        commands.scontrol_hold(bad)


def test_a_record_of_one_pending_task_is_that_task() -> None:
    # 26.05 lists the last task left in the array's record by its task string alone
    doc = json.loads((DATA / "26.05-squeue-pending.json").read_text())
    doc["jobs"][0]["array_task_string"] = "2"
    (job,) = parse_squeue_json(json.dumps(doc))
    assert (job.array_job_id, job.array_task_id, job.array_tasks) == (1, 2, "")
    assert task_refs([job]) == {1: "1_2"}
