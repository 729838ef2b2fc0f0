#!/usr/bin/env bash
# cluster-demo.sh - hadar-slurm end to end on the real dev cluster, in about a minute (`make
# cluster-demo`).  Needs root (the dev cluster starts slurmd in private namespaces) and the
# project's virtual environment (`make venv`).
#
#   1. starts the dev cluster (slurm_conf/dev-cluster.sh) with job_submit.lua, in its own state
#      dir and ports (/tmp/hadar-cluster-demo, port base 17900) unless HADAR_DEVCLUSTER_DIR /
#      HADAR_DEVCLUSTER_PORT say otherwise; a cluster already up there is used and left up;
#   2. submits a small mixed workload: 8 hinted jobs (`--comment="hadar: model=... steps=..."`)
#      of different models and GPU counts, and 2 plain jobs; job_submit.lua holds the hinted
#      ones for the sidecar (`squeue` shows them held);
#   3. runs the sidecar (`hadar-slurm run`, 3-second epochs, state and JSON log in a temp dir),
#      shows `hadar-slurm status` after its first epochs and `hadar-slurm explain` for a job
#      that waits;
#   4. waits until every job has finished (at most 180 s), shows `hadar-slurm status --all` and
#      a summary of the sidecar's decisions from its log (placements per GPU type, preemptions
#      and moves), stops the sidecar;
#   5. always (trap EXIT, also on error or Ctrl-C): stops the sidecar, and stops the cluster if
#      this script started it (else cancels the demo's jobs that are left).
#
# Every job's payload is a sleep of 5-15 s that, like a real training job, traps the sidecar's
# checkpoint signal (USR1) instead of dying of it.  The temp dir is removed on success (kept with
# HADAR_DEMO_KEEP=1) and kept, and named, on failure.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEV="$REPO/slurm_conf/dev-cluster.sh"
HS="$REPO/.venv/bin/hadar-slurm"
PY="$REPO/.venv/bin/python"
export HADAR_DEVCLUSTER_DIR=${HADAR_DEVCLUSTER_DIR:-/tmp/hadar-cluster-demo}
export HADAR_DEVCLUSTER_PORT=${HADAR_DEVCLUSTER_PORT:-17900}
export HADAR_DEVCLUSTER_LUA=1
WAIT_S=180
FINAL_RE='^(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|PREEMPTED|BOOT_FAIL|DEADLINE)'

say() { printf '\n== %s\n' "$*"; }
log() { printf '[cluster-demo %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root: the dev cluster runs slurmd in private mount/UTS namespaces (try: sudo make cluster-demo)"
[ -x "$HS" ] && [ -x "$PY" ] || die "no $HS: create the virtual environment first (make venv)"

WORK=$(mktemp -d /tmp/hadar-cluster-demo-run.XXXXXX)
chmod 755 "$WORK"
STARTED=0
SIDECAR_PID=""
IDS=()
OK=0

stop_sidecar() {
  [ -n "$SIDECAR_PID" ] || return 0
  if kill -0 "$SIDECAR_PID" 2>/dev/null; then
    kill -TERM "$SIDECAR_PID" 2>/dev/null || true
    local i
    for ((i = 0; i < 150; i++)); do kill -0 "$SIDECAR_PID" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$SIDECAR_PID" 2>/dev/null; then
      log "the sidecar ignored SIGTERM for 30 s: SIGKILL"
      kill -KILL "$SIDECAR_PID" 2>/dev/null || true
    fi
  fi
  wait "$SIDECAR_PID" 2>/dev/null || true
  SIDECAR_PID=""
}

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  trap '' INT TERM   # a second Ctrl-C must not cut the cleanup short and leave daemons behind
  stop_sidecar
  if [ "$STARTED" = 1 ]; then
    say "stopping the dev cluster"
    bash "$DEV" down || rc=1
  elif [ ${#IDS[@]} -gt 0 ] && [ -n "${SLURM_CONF:-}" ]; then
    scancel "${IDS[@]}" 2>/dev/null || true   # a cluster we did not start stays up
  fi
  if [ "$OK" = 1 ] && [ "$rc" = 0 ] && [ "${HADAR_DEMO_KEEP:-0}" != 1 ]; then
    rm -rf "$WORK"
  elif [ "$OK" = 1 ] && [ "$rc" = 0 ]; then
    log "the sidecar's config, log and state are in $WORK (HADAR_DEMO_KEEP=1)"
  elif [ -e "$WORK/sidecar.toml" ]; then
    log "failed (exit $rc); the sidecar's config, log and state are kept in $WORK"
  else
    rm -rf "$WORK"   # failed before the sidecar: nothing worth keeping
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ------------------------------------------------------------------ 1. the cluster
say "dev cluster in $HADAR_DEVCLUSTER_DIR (port base $HADAR_DEVCLUSTER_PORT, job_submit.lua on)"
if bash "$DEV" status >/dev/null 2>&1; then
  log "a dev cluster is already up there: using it (it stays up afterwards)"
  eval "$(bash "$DEV" env)"
  config=$(scontrol show config 2>/dev/null) || die "the cluster in $HADAR_DEVCLUSTER_DIR does not answer"
  grep -q '^JobSubmitPlugins *= *lua' <<<"$config" \
    || die "the cluster in $HADAR_DEVCLUSTER_DIR runs without job_submit.lua; stop it or pick another HADAR_DEVCLUSTER_DIR"
else
  STARTED=1   # set before `up`: a half-started cluster is stopped too
  eval "$(bash "$DEV" up)"
fi
[ -n "${SLURM_CONF:-}" ] || die "dev-cluster.sh did not give SLURM_CONF"
export SLURM_CONF
[ "$STARTED" = 1 ] || sinfo -N -o '%N %t %G %f'

# ------------------------------------------------------------------ 2. the workload
# The payload: sleeps SECS seconds in 1-second steps; the checkpoint signal is logged, not fatal.
cat >"$WORK/payload.sh" <<'EOF'
#!/bin/sh
trap 'echo "checkpoint signal on $(hostname)"' USR1
end=$(( $(date +%s) + $1 ))
while [ "$(date +%s)" -lt "$end" ]; do sleep 1 & wait $!; done
echo "done on $(hostname)"
EOF
chmod 755 "$WORK/payload.sh"

# name | hints | GPUs | seconds
WORKLOAD=(
  "rn50-1|model=resnet50 bs=64 steps=40000 preempt=checkpoint|1|8"
  "rn50-4|model=resnet50 bs=128 steps=80000 preempt=checkpoint|4|12"
  "tf-2|model=transformer bs=128 steps=25000 preempt=checkpoint|2|10"
  "lm-4|model=lm bs=80 steps=100000 weight=2 preempt=checkpoint|4|15"
  "rec-1|model=recommendation bs=512 steps=9000 preempt=checkpoint|1|6"
  "a3c-1|model=a3c steps=12000 preempt=checkpoint|1|5"
  "gan-1|model=cyclegan steps=3000 preempt=checkpoint|1|7"
  "rn18-8|model=resnet18 bs=256 steps=60000 preempt=checkpoint|8|9"
)
submit() {  # NAME SECS SBATCH-OPTIONS...: prints the job id
  local name=$1 secs=$2; shift 2
  sbatch --parsable --job-name="demo-$name" --output=/dev/null "$@" "$WORK/payload.sh" "$secs"
}
say "submitting ${#WORKLOAD[@]} hinted jobs and 2 plain ones"
HINTED=()
for w in "${WORKLOAD[@]}"; do
  IFS='|' read -r name hints gpus secs <<<"$w"
  id=$(submit "$name" "$secs" --gres="gpu:$gpus" --comment="hadar: $hints")
  IDS+=("$id") HINTED+=("$id")
  printf '  %-4s %-10s %d GPU(s) %2d s  hadar: %s\n' "$id" "$name" "$gpus" "$secs" "$hints"
done
id=$(submit plain-k80 6 --gres=gpu:k80:1); IDS+=("$id")
printf '  %-4s %-10s %s\n' "$id" plain-k80 "1 k80 GPU, no hints: Slurm schedules it"
id=$(submit plain-a100 8 --gres=gpu:2 --constraint=a100); IDS+=("$id")
printf '  %-4s %-10s %s\n' "$id" plain-a100 "2 GPUs with --constraint=a100, no hints: Slurm schedules it"
JOBLIST=$(IFS=,; echo "${IDS[*]}")
sleep 1
say "squeue: job_submit.lua holds the hinted jobs for the sidecar"
squeue -j "$JOBLIST" -o '%.6i %.11j %.8T %.14r %.14b %.10f %N'

# ------------------------------------------------------------------ 3. the sidecar
cat >"$WORK/sidecar.toml" <<EOF
# slurm_conf/dev-sidecar.toml with the state and the log in this demo's temp dir
# (slurm.conf comes from \$SLURM_CONF; --epoch-seconds 3 is given on the command line)
[scheduler]
policy = "hadar"
epoch_seconds = 5
preempt_grace_s = 2
throughputs = ["$REPO/slurm_conf/dev-throughputs.csv"]

[sidecar]
state_dir = "$WORK/state"
log_format = "json"
log_file = "$WORK/sidecar.log"
EOF
say "hadar-slurm run --config $WORK/sidecar.toml --epoch-seconds 3"
"$HS" run --config "$WORK/sidecar.toml" --epoch-seconds 3 >"$WORK/sidecar.out" 2>&1 &
SIDECAR_PID=$!

epochs() { local n; n=$(grep -c '"event": "epoch"' "$WORK/sidecar.log" 2>/dev/null) || true; echo "${n:-0}"; }
end=$((SECONDS + 60))
until [ "$(epochs)" -ge 2 ]; do
  kill -0 "$SIDECAR_PID" 2>/dev/null || { cat "$WORK/sidecar.out" >&2; die "the sidecar exited"; }
  [ $SECONDS -lt $end ] || die "no 2 epochs of the sidecar after 60 s (log: $WORK/sidecar.log)"
  sleep 0.3
done
say "hadar-slurm status (after $(epochs) epochs)"
"$HS" status --config "$WORK/sidecar.toml"

# a hinted job the last epoch left waiting (else the first hinted job)
WAITING=$("$PY" - "$WORK/state/state.json" "${HINTED[@]}" <<'EOF'
import json, sys
jobs = json.load(open(sys.argv[1])).get("jobs", {})
ids = sys.argv[2:]
waiting = [j for j in ids if j in jobs and jobs[j]["reason"] != "PLACED" and not jobs[j]["running"]]
print((waiting or ids)[0])
EOF
)
say "hadar-slurm explain $WAITING"
"$HS" explain "$WAITING" --config "$WORK/sidecar.toml"

# ------------------------------------------------------------------ 4. until all finished
say "waiting for all ${#IDS[@]} jobs to finish (at most ${WAIT_S} s)"
end=$((SECONDS + WAIT_S))
t0=$SECONDS
left="?"
while :; do
  if states=$(squeue -h -t all -j "$JOBLIST" -o '%T'); then
    left=$(grep -cvE "$FINAL_RE" <<<"$states" || true)
    [ "$left" -eq 0 ] && break
  fi
  kill -0 "$SIDECAR_PID" 2>/dev/null || { cat "$WORK/sidecar.out" >&2; die "the sidecar exited"; }
  if [ $SECONDS -ge $end ]; then
    squeue -t all -j "$JOBLIST" -o '%.6i %.11j %.9T %.14r %N %k' >&2 || true
    die "$left job(s) not finished after ${WAIT_S} s"
  fi
  sleep 2
done
log "all jobs finished after $((SECONDS - t0)) s"
say "hadar-slurm status --all"
"$HS" status --config "$WORK/sidecar.toml" --all
stop_sidecar

say "what the sidecar decided (from its JSON log)"
"$PY" - "$WORK/sidecar.log" "$JOBLIST" <<'EOF'
import collections, json, subprocess, sys
events = []
for line in open(sys.argv[1]):
    try:
        events.append(json.loads(line))
    except ValueError:
        pass
epochs = [e for e in events if e.get("event") == "epoch"]
acts = [e for e in events if e.get("event") == "action"]
kinds = collections.Counter(e["action"] for e in acts)
places = [e for e in acts if e["action"] == "place"]
per_type = collections.Counter(str(e.get("gpu_type")) for e in places)
gpus_per_type = collections.Counter()
for e in places:
    gpus_per_type[str(e.get("gpu_type"))] += int(e.get("gpus", 0))
moved = {e["job"] for e in acts if e["action"] in ("signal", "requeue")}
signaled = {e["epoch"] for e in acts if e["action"] == "signal"}
took = sorted(e["read_s"] + e["decide_s"] + e["apply_s"] for e in epochs
              if e["epoch"] not in signaled) or [float("nan")]
print(f"epochs: {len(epochs)}; Slurm commands per epoch "
      f"{min(e['slurm_commands'] for e in epochs)}..{max(e['slurm_commands'] for e in epochs)}; "
      f"epoch time median {took[len(took) // 2]:.3f} s, longest {took[-1]:.3f} s (the "
      f"{len(signaled)} epoch(s) that preempted also waited the grace period)")
print(f"jobs placed: {len({e['job'] for e in places})}  placements: {len(places)}")
print("placements per GPU type: " + ", ".join(
    f"{t} {n} ({gpus_per_type[t]} GPUs)" for t, n in sorted(per_type.items())))
skipped = sum(1 for e in events if e.get("event") == "preempt_skipped")
print(f"preemptions/moves: {kinds.get('signal', 0)} checkpoint signal(s) to {len(moved)} "
      f"job(s), {kinds.get('requeue', 0)} requeue(s), {skipped} job(s) finished during the "
      f"grace period; holds: "
      f"{kinds.get('hold', 0)}; unsteered: {kinds.get('unsteer', 0)}; failed actions: "
      f"{sum(1 for e in events if e.get('event') == 'action_failed')}")
print("actions: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))
last = {}
for e in places:
    last[e["job"]] = e
out = subprocess.run(["squeue", "-h", "-t", "all", "-j", sys.argv[2], "-o", "%i|%j|%T|%N"],
                     capture_output=True, text=True, check=True).stdout
print(f"\n{'job':7s} {'name':16s} {'final state':12s} {'ran on':8s} sidecar placed it on")
for line in sorted(out.splitlines(), key=lambda s: int(s.split("|")[0])):
    jid, name, state, nodes = line.split("|")
    p = last.get(int(jid))
    where = f"{','.join(p['nodes'])} ({p['gpu_type']}, {p['gpus']} GPUs)" if p else "- (not a hadar job)"
    print(f"{jid:7s} {name:16s} {state:12s} {nodes:8s} {where}")
EOF
states=$(squeue -h -t all -j "$JOBLIST" -o '%T')
bad=$(grep -cv '^COMPLETED' <<<"$states" || true)
[ "$bad" -eq 0 ] || die "$bad job(s) did not complete"
OK=1
say "demo done"
