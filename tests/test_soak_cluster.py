"""The quick soak (bench/soak.py --quick) on the real dev cluster: 40 jobs of two users, hostile
submissions among them, while the sidecar is killed, slurmctld is stopped and restarted and nodes
go down or drain.  Every job must complete exactly once or be refused at submit, none may be held
at the end, no user hold may be broken, and neither the sidecar's stderr nor its log may hold a
traceback.  Bounded: 90 s of faults, then at most 150 s for the jobs to end.

It uses the session's dev cluster (job_submit.lua loaded) and leaves it as it found it: nodes
resumed, slurmctld running, its jobs cancelled.
"""

from __future__ import annotations

from pathlib import Path

from bench.soak import SoakCluster, quick_options, run_soak, summary
from tests.slurm_cluster import DevCluster


def test_quick_soak_is_clean(dev_cluster: DevCluster, tmp_path: Path) -> None:
    cluster = SoakCluster(dev_cluster.dir, dev_cluster.env, dev_cluster.runner)
    result = run_soak(quick_options(seed=11, out=tmp_path / "soak.json"), cluster)
    f = result["figures"]
    assert f["accepted"] > 0 and f["completed_once"] > 0, summary(result)
    assert f["sidecar_kills"] >= 1 and f["ctld_restarts"] + f["ctld_stops"] >= 1, summary(result)
    assert result["clean"], summary(result)
