#!/usr/bin/env bash
# Issue 22's exclusive creates (a benchmark, not a test): two mounts of one container (two
# daemons, two cache directories) open the same new name with O_CREAT|O_EXCL at once, ROUNDS
# times (default 1 000), released together by a barrier (one thread per mount in one Python
# process; os.open lets go of Python's lock). Prints, per setting, the races where both opens
# succeeded (a lock held twice), where neither did, and the seconds per race.
#   excl_create=server  the create is stored with If-None-Match before open returns, and read back
#   excl_create=local   the default: each mount checks its own view of the directory only
# LATENCY_MS=N adds N ms to every request (the server's fault file), as in compare.sh.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=bench/common.sh
. "$REPO/bench/common.sh"
ROUNDS=${ROUNDS:-1000}
LATENCY_MS=${LATENCY_MS:-0}
URL=$("$REPO/scripts/cssp-server" create-container many-hosts)
A=$(mktemp -d /tmp/cssp-bench-a-XXXX)
B=$(mktemp -d /tmp/cssp-bench-b-XXXX)
CACHE=$(mktemp -d /tmp/cssp-bench-cache-XXXX)
cleanup() {
    fusermount3 -u "$A" 2>/dev/null || true
    fusermount3 -u "$B" 2>/dev/null || true
    rmdir "$A" "$B" 2>/dev/null || true
    rm -rf "$CACHE"
    if [[ $LATENCY_MS != 0 ]]; then : >"$CSSP_SERVER_FAULT_FILE"; fi
}
trap cleanup EXIT
if [[ $LATENCY_MS != 0 ]]; then
    echo "* stall=$(awk -v ms="$LATENCY_MS" 'BEGIN { print ms / 1000 }') /many-hosts" >"$CSSP_SERVER_FAULT_FILE"
fi

RACER='
import os, sys, threading
rounds, tag = int(sys.argv[3]), sys.argv[4]
barrier = threading.Barrier(2)
results = {}
def race(base, mine):
    out = []
    for n in range(rounds):
        barrier.wait()
        try:
            fd = os.open("%s/%s-%d" % (base, tag, n), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            out.append(0)
            continue
        os.close(fd)
        out.append(1)
    results[mine] = out
threads = [threading.Thread(target=race, args=(sys.argv[1], "a")), threading.Thread(target=race, args=(sys.argv[2], "b"))]
for t in threads: t.start()
for t in threads: t.join()
pairs = list(zip(results["a"], results["b"]))
print(sum(1 for p in pairs if p == (1, 1)), sum(1 for p in pairs if p == (0, 0)))
'

# measure SETTING: one series of ROUNDS races with excl_create=SETTING on both mounts.
measure() {
    local t both neither seconds
    for dir in "$A" "$B"; do
        "$MOUNT" "$URL" "$dir" -o passwd_file="$CSSP_PASSWD_FILE",cache_dir="$CACHE/$(basename "$dir")",excl_create="$1"
    done
    t=$(now)
    read -r both neither < <(/usr/bin/python3 -c "$RACER" "$A" "$B" "$ROUNDS" "$1-$(date +%s%N)")
    seconds=$(since "$t")
    printf '%-22s %8d %14d %14d %16.4f\n' "excl_create=$1" "$ROUNDS" "$both" "$neither" \
        "$(awk -v s="$seconds" -v n="$ROUNDS" 'BEGIN { print s / n }')"
    "$MOUNT" --unmount "$A" >/dev/null
    "$MOUNT" --unmount "$B" >/dev/null
}

[[ $LATENCY_MS != 0 ]] && echo "every request waited $LATENCY_MS ms before its answer"
printf '%-22s %8s %14s %14s %16s\n' "setting" "races" "both created" "neither" "seconds a race"
measure server
measure local
