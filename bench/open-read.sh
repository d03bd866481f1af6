#!/usr/bin/env bash
# Issue 23's cost (a benchmark, not a test): open + read + close (`cat`) of 1 000 small files
# (2 KiB), on the local server:
#   1. on a fresh mount;
#   2. again on the same mount, every file read before (the "cached" pass);
#   3. the requests the cached pass sent (from --stats).
# A handle that finds another client's new version takes it on its first read instead of failing
# with ESTALE; the happy path must cost no request more than before. MOUNT_BEFORE=PATH (an older
# mount.cssp) adds the same rows for it, in the same run.
# Prints a table. Seeds container "bench" once and reuses it.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=bench/common.sh
. "$REPO/bench/common.sh"
bench_mountpoint bench

if [ "$("$TOOL" "$URL" ls small/ | wc -l)" -ne 1000 ]; then
    echo "seeding 1 000 objects of 2 KiB..." >&2
    "$TOOL" "$URL" put-many small/obj- 1000 2048 16 >/dev/null
fi

read_all() {
    local start
    start=$(now)
    for file in "$MNT"/small/*; do cat "$file" >/dev/null; done
    since "$start"
}
requests() { "$1" --stats "$MNT" | awk '/^cssp_requests_total/ {sum += $NF} END {print sum + 0}'; }

# measure BINARY LABEL
measure() {
    local first=() cached=() sent=() before
    for _ in $(seq "$RUNS"); do
        "$1" "$URL" "$MNT" -o passwd_file="$CSSP_PASSWD_FILE"
        first+=("$(read_all)")
        before=$(requests "$1")
        cached+=("$(read_all)")
        sent+=("$(($(requests "$1") - before))")
        "$1" --unmount "$MNT" >/dev/null
    done
    row "$2: 1 000 x open+read, fresh mount (s)" "${first[@]}"
    row "$2: 1 000 x open+read, cached (s)" "${cached[@]}"
    row "$2: requests of the cached pass" "${sent[@]}"
}

header
measure "$MOUNT" "this build"
if [[ -n ${MOUNT_BEFORE:-} ]]; then measure "$MOUNT_BEFORE" "before"; fi
