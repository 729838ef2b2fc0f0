#!/usr/bin/env bash
# slurm-env.sh - newer Slurm releases for the integration tests: a Debian chroot per suite, built
# once from Debian's own archive and cached, in which the project's dev cluster and tests run.
#
#   slurm-env.sh build SUITE          build (or check) the chroot of SUITE; prints its path
#   slurm-env.sh run SUITE -- CMD...  run CMD inside (as root, in the project mounted at /opt/p,
#                                     with a clean environment), mounting and unmounting around it
#   slurm-env.sh version SUITE        the Debian version of the Slurm inside
#   slurm-env.sh remove SUITE         unmount and delete the chroot
#   slurm-env.sh remove-mounts SUITE  unmount what a killed `run` left mounted in the chroot
#   slurm-env.sh suites               the suites this script knows, one per line: SUITE VERSION
#
# SUITE is a Debian suite:  trixie -> Slurm 24.11,  sid -> Slurm 26.05.  (Bookworm's Slurm 22.05
# is the host's own: `make deps` installs it, no chroot needed.)
#
# Needs root, debootstrap (installed from Debian when missing) and Debian's archive, the one apt
# already uses here; nothing else leaves the machine.  A build takes a minute or two (debootstrap
# of a minimal system plus Slurm, munge and the Python packages the tests import, all Debian's);
# the result is cached and reused until the package list below changes.  The project is bind-
# mounted at /opt/p while a command runs, never copied; a `.pth` file makes it importable by every
# Python inside, including processes that Slurm starts.
#
# Environment:
#   HADAR_SLURM_ENVS    where the chroots live (default /var/cache/hadar-slurm/envs).  Kept out
#                       of the checkout on purpose: a chroot binds the host's /dev while mounted,
#                       and `make clean` must never be able to reach it.
#   HADAR_SLURM_MIRROR  Debian archive URI (default: the first one in apt's sources here)
set -euo pipefail

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PROJECT=$(cd "$SRC/.." && pwd)
ENVS=${HADAR_SLURM_ENVS:-/var/cache/hadar-slurm/envs}
# What goes inside: Slurm and munge (the cluster), lua (the job_submit plugin; Debian's links
# liblua5.1, pulled in by slurmctld), procps (dev-cluster.sh), and the Python packages of the
# project and its tests, Debian's builds (CPU torch for the runtime tests).
PACKAGES=(slurmctld slurmd slurm-client munge procps ca-certificates
  python3 python3-numpy python3-scipy python3-jinja2 python3-prometheus-client python3-pytest
  python3-matplotlib python3-yaml python3-torch python3-sklearn)
STAMP_NAME=.hadar-slurm-env

log() { printf '[slurm-env %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

suite_version() {  # the Slurm release each suite ships (checked against `sinfo -V` after a build)
  case $1 in
    trixie) echo 24.11 ;;
    sid) echo 26.05 ;;
    *) return 1 ;;
  esac
}

check_suite() {
  suite_version "$1" >/dev/null \
    || die "unknown suite '$1': use one of: trixie (Slurm 24.11), sid (Slurm 26.05)"
}

need_root() { [ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot and mounts)"; }

mirror() {
  if [ -n "${HADAR_SLURM_MIRROR:-}" ]; then echo "$HADAR_SLURM_MIRROR"; return; fi
  local uri
  uri=$(grep -hsE '^(URIs:|deb )' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list \
    /etc/apt/sources.list.d/*.list 2>/dev/null | grep -v security \
    | sed -E 's/^URIs:[[:space:]]*//; s/^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?//' \
    | awk '{print $1; exit}')
  [ -n "$uri" ] || die "no Debian archive found in apt's sources: set HADAR_SLURM_MIRROR"
  echo "$uri"
}

stamp_text() { printf '%s\n' "${PACKAGES[@]}"; }

mounted_under() {  # mount points at or below $1, deepest first
  awk -v r="$1" '$2 == r || index($2, r "/") == 1 {print $2}' /proc/self/mounts | sort -r
}

umount_all() {
  local r=$1 m
  for m in $(mounted_under "$r"); do umount -l "$m" 2>/dev/null || true; done
}

build() {
  local suite=$1 r=$ENVS/$1
  need_root
  if [ -f "$r/$STAMP_NAME" ] && [ "$(cat "$r/$STAMP_NAME")" = "$(stamp_text)" ]; then
    echo "$r"; return
  fi
  command -v debootstrap >/dev/null || {
    log "installing debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap >&2 \
      || { DEBIAN_FRONTEND=noninteractive apt-get update -q >&2 \
        && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap >&2; }
  }
  [ -n "$(mounted_under "$r")" ] && umount_all "$r"
  [ -z "$(mounted_under "$r")" ] || die "$r is still mounted; not rebuilding over it"
  rm -rf "${r:?}"
  mkdir -p "$ENVS"
  local tmp=$r.building
  umount_all "$tmp"; rm -rf "${tmp:?}"
  log "debootstrap $suite into $tmp (from $(mirror))"
  debootstrap --variant=minbase "$suite" "$tmp" "$(mirror)" >"$ENVS/$suite.build.log" 2>&1 \
    || die "debootstrap $suite failed; see $ENVS/$suite.build.log"
  printf '#!/bin/sh\nexit 101\n' >"$tmp/usr/sbin/policy-rc.d"; chmod +x "$tmp/usr/sbin/policy-rc.d"
  cp /etc/resolv.conf "$tmp/etc/resolv.conf"
  log "installing Slurm and the Python packages into $suite"
  mount -t proc proc "$tmp/proc"
  local rc=0
  chroot "$tmp" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" \
    >>"$ENVS/$suite.build.log" 2>&1 || rc=$?
  umount "$tmp/proc"
  [ "$rc" = 0 ] || die "installing packages into $suite failed; see $ENVS/$suite.build.log"
  chroot "$tmp" apt-get clean
  # The project, importable by every Python inside (also by job processes Slurm starts, which get
  # a plain environment), and its command line.
  local site
  site=$(chroot "$tmp" /usr/bin/python3 -c 'import sysconfig; print(sysconfig.get_path("purelib", "posix_prefix").replace("/local", "").replace("site-packages", "dist-packages"))')
  mkdir -p "$tmp$site" "$tmp/opt/p"
  echo /opt/p >"$tmp$site/hadar-slurm-dev.pth"
  printf '#!/usr/bin/python3\nimport sys\nfrom hadar_slurm.cli.main import main\nsys.exit(main())\n' \
    >"$tmp/usr/local/bin/hadar-slurm"
  chmod +x "$tmp/usr/local/bin/hadar-slurm"
  local want got
  want=$(suite_version "$suite")
  got=$(chroot "$tmp" dpkg-query -W -f '${Version}' slurm-client)  # (sinfo -V wants a config)
  case $got in
    "$want".*) ;;
    *) die "$suite ships Slurm '$got', expected $want.x: update suite_version in $0" ;;
  esac
  stamp_text >"$tmp/$STAMP_NAME"
  mv "$tmp" "$r"
  log "$suite ready: Slurm $got in $r"
  echo "$r"
}

mount_env() {  # R: bind the root onto itself (unshare --propagation needs a mount point), then
  local r=$1   # proc, dev, sys and the project, in this order
  mountpoint -q "$r" || mount --bind "$r" "$r"
  mountpoint -q "$r/proc" || mount -t proc proc "$r/proc"
  mountpoint -q "$r/dev" || mount --rbind /dev "$r/dev"
  mountpoint -q "$r/sys" || mount --rbind /sys "$r/sys"
  mkdir -p "$r/opt/p"
  mountpoint -q "$r/opt/p" || mount --bind "$PROJECT" "$r/opt/p"
  # /opt/p must be this project, never another checkout's left behind: tests run there and
  # write their results there
  [ "$(stat -c %d:%i "$r/opt/p")" = "$(stat -c %d:%i "$PROJECT")" ] \
    || die "$r/opt/p is not $PROJECT (a stale mount?); run: $0 remove-mounts ${r##*/}"
}

run() {
  local suite=$1; shift
  [ "${1:-}" = -- ] && shift
  [ $# -gt 0 ] || die "run: no command given (slurm-env.sh run SUITE -- CMD...)"
  need_root
  local r
  r=$(build "$suite")
  exec 9>"$ENVS/$suite.lock"
  flock -w 600 9 || die "another command holds $suite for more than 10 minutes"
  # unmounted however the command ends (also on Ctrl-C or a kill of this script)
  trap 'umount_all "'"$r"'"' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  # Whatever is still mounted in the chroot now was left by a run that was killed (we hold its
  # lock): for instance its /opt/p, another checkout, where this run's tests would run instead
  umount_all "$r"
  mount_env "$r"
  local rc=0
  # A plain environment inside; the caller's SLURM_CONF etc. name host paths.
  chroot "$r" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/root LANG=C.UTF-8 \
    ${CI:+CI=$CI} ${HADAR_SLURM_SUMMARY:+HADAR_SLURM_SUMMARY=$HADAR_SLURM_SUMMARY} \
    /bin/sh -c 'cd /opt/p && exec "$@"' sh "$@" || rc=$?
  umount_all "$r"
  return "$rc"
}

cmd=${1:-}
case $cmd in
  build) check_suite "${2:-}"; build "$2" ;;
  run) check_suite "${2:-}"; s=$2; shift 2; run "$s" "$@" ;;
  version) check_suite "${2:-}"; need_root; chroot "$(build "$2")" dpkg-query -W -f '${Version}\n' slurm-client ;;
  remove)
    check_suite "${2:-}"; need_root
    umount_all "$ENVS/$2"; umount_all "$ENVS/$2.building"
    [ -z "$(mounted_under "$ENVS/$2")" ] || die "$ENVS/$2 is still mounted; not deleting it"
    rm -rf "${ENVS:?}/$2" "${ENVS:?}/$2.building"; log "removed $ENVS/$2" ;;
  remove-mounts) check_suite "${2:-}"; need_root; umount_all "$ENVS/$2" ;;
  suites) for s in trixie sid; do echo "$s $(suite_version $s)"; done ;;
  *) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; [ -z "$cmd" ] || exit 2 ;;
esac
