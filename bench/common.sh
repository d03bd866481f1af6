# Shared by the bench/*.sh scripts: build, start the local server, timing and table helpers.
# Sourced; expects REPO to be set.
# shellcheck shell=bash
cd "$REPO"
RUNS=${RUNS:-3}
"$REPO/scripts/setup" >/dev/null
"$REPO/scripts/cssp-server" start >/dev/null
set -a
# shellcheck disable=SC1091
. "${CSSP_SERVER_DIR:-$REPO/.work/server}/env"
set +a
TOOL="$REPO/.build/release/cssp-tool"
# BENCH_MOUNT=PATH measures another mount.cssp (an older build) in place of this one.
MOUNT=${BENCH_MOUNT:-$REPO/.build/release/mount.cssp}

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN {print b - a}'; }
header() { printf '%-58s %10s   %s\n' "workload (median of $RUNS)" "value" "runs"; }
row() { printf '%-58s %10.3f   %s\n' "$1" "$(printf '%s\n' "${@:2}" | median)" "${*:2}"; }

# bench_mountpoint CONTAINER: sets URL (the container, made if missing) and MNT (a new empty
# directory, unmounted and removed when the script exits).
bench_mountpoint() {
    URL=$("$REPO/scripts/cssp-server" create-container "$1")
    MNT=$(mktemp -d /tmp/cssp-bench-XXXX)
    trap 'fusermount3 -u "$MNT" 2>/dev/null || true; rmdir "$MNT"' EXIT
}
