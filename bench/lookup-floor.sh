#!/usr/bin/env bash
# What one FUSE lookup costs, one after another (issue 21: rsync -a's re-run stats 100 000 names,
# each a lookup the kernel asks of the daemon, and waits for each answer before the next):
#   floor    a libfuse daemon that answers every lookup at once and does nothing else
#            (bench/lookup-floor.c, libfuse's multi-threaded loop as mount.cssp runs it): the
#            same stats as below, of names it has not seen
#   csspfs   mount.cssp (release build) on the compare server's seed/huge-tree/ (100 000
#            objects in 1 000 directories, bench/seed-huge.sh), fresh mount: every directory is
#            stat-ed (untimed: the mount lists the tree as rsync's first pass makes it), then
#            every file, in rsync's order; each is a lookup answered from the listing in memory
#            (dir_timeout=60, so that no listing expires during the measurement)
# Prints microseconds a lookup for each. Runs on the compare server (.work/compare-server, port
# 8470, container "compare"; not at the same time as compare.sh or memory.sh).
#
#   bench/lookup-floor.sh
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export CSSP_SERVER_DIR=${COMPARE_SERVER_DIR:-$REPO/.work/compare-server}
export CSSP_SERVER_PORT=${COMPARE_SERVER_PORT:-8470}

die() {
    echo "lookup-floor: $*" >&2
    exit 1
}
[[ $(id -u) == 0 ]] || die "run as root (FUSE mounts)"

"$REPO/scripts/setup" >/dev/null
command -v gcc >/dev/null && pkg-config --exists fuse3 || die "needs gcc and libfuse3-dev (scripts/setup installs them)"
WORK=$(mktemp -d /tmp/cssp-lookup-floor-XXXX)
MNT=$WORK/mnt
mkdir -p "$MNT"
cleanup() {
    mountpoint -q "$MNT" && fusermount3 -u "$MNT"
    rm -rf "$WORK"
}
trap cleanup EXIT

# lstat of names one after another, from one thread, each relative to its directory's descriptor
# (as rsync's generator does): prints microseconds a call.
timed_lstat() {
    /usr/bin/python3 - "$@" <<'PY'
import os, sys, time
root = sys.argv[1]
groups = [(os.path.join(root, "d%03d" % d), ["f%08d" % f for f in range(100)]) for d in range(1000)]
count = 0
start = time.perf_counter()
for directory, names in groups:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    for name in names:
        os.lstat(name, dir_fd=fd)
    os.close(fd)
    count += len(names)
took = time.perf_counter() - start
print("%.1f" % (took / count * 1e6))
PY
}

gcc -O2 -Wall -o "$WORK/lookup-floor" "$REPO/bench/lookup-floor.c" $(pkg-config --cflags --libs fuse3)
"$WORK/lookup-floor" "$MNT"
/usr/bin/python3 -c 'import os, sys
for d in range(1000): os.lstat(os.path.join(sys.argv[1], "d%03d" % d))' "$MNT"
floor=$(timed_lstat "$MNT")
fusermount3 -u "$MNT"
echo "floor   (a daemon that does nothing): $floor us a lookup (100000 lookups, 1000 directories)"

"$REPO/scripts/cssp-server" start >/dev/null
set -a
# shellcheck disable=SC1091
. "$CSSP_SERVER_DIR/env"
set +a
URL=$("$REPO/scripts/cssp-server" create-container compare)
"$REPO/bench/seed-huge.sh" "$URL" tree
"$REPO/.build/release/mount.cssp" "$URL" "$MNT" \
    -o passwd_file="$CSSP_PASSWD_FILE",cache_dir="$WORK/cache",dir_timeout=60
/usr/bin/python3 -c 'import os, sys
for d in range(1000): os.lstat(os.path.join(sys.argv[1], "d%03d" % d))' "$MNT/seed/huge-tree"
csspfs=$(timed_lstat "$MNT/seed/huge-tree")
echo "csspfs  (a listed name):            $csspfs us a lookup (100000 lookups, 1000 directories)"
