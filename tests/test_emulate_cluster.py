"""The emulated payload on the real dev cluster: hadar jobs whose payload is
``python -m hadar_slurm.runtime.emulate`` are placed by the sidecar, each finds the GPU type of
the node it was placed on from Slurm (the fake GPUs' GRES), advances at the table's rate for
that type (compressed), and completes once, its work done exactly."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.slurm_cluster import submit
from tests.test_sidecar_cluster import (
    NODE_TYPE,
    Workdir,
    assert_completed_once,
    last_place,
    wait_all,
    work,
)

pytest.importorskip("torch")

__all__ = ["work"]  # the fixture, imported for pytest

REPO = Path(__file__).resolve().parent.parent
TABLE = REPO / "slurm_conf" / "dev-throughputs.csv"
COMPRESSION = 40
STEPS = 400


def test_emulated_jobs_run_at_the_rate_of_the_type_they_were_placed_on(work: Workdir) -> None:
    script = work.path / "emulate.sh"
    script.write_text(
        "#!/bin/sh\n"
        f"export PYTHONPATH={REPO} OMP_NUM_THREADS=1\n"
        'log="$1/$SLURM_JOB_ID.log"\n'
        'echo "start $(hostname) ${SLURM_RESTART_COUNT:-0}" >> "$log"\n'
        f"{sys.executable} -m hadar_slurm.runtime.emulate --job-type A3C --steps {STEPS} "
        f'--compression {COMPRESSION} --table {TABLE} --round-seconds 2 > "$1/$SLURM_JOB_ID.out"'
        ' 2>&1 || exit $?\n'
        'echo "done $(hostname) ${SLURM_RESTART_COUNT:-0}" >> "$log"\n')
    script.chmod(0o755)
    (work.path / "out").mkdir(exist_ok=True)
    ids = [submit(work.cluster, script=str(script), job_name=f"emu{k}", gres="gpu:1",
                  comment=f"hadar: model=a3c steps={STEPS}", output="/dev/null",
                  chdir=str(work.path), script_args=[str(work.path / "out")])
           for k in range(3)]
    sidecar = work.start_sidecar()
    final = wait_all(work.cluster, ids, timeout=180, sidecars=[sidecar])
    assert sidecar.stop() == 0
    events = sidecar.events()
    for j in ids:
        assert_completed_once(work, j, final[j], events)
        out = (work.path / "out" / f"{j}.out").read_text()
        where = last_place(events, j)
        placed_type = NODE_TYPE[where["nodes"][0]]  # type: ignore[index]
        # the payload read its node's GPU type from Slurm: the type the policy chose
        m = re.search(r"emulate: A3C on 1 GPU\(s\) of (\S+): ([0-9.]+) steps/s \((\d+)x\)", out)
        assert m is not None, out
        assert m.group(1) == placed_type and m.group(3) == str(COMPRESSION), (out, where)
        assert f"done {STEPS}/{STEPS}" in out, out
