"""HadarE's heterogeneous sbatch script on the real dev cluster (Slurm 22.05, job_submit.lua
loaded): a job forked into three copies on node1 (v100), node2 (p100) and node4 (a100) runs as
one heterogeneous job, each copy on its node with its own GPUs and its copy index; a one-copy
plan is a plain job; the script's exit status is the failed copy's.

What Slurm 22.05 shows for a heterogeneous job: ``sbatch --parsable`` prints the leader's id
``ID`` only; the components are jobs ``ID``, ``ID+1``, ... (``squeue`` lists them as ``ID+0``,
``ID+1`` with ``%A`` the component's own id; ``scontrol --oneliner show job ID`` prints one line
per component with ``HetJobId``/``HetJobOffset``); each component's node is put in the others'
``ExcNodeList``.  The components' ``hadar-copy-of=`` comment is not a ``hadar:`` comment, so
job_submit.lua leaves them alone (not held, no admin comment).
"""

from __future__ import annotations

from pathlib import Path

from hadar_slurm.slurm import commands, parse_sbatch_parsable, parse_scontrol_show
from hadar_slurm.slurm.hetjob import CopySpec, ForkPlan, render_hetjob
from tests.slurm_cluster import DevCluster, jobs, spelled, wait_job

FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
REPORT = 'echo "$HADAR_COPY_INDEX $(hostname) $HADAR_COPY_GPU_TYPE $CUDA_VISIBLE_DEVICES" >> "$1"'



def submit_plan(cluster: DevCluster, plan: ForkPlan, where: Path, ids: list[int]) -> int:
    script = where / "fork.sbatch"
    script.write_text(render_hetjob(plan), encoding="utf-8")
    script.chmod(0o755)
    out = cluster.runner.run(["sbatch", "--parsable", str(script)])
    assert out.stdout.strip().isdigit(), out.stdout  # just the leader's id, no "+0"
    job_id = parse_sbatch_parsable(out.stdout)
    ids.append(job_id)
    return job_id


def components(cluster: DevCluster, job_id: int) -> list[dict[str, str]]:
    """``scontrol --oneliner show job LEADER``: one record per component, by offset."""
    text = cluster.runner.run(commands.scontrol_show_job(job_id)).stdout
    records = [parse_scontrol_show(line) for line in text.splitlines() if line.strip()]
    return sorted(records, key=lambda r: int(r.get("HetJobOffset", "0")))


def a_plan(tmp_path: Path, command: tuple[str, ...], copies: tuple[CopySpec, ...]) -> ForkPlan:
    tmp_path.chmod(0o777)  # /tmp is shared with the nodes; the jobs write here
    return ForkPlan(
        original_job_id=4242, job_name="hadar-it-fork", command=command, copies=copies,
        workdir=str(tmp_path), tracker_dir=str(tmp_path / "tracker"), output="fork-%j.out")


def test_three_copies_run_as_one_hetjob(
    dev_cluster: DevCluster, submitted: list[int], tmp_path: Path,
) -> None:
    report = tmp_path / "copies.txt"
    copies = (CopySpec("node1", "v100", 2), CopySpec("node2", "p100", 1),
              CopySpec("node4", "a100", 3))
    plan = a_plan(tmp_path, ("bash", "-c", REPORT, "report", str(report)), copies)
    job_id = submit_plan(dev_cluster, plan, tmp_path, submitted)

    leader = wait_job(dev_cluster, job_id, FINAL, timeout=60)
    comps = components(dev_cluster, job_id)
    assert leader.state == "COMPLETED", (leader, comps)
    assert (tmp_path / "tracker").is_dir()

    lines = sorted(report.read_text().splitlines())
    assert [line.split()[:3] for line in lines] == [
        ["0", "node1", "v100"], ["1", "node2", "p100"], ["2", "node4", "a100"]]
    for line, copy in zip(lines, copies, strict=True):
        devices = line.split()[3].split(",")
        assert len(devices) == copy.gpus, line  # each copy sees its own component's GPUs

    # The components, as scontrol, squeue text and squeue --json show them.
    assert [c["HetJobOffset"] for c in comps] == ["0", "1", "2"]
    ids = [int(c["JobId"]) for c in comps]
    assert ids[0] == job_id and all(c["HetJobId"] == str(job_id) for c in comps)
    for comp, copy in zip(comps, copies, strict=True):
        assert comp["NodeList"] == copy.node and comp["Features"] == copy.gpu_type
        assert comp["TresPerNode"] == spelled(dev_cluster, f"gres:gpu:{copy.gpus}")
        assert comp["Comment"] == "hadar-copy-of=4242" and comp["JobState"] == "COMPLETED"
        assert "hadar" not in comp.get("AdminComment", "")  # job_submit.lua left it alone
    listed = dev_cluster.runner.run(
        ["squeue", "--noheader", "--states=all", "--format=%i %A %N", f"--jobs={job_id}"])
    assert sorted(listed.stdout.splitlines()) == [
        f"{job_id}+{k} {ids[k]} {copy.node}" for k, copy in enumerate(copies)]
    by_id = jobs(dev_cluster)
    for k, copy in enumerate(copies):
        job = by_id[ids[k]]
        assert job.comment == "hadar-copy-of=4242" and job.admin_comment == ""
        assert job.node_names == (copy.node,) and job.features == copy.gpu_type
        assert job.gres[0].type is None and job.gpus_per_node == copy.gpus  # untyped gres
        assert job.priority != 0  # not held for the sidecar


def test_one_copy_is_a_plain_job(
    dev_cluster: DevCluster, submitted: list[int], tmp_path: Path,
) -> None:
    report = tmp_path / "copies.txt"
    plan = a_plan(tmp_path, ("bash", "-c", REPORT, "report", str(report)),
                  (CopySpec("node3", "k80", 2),))
    job_id = submit_plan(dev_cluster, plan, tmp_path, submitted)
    job = wait_job(dev_cluster, job_id, FINAL, timeout=60)
    (comp,) = components(dev_cluster, job_id)
    assert job.state == "COMPLETED", (job, comp)
    assert "HetJobId" not in comp and comp["NodeList"] == "node3"
    assert report.read_text().split() == ["0", "node3", "k80", "0,1"]


def test_exit_status_of_a_failed_copy(
    dev_cluster: DevCluster, submitted: list[int], tmp_path: Path,
) -> None:
    plan = a_plan(tmp_path, ("bash", "-c", '[ "$HADAR_COPY_INDEX" != 1 ] || exit 7'),
                  (CopySpec("node2", "p100", 1), CopySpec("node4", "a100", 1)))
    job_id = submit_plan(dev_cluster, plan, tmp_path, submitted)
    job = wait_job(dev_cluster, job_id, FINAL, timeout=60)
    comps = components(dev_cluster, job_id)
    assert job.state == "FAILED", (job, comps)
    assert [c["ExitCode"] for c in comps] == ["7:0", "7:0"]
