"""A hadar job array on the real dev cluster: the sidecar gives each pending task a record of
its own and places every task as a job of its own, where the policy chose, once each.

Before, the array's one record (``1_[0-3]``) looked like one job to the sidecar: placing it
released every task at once, wherever Slurm put them.
"""

from __future__ import annotations

import time

import pytest

from hadar_slurm.slurm import SlurmJob
from tests.slurm_cluster import jobs, submit
from tests.test_sidecar_cluster import (
    FINAL,
    NODE_TYPE,
    Workdir,
    assert_completed_once,
    check_alive,
    last_place,
)
from tests.test_sidecar_cluster import work as work  # (the fixture)

pytestmark = pytest.mark.slurm
TASKS = 5


def array_tasks(work: Workdir, array: int) -> dict[int, SlurmJob]:
    return {j: job for j, job in jobs(work.cluster).items() if job.array_job_id == array}


def test_each_task_of_a_hadar_array_is_placed_on_its_own(work: Workdir) -> None:
    array = submit(work.cluster, script=str(work.path / "payload.sh"), job_name="arr",
                   gres="gpu:1", comment="hadar: model=resnet50 bs=64 steps=40000",
                   output="/dev/null", chdir=str(work.path), extra=[f"--array=0-{TASKS - 1}"],
                   script_args=[str(work.path / "out"), "3"])
    work.submitted.append(array)
    before = array_tasks(work, array)
    assert [(j.array_tasks, j.state) for j in before.values()] == [
        (f"0-{TASKS - 1}", "PENDING")]
    sidecar = work.start_sidecar()
    end = time.monotonic() + 180
    while True:
        tasks = array_tasks(work, array)
        if len(tasks) == TASKS and all(t.state in FINAL for t in tasks.values()):
            break
        check_alive([sidecar])
        assert time.monotonic() < end, {j: (t.state, t.array_tasks) for j, t in tasks.items()}
        time.sleep(0.5)
    assert sidecar.stop() == 0
    events = sidecar.events()
    splits = [e for e in events if e.get("event") == "action" and e.get("action") == "split"]
    assert splits and splits[0]["array"] == array, events
    assert sum(int(str(e["tasks"])) for e in splits) == TASKS - 1  # the last is the record
    assert sorted(t.array_task_id for t in tasks.values()) == list(range(TASKS))  # type: ignore
    for j, task in tasks.items():
        place = last_place(events, j)  # (each task by the sidecar, as a job of its own)
        places = [e for e in events if e.get("event") == "action"
                  and e.get("action") == "place" and e.get("job") == j]
        assert len(places) == 1, places
        assert list(task.node_names) == place["nodes"], (task, place)
        assert {NODE_TYPE[n] for n in task.node_names} == {place["gpu_type"]}
        assert_completed_once(work, j, task, events)
