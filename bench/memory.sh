#!/usr/bin/env bash
# Issue 10, item 7 numbers (a benchmark, not a test): the mount daemon's peak RSS (VmHWM) and the
# time of
#   cat64   64 parallel `cat` of 64 objects of 64 MiB (4 GiB), fresh mount, page cache dropped
#   ls      `ls -l` of one directory of MANY objects (default 200 000), fresh mount
# with default options, against the local server in its own directory and port (the test,
# demo and compare servers are left alone). Seeds persist in container "memory" and are checked.
#
#   bench/memory.sh
#   WORKLOADS=ls MANY=50000 bench/memory.sh
#   EXTRA_OPTIONS=memory_mb=256 bench/memory.sh      (any -o options added to the mount)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export CSSP_SERVER_DIR=${MEMORY_SERVER_DIR:-$REPO/.work/memory-server}
export CSSP_SERVER_PORT=${MEMORY_SERVER_PORT:-8460}
WORKLOADS=${WORKLOADS:-cat64 ls}
MANY=${MANY:-200000}
BIG=64
BIG_SIZE=$((64 << 20))

die() {
    echo "memory: $*" >&2
    exit 1
}
note() { echo "memory: $*" >&2; }
[[ $(id -u) == 0 ]] || die "run as root (drop_caches, FUSE mounts)"

"$REPO/scripts/setup" >/dev/null
"$REPO/scripts/cssp-server" start >/dev/null
set -a
# shellcheck disable=SC1091
. "$CSSP_SERVER_DIR/env"
set +a
TOOL="$REPO/.build/release/cssp-tool"
MOUNT="$REPO/.build/release/mount.cssp"
URL=$("$REPO/scripts/cssp-server" create-container memory)

WORK=$(mktemp -d /tmp/cssp-memory-XXXX)
MNT=$WORK/mnt
mkdir -p "$MNT"
DAEMON=
cleanup() {
    if grep -q " $MNT fuse.cssp " /proc/mounts; then fusermount3 -u "$MNT" || umount -l "$MNT"; fi
    [[ -n $DAEMON ]] && wait "$DAEMON" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

count() { "$TOOL" "$URL" ls "$1" | wc -l; }
if [[ " $WORKLOADS " == *" cat64 "* ]] && (($(count big/) != BIG)); then
    note "seeding $BIG objects of 64 MiB below big/ (kept for later runs)"
    "$TOOL" "$URL" put-many big/f "$BIG" "$BIG_SIZE" 8 >/dev/null
fi
if [[ " $WORKLOADS " == *" ls "* ]] && (($(count many/) != MANY)); then
    note "seeding $MANY objects below many/ (minutes; kept for later runs)"
    "$TOOL" "$URL" rm-prefix many/ >/dev/null
    "$TOOL" "$URL" put-many many/f "$MANY" 1 32 >/dev/null
fi

# Mounts in the foreground (its PID is the daemon's), with a fresh cache directory.
mount_fresh() {
    rm -rf "$WORK/cache"
    sync
    echo 3 >/proc/sys/vm/drop_caches
    "$MOUNT" "$URL" "$MNT" -f -o "passwd_file=$CSSP_PASSWD_FILE,cache_dir=$WORK/cache${EXTRA_OPTIONS:+,$EXTRA_OPTIONS}" \
        2>"$WORK/daemon.log" &
    DAEMON=$!
    for _ in $(seq 200); do
        grep -q " $MNT fuse.cssp " /proc/mounts && return
        sleep 0.05
    done
    die "the mount did not appear: $(cat "$WORK/daemon.log")"
}
# Peak RSS in MiB, then unmount.
finish() {
    local kb
    kb=$(awk '/VmHWM/ {print $2}' "/proc/$DAEMON/status")
    fusermount3 -u "$MNT"
    wait "$DAEMON"
    DAEMON=
    awk -v kb="$kb" 'BEGIN {printf "%.1f", kb / 1024}'
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN {printf "%.2f", b - a}'; }

printf '%-52s %10s %14s\n' "workload (default options${EXTRA_OPTIONS:+, $EXTRA_OPTIONS})" "seconds" "peak RSS, MiB"
if [[ " $WORKLOADS " == *" cat64 "* ]]; then
    mount_fresh
    start=$(now)
    readers=()
    for i in $(seq 0 $((BIG - 1))); do
        cat "$MNT/big/f$(printf %08d "$i")" >/dev/null &
        readers+=($!)
    done
    wait "${readers[@]}"
    seconds=$(since "$start")
    printf '%-52s %10s %14s\n' "64 parallel cat of 64 MiB objects (4 GiB)" "$seconds" "$(finish)"
fi
if [[ " $WORKLOADS " == *" ls "* ]]; then
    mount_fresh
    start=$(now)
    lines=$(ls -l "$MNT/many" | wc -l)
    seconds=$(since "$start")
    ((lines == MANY + 1)) || die "ls -l printed $lines lines, expected $((MANY + 1))"
    printf '%-52s %10s %14s\n' "ls -l of one directory of $MANY objects" "$seconds" "$(finish)"
fi
