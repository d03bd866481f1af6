#!/usr/bin/env bash
# Issue 10, item 7 and issue 21 numbers (a benchmark, not a test): the mount daemon's peak RSS
# (VmHWM) and the time of
#   cat64   64 parallel `cat` of 64 objects of 64 MiB (4 GiB), fresh mount, page cache dropped
#   ls      `ls -l` of one directory of 200 000 objects (seed/huge-flat/), fresh mount
#   tree    `ls -lR` of 100 000 objects in 1 000 directories (seed/huge-tree/), fresh mount
# with default options; for ls and tree also the daemon's memory per entry: its RSS after the
# walk less its RSS after mounting, divided by the entries shown, right after the walk and again
# 3 s later ("settled": the daemon gives freed heap back once its work settles). Runs on the compare server
# (.work/compare-server, port 8470, container "compare"; not at the same time as compare.sh),
# whose big trees bench/seed-huge.sh seeds and keeps; cat64's objects are seeded below
# seed/mem-big/ and kept too.
#
#   bench/memory.sh
#   WORKLOADS=ls bench/memory.sh
#   EXTRA_OPTIONS=memory_mb=256 bench/memory.sh      (any -o options added to the mount)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export CSSP_SERVER_DIR=${COMPARE_SERVER_DIR:-$REPO/.work/compare-server}
export CSSP_SERVER_PORT=${COMPARE_SERVER_PORT:-8470}
WORKLOADS=${WORKLOADS:-cat64 ls tree}
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
# BENCH_MOUNT=PATH measures another mount.cssp (an older build).
MOUNT=${BENCH_MOUNT:-$REPO/.build/release/mount.cssp}
URL=$("$REPO/scripts/cssp-server" create-container compare)

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
if [[ " $WORKLOADS " == *" cat64 "* ]] && (($(count seed/mem-big/) != BIG)); then
    note "seeding $BIG objects of 64 MiB below seed/mem-big/ (kept for later runs)"
    "$TOOL" "$URL" put-many seed/mem-big/f "$BIG" "$BIG_SIZE" 8 >/dev/null
fi
[[ " $WORKLOADS " == *" ls "* ]] && "$REPO/bench/seed-huge.sh" "$URL" flat
[[ " $WORKLOADS " == *" tree "* ]] && "$REPO/bench/seed-huge.sh" "$URL" tree

# Mounts in the foreground (its PID is the daemon's), with a fresh cache directory.
mount_fresh() {
    rm -rf "$WORK/cache"
    sync
    echo 3 >/proc/sys/vm/drop_caches
    "$MOUNT" "$URL" "$MNT" -f -o "passwd_file=$CSSP_PASSWD_FILE,cache_dir=$WORK/cache${EXTRA_OPTIONS:+,$EXTRA_OPTIONS}" \
        2>"$WORK/daemon.log" &
    DAEMON=$!
    for _ in $(seq 200); do
        if grep -q " $MNT fuse.cssp " /proc/mounts; then
            ls "$MNT" >/dev/null
            BASE_KB=$(rss_kb)
            return
        fi
        sleep 0.05
    done
    die "the mount did not appear: $(cat "$WORK/daemon.log")"
}
rss_kb() { awk '/VmRSS/ {print $2}' "/proc/$DAEMON/status"; }
# The daemon's memory per entry now: RSS less the RSS after mounting, over $1 entries, bytes.
per_entry() { awk -v now="$(rss_kb)" -v base="$BASE_KB" -v n="$1" 'BEGIN {printf "%.0f", (now - base) * 1024 / n}'; }
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

printf '%-52s %10s %14s %16s %9s\n' "workload (default options${EXTRA_OPTIONS:+, $EXTRA_OPTIONS})" "seconds" "peak RSS, MiB" "bytes per entry" "settled"
if [[ " $WORKLOADS " == *" cat64 "* ]]; then
    mount_fresh
    start=$(now)
    readers=()
    for i in $(seq 0 $((BIG - 1))); do
        cat "$MNT/seed/mem-big/f$(printf %08d "$i")" >/dev/null &
        readers+=($!)
    done
    wait "${readers[@]}"
    seconds=$(since "$start")
    printf '%-52s %10s %14s %16s %9s\n' "64 parallel cat of 64 MiB objects (4 GiB)" "$seconds" "$(finish)" - -
fi
if [[ " $WORKLOADS " == *" ls "* ]]; then
    mount_fresh
    start=$(now)
    lines=$(ls -l "$MNT/seed/huge-flat" | wc -l)
    seconds=$(since "$start")
    ((lines == 200001)) || die "ls -l printed $lines lines, expected 200001"
    bytes=$(per_entry 200000)
    sleep 3
    settled=$(per_entry 200000)
    printf '%-52s %10s %14s %16s %9s\n' "ls -l of one directory of 200 000 objects" "$seconds" "$(finish)" "$bytes" "$settled"
fi
if [[ " $WORKLOADS " == *" tree "* ]]; then
    mount_fresh
    start=$(now)
    lines=$(ls -lR "$MNT/seed/huge-tree" | grep -c '^-')
    seconds=$(since "$start")
    ((lines == 100000)) || die "ls -lR showed $lines files, expected 100000"
    bytes=$(per_entry 101000)
    sleep 3
    settled=$(per_entry 101000)
    printf '%-52s %10s %14s %16s %9s\n' "ls -lR of 100 000 objects in 1 000 directories" "$seconds" "$(finish)" "$bytes" "$settled"
fi
