#!/usr/bin/env bash
# Issue 20 profile numbers (a benchmark, not a test): rsync -a of 1000 files of 1 KiB to 256 KiB
# (130 MB, the compare.sh rsync1 tree) into a fresh write-back mount, on the local server:
#   1. with nothing uploading (writeback_delay=3600): what the daemon costs rsync, s;
#   2. with the queue's uploads running beside it (the defaults): until rsync returns, and until
#      `mount.cssp --unmount` returns (everything stored, the drain included), s.
# PERF=1 records the daemon with `perf record -g` during the second kind of run (the data in
# .work/writeback-rsync.perf; `perf report -i` it).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=bench/common.sh
. "$REPO/bench/common.sh"
bench_mountpoint bench-writeback
SRC=$(mktemp -d /tmp/cssp-bench-wb-src-XXXX)
CACHE=$(mktemp -d /tmp/cssp-bench-wb-cache-XXXX)
trap 'fusermount3 -u "$MNT" 2>/dev/null || true; rmdir "$MNT"; rm -rf "$SRC" "$CACHE"' EXIT
/usr/bin/python3 - "$SRC" <<'PY'
import os, random, sys
sizes = random.Random(1)
for i in range(1000):
    with open(os.path.join(sys.argv[1], "m%04d" % i), "wb") as f:
        f.write(os.urandom(sizes.randint(1024, 256 * 1024)))
PY

# run OPTIONS: one fresh mount, one rsync into a fresh prefix; sets RETURNED and STORED.
run() {
    rm -rf "$CACHE" && mkdir -p "$CACHE"
    "$MOUNT" "$URL" "$MNT" -o passwd_file="$CSSP_PASSWD_FILE",cache_dir="$CACHE",writeback${1:+,$1}
    local prefix t perf=""
    prefix=r$(date +%s%N)
    if [ -n "${PERF:-}" ] && [ -z "$1" ]; then
        perf record -q -g -o "$REPO/.work/writeback-rsync.perf" -p "$(pgrep -n -f "mount.cssp $URL $MNT")" &
        perf=$!
    fi
    t=$(now)
    rsync -a "$SRC/" "$MNT/$prefix/"
    RETURNED=$(since "$t")
    if [ -n "$perf" ]; then kill -INT "$perf"; wait "$perf" || true; fi
    "$MOUNT" --unmount "$MNT"
    STORED=$(since "$t")
    "$TOOL" "$URL" rm-prefix "$prefix/" >/dev/null
}

idle=(); returned=(); stored=()
for _ in $(seq "$RUNS"); do
    run writeback_delay=3600
    idle+=("$RETURNED")
    run ""
    returned+=("$RETURNED")
    stored+=("$STORED")
done

header
row "rsync -a 1000 files, write-back, nothing uploading, s" "${idle[@]}"
row "the same with the uploads running: rsync returns, s" "${returned[@]}"
row "  everything stored (mount.cssp --unmount returned), s" "${stored[@]}"
