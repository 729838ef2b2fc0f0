#!/bin/bash
# How the squeue captures of this folder were made: a hadar job array of 4 tasks on the dev
# cluster (job_submit.lua loaded), then task 2 given a record of its own (an update of 1_2, as
# the sidecar splits arrays), then task 3 started (StartTime=now on 1_3).
#
#   bash tests/data/slurm/arrays/capture.sh NAME                        # host Slurm (22.05)
#   bash slurm_conf/slurm-env.sh run trixie -- bash /opt/p/tests/data/slurm/arrays/capture.sh 24.11
#
# Output: $OUTDIR/arrays-NAME/squeue-array-{pending,split,running}.json (OUTDIR: ./out, or
# /opt/p/out in a chroot); copied here as NAME-squeue-{pending,split,running}.json.
set -u
V=$1
PROJ=${PROJ:-$(cd "$(dirname "$0")/../../../.." && pwd)}
OUT=${OUTDIR:-$PROJ/out}/arrays-$V; mkdir -p "$OUT"
export HADAR_DEVCLUSTER_DIR=/tmp/hadar-arrcap HADAR_DEVCLUSTER_PORT=19810 HADAR_DEVCLUSTER_LUA=1
eval "$(bash "$PROJ/slurm_conf/dev-cluster.sh" up 2>/dev/null | tail -1)"
printf '#!/bin/bash\nsleep 20\n' > /tmp/hadar-arrcap-task.sh
sbatch --array=0-3 --gres=gpu:1 --comment="hadar: model=resnet18 bs=64 steps=4000" \
    -o /dev/null /tmp/hadar-arrcap-task.sh
sleep 1
squeue --json > "$OUT/squeue-array-pending.json"
scontrol update JobId=1_2 AdminComment=
sleep 1
squeue --json > "$OUT/squeue-array-split.json"
scontrol update JobId=1_3 StartTime=now
sleep 3
squeue --json > "$OUT/squeue-array-running.json"
scancel 1
bash "$PROJ/slurm_conf/dev-cluster.sh" down >/dev/null 2>&1
ls "$OUT"
