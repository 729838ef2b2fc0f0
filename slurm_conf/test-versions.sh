#!/usr/bin/env bash
# test-versions.sh [SUITE...] - the real-cluster tests (every test that uses the dev cluster:
# `pytest -m slurm`) on newer Slurm releases, each in its Debian chroot (slurm_conf/slurm-env.sh
# builds and caches them), then one table of every release's results, the host's included when
# `make test` ran them just before (out/slurm-tests/host.json).
#
#   SUITE   trixie (Slurm 24.11), sid (Slurm 26.05); default both
#
# A chroot that cannot be built counts as a failed release, never as a skip.  Exit status 0 only
# when every release ran its tests and none failed.  Without root it says so and skips (like the
# host's real-cluster tests), except on CI (CI set), where that is a failure.  Results: out/slurm-tests/*.json and
# out/slurm-tests/summary.txt.  Needs root (chroot, mounts), like the dev cluster itself.
set -uo pipefail

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PROJECT=$(cd "$SRC/.." && pwd)
OUT=$PROJECT/out/slurm-tests
suites=("$@")
[ ${#suites[@]} -gt 0 ] || suites=(trixie sid)
mkdir -p "$OUT"
failed=0
if [ "$(id -u)" != 0 ]; then  # as the host's real-cluster tests: skipped without root, not on CI
  if [ -n "${CI:-}" ]; then
    echo "test-versions: needs root (chroot, mounts); on CI it must run" >&2; exit 1
  fi
  echo "test-versions: SKIPPED, needs root (chroot, mounts): no tests on ${suites[*]}" >&2
  exit 0
fi

failed_row() {  # SUITE VERSION WHAT: a release that gave no pytest result, counted as failed
  printf '{"suite": "%s", "slurm": "%s (%s)", "ran": 0, "passed": 0, "failed": 1, "errors": 0, "skipped": 0, "seconds": 0}\n' \
    "$1" "$2" "$3" >"$OUT/$1.json"
  failed=1
}

for suite in "${suites[@]}"; do
  rm -f "$OUT/$suite.json"
  version=$(bash "$SRC/slurm-env.sh" suites | awk -v s="$suite" '$1 == s {print $2}')
  if [ -z "$version" ]; then
    echo "test-versions: unknown suite '$suite' (known: $(bash "$SRC/slurm-env.sh" suites | awk '{print $1}' | xargs))" >&2
    exit 2
  fi
  t0=$(date +%s)
  echo "== Slurm $version (Debian $suite): building or checking its chroot" >&2
  if ! bash "$SRC/slurm-env.sh" build "$suite" >/dev/null; then
    failed_row "$suite" "$version" "chroot build failed"
    continue
  fi
  t1=$(date +%s)
  echo "== Slurm $version (Debian $suite): chroot ready in $((t1 - t0)) s; pytest -m slurm" >&2
  HADAR_SLURM_SUMMARY=/opt/p/out/slurm-tests/$suite.json bash "$SRC/slurm-env.sh" run "$suite" -- \
    python3 -m pytest -q -p no:cacheprovider -m slurm tests || failed=1
  if [ ! -s "$OUT/$suite.json" ]; then  # pytest died before its summary
    failed_row "$suite" "$version" "no result"
  fi
done

python3 - "$OUT" <<'EOF' | tee "$OUT/summary.txt"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
rows = []
for name in ["host", "trixie", "sid"]:
    path = out / f"{name}.json"
    if path.exists():
        r = json.loads(path.read_text())
        rows.append((r["slurm"], "host" if name == "host" else f"chroot {name}", r))
print("real-cluster tests per Slurm release:")
print(f"  {'Slurm':<28} {'where':<14} {'ran':>5} {'passed':>7} {'failed':>7} {'errors':>7} "
      f"{'skipped':>8} {'time':>7}")
for slurm, where, r in rows:
    print(f"  {slurm:<28} {where:<14} {r['ran']:>5} {r['passed']:>7} {r['failed']:>7} "
          f"{r['errors']:>7} {r['skipped']:>8} {r['seconds']:>6.0f}s")
EOF
exit "$failed"
