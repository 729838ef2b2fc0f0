#!/usr/bin/env bash
# entrypoint.sh - the containers of docker-compose.yml (README: "Try it with Docker").
#
#   entrypoint.sh slurmctld      munged + slurmctld
#   entrypoint.sh slurmd NODE    munged + slurmd for NODE, with NODE's fake GPUs (symlinks to
#                                /dev/null, as in the local dev cluster); the container's
#                                HADAR_GPU_TYPE and HADAR_GPUS must match slurm_conf/nodes.conf
#   entrypoint.sh sidecar        munged + `hadar-slurm run --config $HADAR_CONFIG`, once
#                                slurmctld answers
#   entrypoint.sh CMD...         anything else runs as it is (e.g. bash)
#
# Each role first renders slurm.conf, gres.conf, prolog.sh and job_submit.lua into $DIR/etc from
# the repository's slurm_conf/, mounted at $SRC (slurm_conf/render.py compose): the same templates
# and node list as the local cluster of slurm_conf/dev-cluster.sh, not a copy of them.
# The munge key is made once by slurmctld in the volume shared by all containers ($KEYDIR).
set -euo pipefail

SRC=${HADAR_SLURM_CONF_SRC:-/opt/hadar/slurm_conf}
DIR=${HADAR_CLUSTER_DIR:-/srv/hadar-cluster}
KEYDIR=${HADAR_MUNGE_KEY_DIR:-/etc/hadar-munge}
ROLE=${1:-bash}
export SLURM_CONF=$DIR/etc/slurm.conf

log() { printf '[%s %(%H:%M:%S)T] %s\n' "$ROLE" -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

render_config() {
  [ -r "$SRC/render.py" ] \
    || die "$SRC/render.py not found: mount the repository's slurm_conf/ there (docker-compose.yml does)"
  mkdir -p "$DIR"/{etc,run/munge,log,state/ctld,munge}
  chmod 755 "$DIR" "$DIR/run" "$DIR/run/munge"
  chmod 700 "$DIR/munge"
  python3 "$SRC/render.py" compose --dir "$DIR" --out "$DIR/etc"
}

start_munged() {
  if [ "$ROLE" = slurmctld ] && [ ! -s "$KEYDIR/munge.key" ]; then
    log "creating the cluster's munge key in $KEYDIR"
    mungekey -c -b 1024 -k "$KEYDIR/.munge.key.$$"
    mv "$KEYDIR/.munge.key.$$" "$KEYDIR/munge.key"   # atomic: the others never see half a key
  fi
  local i
  for ((i = 0; i < 120; i++)); do [ -s "$KEYDIR/munge.key" ] && break; sleep 1; done
  [ -s "$KEYDIR/munge.key" ] || die "no munge key in $KEYDIR after 120 s (slurmctld makes it)"
  install -m 600 "$KEYDIR/munge.key" "$DIR/munge/munge.key"
  rm -f "$DIR/run/munge/munge.socket"*
  munged --force --key-file="$DIR/munge/munge.key" --socket="$DIR/run/munge/munge.socket" \
    --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" \
    --seed-file="$DIR/munge/munged.seed" --num-threads=2
  for ((i = 0; i < 50; i++)); do
    if munge -n -S "$DIR/run/munge/munge.socket" | unmunge -S "$DIR/run/munge/munge.socket" \
        >/dev/null 2>&1; then
      return 0
    fi
    sleep 0.2
  done
  die "munged does not answer (log: $DIR/log/munged.log)"
}

case "$ROLE" in
  slurmctld)
    render_config
    start_munged
    exec slurmctld -D -i -f "$SLURM_CONF"
    ;;
  slurmd)
    node=${2:?usage: entrypoint.sh slurmd NODE}
    render_config
    python3 "$SRC/render.py" check-node "$node" "${HADAR_GPU_TYPE:-}" "${HADAR_GPUS:-}" \
      || die "this container (HADAR_GPU_TYPE=${HADAR_GPU_TYPE:-} HADAR_GPUS=${HADAR_GPUS:-}) is not node $node of nodes.conf"
    [ "$(cat /proc/sys/kernel/hostname)" = "$node" ] \
      || die "hostname is $(cat /proc/sys/kernel/hostname), not $node (set hostname: $node)"
    rm -rf "${DIR:?}/dev/$node"
    mkdir -p "$DIR/dev/$node" "$DIR/state/$node"
    for ((k = 0; k < HADAR_GPUS; k++)); do ln -s /dev/null "$DIR/dev/$node/nvidia$k"; done
    start_munged
    exec slurmd -D -N "$node" -f "$SLURM_CONF"
    ;;
  sidecar)
    : "${HADAR_CONFIG:?set HADAR_CONFIG to the config file of the sidecar}"
    render_config
    start_munged
    for ((i = 0; i < 120; i++)); do
      scontrol ping 2>/dev/null | grep -q 'is UP' && break
      sleep 1
    done
    exec hadar-slurm run --config "$HADAR_CONFIG"
    ;;
  *)
    [ $# -gt 0 ] || set -- bash
    exec "$@"
    ;;
esac
