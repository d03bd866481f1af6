#!/usr/bin/env bash
# Issue 3 numbers (a benchmark, not a test), on the local server in one run:
#   1. cp of a 1 GiB file into the mount, until cp returns (the bytes are stored by then), MB/s,
#      next to curl PUT of the same file;
#   2. creating 1 000 files of 4 KiB, each stored at its close, files/s (one writer, serial);
#   3. rsync -a of 1 000 files (4 KiB each) into the mount: first run, and the no-change re-run, s
#      (RSYNC=0 skips it: it is the slow part).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=bench/common.sh
. "$REPO/bench/common.sh"
URL=$("$REPO/scripts/cssp-server" create-container bench-write)
MNT=$(mktemp -d /tmp/cssp-bench-w-XXXX)
WORK=$(mktemp -d /tmp/cssp-bench-w-src-XXXX)
CACHE=$(mktemp -d /tmp/cssp-bench-w-cache-XXXX)
trap 'fusermount3 -u "$MNT" 2>/dev/null || true; rm -rf "$MNT" "$WORK" "$CACHE"' EXIT

head -c $((1 << 30)) /dev/urandom >"$WORK/1g"
mkdir -p "$WORK/small"
for i in $(seq 1000); do head -c 4096 /dev/urandom >"$WORK/small/f$i"; done

mount_it() { "$MOUNT" "$URL" "$MNT" -o passwd_file="$CSSP_PASSWD_FILE",cache_dir="$CACHE"; }

curl_put=(); cp_in=(); create=(); rsync_first=(); rsync_again=()
for run in $(seq "$RUNS"); do
    curl_put+=("$("$REPO/scripts/cssp-curl" -s -o /dev/null -w '%{speed_upload}' -T "$WORK/1g" "$URL/curl-1g" | awk '{print $1 / 1e6}')")
    mount_it
    t=$(now); cp "$WORK/1g" "$MNT/cp-1g"; cp_in+=("$(awk -v s="$(since "$t")" 'BEGIN {print 1073.741824 / s}')")
    mkdir "$MNT/create-$run"
    t=$(now)
    /usr/bin/python3 - "$MNT/create-$run" <<'PY'
import os, sys
data = os.urandom(4096)
for i in range(1000):
    with open(os.path.join(sys.argv[1], "f%d" % i), "wb") as f:
        f.write(data)
PY
    create+=("$(awk -v s="$(since "$t")" 'BEGIN {print 1000 / s}')")
    if [ "${RSYNC:-1}" != 0 ]; then
        t=$(now); rsync -a "$WORK/small/" "$MNT/rsync-$run/"; rsync_first+=("$(since "$t")")
        fusermount3 -u "$MNT"
        mount_it
        t=$(now); rsync -a "$WORK/small/" "$MNT/rsync-$run/"; rsync_again+=("$(since "$t")")
    fi
    fusermount3 -u "$MNT"
    "$TOOL" "$URL" rm-prefix "" >/dev/null
done

header
row "curl PUT 1 GiB, MB/s (ceiling)" "${curl_put[@]}"
row "cp 1 GiB into the mount (stored at close), MB/s" "${cp_in[@]}"
row "create 1000 x 4 KiB files (stored at close), files/s" "${create[@]}"
if [ "${RSYNC:-1}" != 0 ]; then
    row "rsync -a 1000 x 4 KiB files, first run, s" "${rsync_first[@]}"
    row "rsync -a re-run after remount, nothing changed, s" "${rsync_again[@]}"
fi
