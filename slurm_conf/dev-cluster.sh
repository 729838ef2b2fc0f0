#!/usr/bin/env bash
# dev-cluster.sh - the hadar-slurm dev cluster: a real multi-node Slurm (Debian's 22.05) on one
# host, loopback only, with fake GPUs of different types.  Needs root and util-linux `unshare`.
#
#   dev-cluster.sh up       install Slurm+munge if missing, configure, start, wait until every
#                           node is idle; prints `export SLURM_CONF=...` (idempotent)
#   dev-cluster.sh down     stop everything this script started (by PID), job processes too
#   dev-cluster.sh status   daemons and `sinfo`; exit status 0 when up, 1 otherwise
#   dev-cluster.sh env      print the `export SLURM_CONF=...` line for clients
#   dev-cluster.sh restart-ctld
#                           stop slurmctld (SIGTERM: it saves its state) and start it again with
#                           that state; jobs keep running (a fault drill for the sidecar)
#   dev-cluster.sh render   only write slurm.conf, gres.conf, prolog.sh (and job_submit.lua)
#                           into $DIR/etc/, as `up` does; starts nothing, needs no root
#
# Typical use:   eval "$(slurm_conf/dev-cluster.sh up)"; sinfo; ...; slurm_conf/dev-cluster.sh down
#
# The nodes are listed once, in slurm_conf/nodes.conf; slurm.conf and gres.conf are rendered from
# slurm_conf/slurm.conf.in and slurm_conf/gres.conf.in into $DIR/etc/ by slurm_conf/render.py
# (target "local"), which also renders the docker-compose cluster's (target "compose").  It needs
# python3 (>= 3.11, standard library only).
#
# How it works: one munged for slurmctld and the clients, and one `slurmd -D -N NODE` per node,
# each inside `unshare --mount --uts` with its own hostname, a private /etc/hosts (every node
# name -> 127.0.0.1), a private /etc/resolv.conf (nameserver 127.0.0.1, so that no lookup leaves
# loopback) and its own munged (its socket bind-mounted over the controller's in that namespace).
# All nodes share NodeAddr=127.0.0.1 and differ by Port=; CommunicationParameters=NoInAddrAny
# keeps every socket on 127.0.0.1.  Job processes live in their node's mount namespace, which is
# how `down` finds them.  Every Slurm client command needs SLURM_CONF: without it (and without
# /etc/slurm/slurm.conf) Slurm 22.05 tries a "configless" DNS lookup through the system resolver.
#
# Environment:
#   HADAR_DEVCLUSTER_DIR          state dir (default /tmp/hadar-devcluster): etc/ run/ log/ state/ dev/
#   HADAR_DEVCLUSTER_PORT         port base (default 17810): slurmctld PORT, slurmd default PORT+1,
#                                 node i (from 0) PORT+2+i
#   HADAR_DEVCLUSTER_UP_TIMEOUT   seconds to wait for the nodes to become idle (default 60)
#   HADAR_DEVCLUSTER_LUA=1        load slurm_conf/job_submit.lua (JobSubmitPlugins=lua); default off
#   HADAR_DEVCLUSTER_SHARDS=N     also configure each fake GPU as N gres/shard (GresTypes=gpu,shard;
#                                 docs/sharing.md); default 0: no shards
#   HADAR_DEVCLUSTER_KEEP_STATE=1 keep job/node state and logs from a previous run on `up`
set -euo pipefail

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DIR=${HADAR_DEVCLUSTER_DIR:-/tmp/hadar-devcluster}
PORT=${HADAR_DEVCLUSTER_PORT:-17810}
UP_TIMEOUT=${HADAR_DEVCLUSTER_UP_TIMEOUT:-60}
SHARDS=${HADAR_DEVCLUSTER_SHARDS:-0}
CONF=$DIR/etc/slurm.conf
PKGS=(munge slurmctld slurmd slurm-client)
PYTHON=${HADAR_DEVCLUSTER_PYTHON:-python3}
export SLURM_CONF=$CONF

log() { printf '[dev-cluster %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

case "$DIR" in
  /*) ;;
  *) die "HADAR_DEVCLUSTER_DIR must be an absolute path, got '$DIR'" ;;
esac
[[ "$PORT" =~ ^[0-9]+$ ]] && [ "$PORT" -ge 1024 ] && [ "$PORT" -le 65000 ] \
  || die "HADAR_DEVCLUSTER_PORT must be a number in 1024..65000, got '$PORT'"
[[ "$UP_TIMEOUT" =~ ^[0-9]+$ ]] || die "HADAR_DEVCLUSTER_UP_TIMEOUT must be whole seconds, got '$UP_TIMEOUT'"
[[ "$SHARDS" =~ ^[0-9]+$ ]] || die "HADAR_DEVCLUSTER_SHARDS must be a whole number (shards per GPU), got '$SHARDS'"

# ------------------------------------------------------------------ the node list (nodes.conf)
NODE_NAMES=() NODE_TYPES=() NODE_GPUS=() NODE_CPUS=() NODE_MEM=()
read_nodes() {  # render.py validates nodes.conf (its errors name the line and field)
  local out n t g c m
  command -v "$PYTHON" >/dev/null || die "'$PYTHON' not found: slurm_conf/render.py needs python3"
  out=$("$PYTHON" "$SRC/render.py" nodes) || die "cannot read the node list ($SRC/nodes.conf)"
  while read -r n t g c m; do
    NODE_NAMES+=("$n") NODE_TYPES+=("$t") NODE_GPUS+=("$g") NODE_CPUS+=("$c") NODE_MEM+=("$m")
  done <<<"$out"
}
read_nodes
NNODES=${#NODE_NAMES[@]}
CTLD_PORT=$PORT
node_port() { echo $((PORT + 2 + $1)); }

# ------------------------------------------------------------------ install
install_pkgs() {
  local missing=() p
  for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  command -v apt-get >/dev/null || die "Slurm packages missing (${missing[*]}) and no apt-get to install them"
  log "installing Debian packages: ${missing[*]}"
  local tmp_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then   # keep the postinst scripts from starting system daemons
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; tmp_policy=1
  fi
  local ok=1
  export DEBIAN_FRONTEND=noninteractive
  if ! timeout 600 apt-get install -y -q --no-install-recommends "${missing[@]}" >"$DIR/log/apt.log" 2>&1; then
    { timeout 300 apt-get update -q && timeout 600 apt-get install -y -q --no-install-recommends "${missing[@]}"; } \
      >>"$DIR/log/apt.log" 2>&1 || ok=0
  fi
  [ $tmp_policy = 1 ] && rm -f /usr/sbin/policy-rc.d
  [ $ok = 1 ] || die "apt-get install ${missing[*]} failed, see $DIR/log/apt.log"
}

check_tools() {
  local t
  for t in slurmctld slurmd munged mungekey munge unmunge unshare setsid sinfo scontrol flock timeout; do
    command -v "$t" >/dev/null || die "'$t' not found (Debian packages: ${PKGS[*]} util-linux)"
  done
}

# ------------------------------------------------------------------ config
render_config() {  # slurm.conf, gres.conf, prolog.sh (and job_submit.lua) -> $DIR/etc/
  local lua=()
  [ "${HADAR_DEVCLUSTER_LUA:-0}" = 1 ] && lua=(--lua)   # Slurm reads job_submit.lua beside slurm.conf
  "$PYTHON" "$SRC/render.py" local --dir "$DIR" --port "$PORT" "${lua[@]}" --shards "$SHARDS" \
    --out "$DIR/etc" \
    || die "rendering the configuration into $DIR/etc failed"
  [ -n "${lua[*]}" ] || rm -f "$DIR/etc/job_submit.lua"
}

write_config() {
  mkdir -p "$DIR"/{etc,run/munge,log,state/ctld,munge}
  chmod 755 "$DIR" "$DIR/run" "$DIR/run/munge"
  chmod 700 "$DIR/munge"
  [ -s "$DIR/munge/munge.key" ] || mungekey -c -b 1024 -k "$DIR/munge/munge.key" >/dev/null
  chmod 600 "$DIR/munge/munge.key"

  # Every node name resolves to 127.0.0.1: with NoInAddrAny each daemon binds to the address of
  # its (namespaced) hostname, and slurmstepd connects back to srun at 127.0.0.1.
  echo "127.0.0.1 localhost $(hostname) ${NODE_NAMES[*]}" >"$DIR/etc/hosts"
  printf 'nameserver 127.0.0.1\noptions timeout:1 attempts:1\n' >"$DIR/etc/resolv.conf"

  local i n g
  for ((i = 0; i < NNODES; i++)); do
    n=${NODE_NAMES[$i]} g=${NODE_GPUS[$i]}
    rm -rf "${DIR:?}/dev/$n"; mkdir -p "$DIR/dev/$n" "$DIR/state/$n" "$DIR/run/munge-$n"
    chmod 755 "$DIR/run/munge-$n"
    local k; for ((k = 0; k < g; k++)); do ln -s /dev/null "$DIR/dev/$n/nvidia$k"; done
  done
  render_config
}

# ------------------------------------------------------------------ processes
alive() { [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null; }

# A PID from one of our pid files counts only while its command line mentions $DIR/ (every
# process we start has the state dir in its arguments), so a recycled PID is left alone.
ours() { alive "$1" && tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -qF "$DIR/"; }
pids_of() {
  local f pid
  for f in "$@"; do
    [ -s "$f" ] || continue
    pid=$(<"$f")
    if ours "$pid"; then echo "$pid"
    elif alive "$pid"; then log "pid $pid from $f is now '$(cat "/proc/$pid/comm" 2>/dev/null)', not ours: leaving it alone"
    fi
  done
  return 0
}

start_bg() {  # NAME CMD...: run detached in its own session, PID in run/NAME.bgpid
  local name=$1; shift
  setsid "$@" >>"$DIR/log/$name.out" 2>&1 </dev/null 9>&- &   # 9>&-: the daemon must not hold our lock
  echo $! >"$DIR/run/$name.bgpid"
}

start_munged() {  # TAG SOCKET_DIR
  start_bg "munged-$1" munged -F --force --key-file="$DIR/munge/munge.key" \
    --socket="$2/munge.socket" --pid-file="$DIR/run/munged-$1.pid" \
    --log-file="$DIR/log/munged-$1.log" --seed-file="$DIR/munge/munged-$1.seed" \
    --origin=127.0.0.1 --num-threads=2
}

wait_for() {  # TIMEOUT_S DESCRIPTION CMD...: poll CMD; fail fast when a daemon we started died
  local t=$1 what=$2 f; shift 2
  local end=$((SECONDS + t))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -ge $end ] && die "timeout after ${t}s waiting for $what (logs: $DIR/log/)"
    for f in "$DIR"/run/*.bgpid; do
      [ -e "$f" ] || continue
      alive "$(<"$f")" || die "$(basename "$f" .bgpid) died while waiting for $what; see $DIR/log/$(basename "$f" .bgpid).out and .log"
    done
    sleep 0.2
  done
}

munge_ok() { timeout 5 munge -n -S "$1/munge.socket" | timeout 5 unmunge -S "$1/munge.socket"; }
ctld_up() { timeout 12 scontrol ping 2>/dev/null | grep -q 'is UP'; }
nodes_idle() {
  local out; out=$(timeout 12 sinfo -h -N -o '%N %t' 2>/dev/null) || return 1
  [ "$(awk '$2 == "idle"' <<<"$out" | wc -l)" -eq "$NNODES" ]
}

port_busy() {  # is a TCP port in LISTEN state (any address) on this host?
  local hex; hex=$(printf '%04X' "$1")
  awk -v p=":$hex" '$4 == "0A" && substr($2, length($2) - 4) == p { f = 1 } END { exit !f }' \
    /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

bgpid_files() { local f; for f in "$DIR"/run/*.bgpid; do [ -e "$f" ] && echo "$f"; done; return 0; }

is_up() {  # every daemon of ours alive (1 munged + slurmctld, 1 munged + 1 slurmd per node)
  local f n=0
  for f in $(bgpid_files); do
    [ -n "$(pids_of "$f")" ] || return 1
    n=$((n + 1))
  done
  [ $n -eq $((2 + 2 * NNODES)) ]
}

record_mntns() {  # remember each slurmd's mount namespace: job processes live in it
  local i n pid ns hostns; hostns=$(readlink /proc/self/ns/mnt)
  for ((i = 0; i < NNODES; i++)); do
    n=${NODE_NAMES[$i]}
    pid=$(pids_of "$DIR/run/slurmd-$n.bgpid")
    [ -n "$pid" ] || continue
    ns=$(readlink "/proc/$pid/ns/mnt" 2>/dev/null) || continue
    [ "$ns" != "$hostns" ] && echo "$ns" >"$DIR/run/slurmd-$n.mntns"
  done
  return 0
}

lock() {  # serialize up/down on one state dir
  mkdir -p "$DIR"
  exec 9>"$DIR/.lock"
  flock -w 120 9 || die "another dev-cluster.sh up/down on $DIR held the lock for 120 s"
}

# ------------------------------------------------------------------ commands
cmd_up() {
  lock
  mkdir -p "$DIR/log" "$DIR/run"
  if is_up && ctld_up; then
    log "already up ($DIR)"
    cmd_env
    return 0
  fi
  if [ -n "$(bgpid_files)" ]; then log "partial cluster found in $DIR: stopping it first"; do_down; fi
  local t0=$SECONDS
  trap 'log "up failed: stopping what was started"; do_down' EXIT
  if [ "${HADAR_DEVCLUSTER_KEEP_STATE:-0}" != 1 ]; then
    rm -rf "${DIR:?}/state" "$DIR"/log/*.log "$DIR"/log/*.out
  fi
  install_pkgs
  check_tools
  local p i
  for p in "$CTLD_PORT" $(for ((i = 0; i < NNODES; i++)); do node_port "$i"; done); do
    port_busy "$p" && die "TCP port $p is already in use; pick another base with HADAR_DEVCLUSTER_PORT (now $PORT)"
  done
  write_config
  rm -f "$DIR"/run/*.pid "$DIR"/run/*.mntns "$DIR"/run/munge*/munge.socket*

  local n
  start_munged ctl "$DIR/run/munge"
  for n in "${NODE_NAMES[@]}"; do start_munged "$n" "$DIR/run/munge-$n"; done
  wait_for 15 "munged (controller)" munge_ok "$DIR/run/munge"
  for n in "${NODE_NAMES[@]}"; do wait_for 15 "munged ($n)" munge_ok "$DIR/run/munge-$n"; done

  start_ctld -i   # -i: ignore state files from an earlier cluster

  # one slurmd per node, each in its own mount+UTS namespace with its own munged
  for n in "${NODE_NAMES[@]}"; do
    start_bg "slurmd-$n" unshare --mount --uts --propagation private -- /bin/sh -ec '
      hostname "$2"
      mount --bind "$1/etc/hosts" /etc/hosts
      mount --bind "$1/etc/resolv.conf" /etc/resolv.conf
      mount --bind "$1/run/munge-$2" "$1/run/munge"
      exec slurmd -D -N "$2" -f "$1/etc/slurm.conf"' sh "$DIR" "$n" "$CONF"
  done
  wait_for "$UP_TIMEOUT" "all $NNODES nodes to be idle" nodes_idle
  record_mntns
  timeout 12 sinfo -N -o '%N %t %G %f %c %m' >&2 || true
  trap - EXIT
  log "cluster up in $((SECONDS - t0))s ($DIR)"
  cmd_env
}

stop_pids() {  # SIGTERM the given PIDs, wait up to 15 s, then SIGKILL what is left
  local pids=() left=() p i
  for p in "$@"; do alive "$p" && pids+=("$p"); done
  [ ${#pids[@]} -eq 0 ] && return 0
  kill -TERM "${pids[@]}" 2>/dev/null || true
  for ((i = 0; i < 75; i++)); do
    left=()
    for p in "${pids[@]}"; do alive "$p" && left+=("$p"); done
    [ ${#left[@]} -eq 0 ] && return 0
    sleep 0.2
  done
  for p in "${left[@]}"; do
    log "pid $p ($(cat "/proc/$p/comm" 2>/dev/null)) ignored SIGTERM for 15 s: SIGKILL"
    kill -KILL "$p" 2>/dev/null || true
  done
  sleep 0.5
}

do_down() {
  local f ns p n=0 hostns
  [ -d "$DIR/run" ] || { log "nothing to stop in $DIR"; return 0; }
  record_mntns 2>/dev/null || true   # in case `up` died before it recorded them
  # 1. every slurmd (in parallel)
  # shellcheck disable=SC2046
  stop_pids $(pids_of "$DIR"/run/slurmd-*.bgpid)
  # 2. job processes (slurmstepd and tasks): whatever still lives in a node's mount namespace
  #    was started by one of our slurmd.  Their mounts go away with the last of them.
  hostns=$(readlink /proc/self/ns/mnt)
  for f in "$DIR"/run/slurmd-*.mntns; do
    [ -s "$f" ] || continue
    ns=$(<"$f")
    [ "$ns" = "$hostns" ] && continue
    for p in /proc/[0-9]*; do
      if [ "$(readlink "$p/ns/mnt" 2>/dev/null)" = "$ns" ]; then
        kill -KILL "${p#/proc/}" 2>/dev/null && n=$((n + 1))
      fi
    done
  done
  [ $n -gt 0 ] && log "killed $n leftover job processes"
  # 3. slurmctld (saves its state on SIGTERM, needs no munge for that) and the munged
  #    instances, in parallel: each takes about 2 s to exit
  # shellcheck disable=SC2046
  stop_pids $(pids_of "$DIR"/run/slurmctld.bgpid "$DIR"/run/munged-*.bgpid)
  rm -f "$DIR"/run/*.bgpid "$DIR"/run/*.mntns "$DIR"/run/*.pid
  log "down ($DIR)"
}

cmd_down() { lock; do_down; }

start_ctld() {
  # slurmctld: own mount namespace with the private hosts/resolv.conf.  (The unused last
  # argument, $CONF, puts "$DIR/" in the command line before the exec, for ours().)
  start_bg slurmctld unshare --mount --propagation private -- /bin/sh -ec '
    mount --bind "$1/etc/hosts" /etc/hosts
    mount --bind "$1/etc/resolv.conf" /etc/resolv.conf
    exec slurmctld -D "$2" -f "$1/etc/slurm.conf"' sh "$DIR" "$1" "$CONF"
  wait_for 30 "slurmctld to answer 'scontrol ping'" ctld_up
}

cmd_restart_ctld() {
  lock
  is_up || die "the cluster in $DIR is not (fully) up"
  local t0=$SECONDS
  # shellcheck disable=SC2046
  stop_pids $(pids_of "$DIR/run/slurmctld.bgpid")
  rm -f "$DIR/run/slurmctld.bgpid" "$DIR/run/slurmctld.pid"
  start_ctld -R   # -R: recover the saved job and node state
  log "slurmctld restarted in $((SECONDS - t0))s"
}

cmd_status() {
  local f pid any=0
  for f in $(bgpid_files); do
    any=1
    pid=$(<"$f")
    printf '%-16s pid %-8s %s\n' "$(basename "$f" .bgpid)" "$pid" "$(ours "$pid" && echo alive || echo DEAD)"
  done
  if [ $any = 0 ]; then echo "not running ($DIR)"; return 1; fi
  timeout 12 sinfo -N -o '%N %t %G %f %c %m' || true
  is_up && ctld_up
}

cmd_env() { echo "export SLURM_CONF=$CONF"; }

cmd_render() { mkdir -p "$DIR/etc"; render_config; log "rendered $DIR/etc/"; }

case "${1:-}" in
  render|env) ;;
  *) [ "$(id -u)" = 0 ] || die "must run as root (it starts slurmd in private mount/UTS namespaces)" ;;
esac
case "${1:-}" in
  render) cmd_render ;;
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  env) cmd_env ;;
  restart-ctld) cmd_restart_ctld ;;
  *) echo "usage: $0 up|down|status|env|restart-ctld|render" >&2; exit 2 ;;
esac
