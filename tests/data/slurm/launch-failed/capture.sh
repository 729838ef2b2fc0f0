#!/bin/bash
# How the captures of this folder were made: one batch job (job 1, `launch`) whose launch fails
# on the dev cluster (its prolog's fault drill, slurm_conf/prolog.sh.in: fail-prolog.once), which
# slurmctld requeues held: reason JobHeldUser, description "launch failed requeued held".
#
#   bash tests/data/slurm/launch-failed/capture.sh 22.05                        # host Slurm
#   bash slurm_conf/slurm-env.sh run trixie -- bash /opt/p/tests/data/slurm/launch-failed/capture.sh 24.11
#
# Output: $OUTDIR/launch-failed-NAME/{squeue.json,scontrol.txt} (OUTDIR: ./out, or /opt/p/out in
# a chroot); copied here as NAME-squeue.json and NAME-scontrol-show-job.txt.
set -u
V=$1
PROJ=${PROJ:-$(cd "$(dirname "$0")/../../../.." && pwd)}
OUT=${OUTDIR:-$PROJ/out}/launch-failed-$V; mkdir -p "$OUT"
export HADAR_DEVCLUSTER_DIR=/tmp/hadar-lfcap HADAR_DEVCLUSTER_PORT=19850
eval "$(bash "$PROJ/slurm_conf/dev-cluster.sh" up 2>/dev/null | tail -1)"
touch "$HADAR_DEVCLUSTER_DIR/run/fail-prolog.once"
sbatch -J launch -w node1 --gres=gpu:1 -o /dev/null --wrap "sleep 1"
for _ in $(seq 1 30); do
  squeue -h -o %r | grep -q "launch failed" && break
  sleep 1
done
squeue --json > "$OUT/squeue.json"
scontrol show job 1 > "$OUT/scontrol.txt"
scancel 1
bash "$PROJ/slurm_conf/dev-cluster.sh" down >/dev/null 2>&1
rm -rf "$HADAR_DEVCLUSTER_DIR"
ls "$OUT"
