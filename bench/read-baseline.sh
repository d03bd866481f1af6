#!/usr/bin/env bash
# Issue 2 numbers (a benchmark, not a test): on the local server, in one run,
#   1. sequential dd read of a 1 GiB object through the mount, next to curl GET of the same object
#      (cold: fresh mount and page cache dropped; then warm: the same mount, page cache kept);
#   2. `ls -l` of a 12 000-entry directory (fresh mount);
#   3. time from running mount.cssp to the first successful `ls`.
# Prints a table. Seeds container "bench" once and reuses it (objects are checked, not trusted).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=bench/common.sh
. "$REPO/bench/common.sh"
bench_mountpoint bench

if ! "$TOOL" "$URL" stat big-1g 2>/dev/null | grep -q "size 1073741824"; then
    echo "seeding a 1 GiB object..." >&2
    head -c $((1 << 30)) /dev/urandom >/tmp/cssp-bench-1g
    "$TOOL" "$URL" put big-1g /tmp/cssp-bench-1g >/dev/null
    rm -f /tmp/cssp-bench-1g
fi
if [ "$("$TOOL" "$URL" ls many/ | wc -l)" -ne 12000 ]; then
    echo "seeding 12 000 objects..." >&2
    "$TOOL" "$URL" put-many many/obj- 12000 1 16 >/dev/null
fi

drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }
mount_it() { "$MOUNT" "$URL" "$MNT" -o passwd_file="$CSSP_PASSWD_FILE" "$@"; }
dd_mbs() { dd if="$1" of=/dev/null bs=1M 2>&1 | awk '/copied/ {for (i=1;i<=NF;i++) if ($i ~ /^s,?$/) t=$(i-1); print 1073.741824 / t}'; }

curl_get=(); cold=(); warm=(); lsl=(); first_ls=()
for _ in $(seq "$RUNS"); do
    curl_get+=("$("$REPO/scripts/cssp-curl" -s -o /dev/null -w '%{speed_download}' "$URL/big-1g" | awk '{print $1 / 1e6}')")
    drop_caches
    mount_it
    cold+=("$(dd_mbs "$MNT/big-1g")")
    warm+=("$(dd_mbs "$MNT/big-1g")")
    fusermount3 -u "$MNT"

    mount_it
    start=$(now)
    n=$(ls -l "$MNT/many" | wc -l)
    lsl+=("$(since "$start")")
    [ "$n" -eq 12001 ] || { echo "ls -l saw $n lines" >&2; exit 1; }
    fusermount3 -u "$MNT"

    start=$(now)
    mount_it
    ls "$MNT" >/dev/null
    first_ls+=("$(since "$start")")
    fusermount3 -u "$MNT"
done

header
row "curl GET 1 GiB, MB/s (ceiling)" "${curl_get[@]}"
row "dd read 1 GiB through the mount, cold, MB/s" "${cold[@]}"
row "dd read 1 GiB again, same mount (page cache), MB/s" "${warm[@]}"
row "ls -l of 12 000 entries, fresh mount, s" "${lsl[@]}"
row "mount.cssp to first ls, s" "${first_ls[@]}"
