#!/usr/bin/env bash
# The mount that outlives its worker (issue 40): KILLS (200; 7.6 s apart, since a fifth death
# within 30 s gives up, so about 25 minutes) kill -9s of the worker while a
# reader goes on by path (stat and read of FILES small files, in a loop, one call after
# another). Prints, over the kills: the pause a program saw (the longest time between two of
# the reader's calls returning, around each kill: median, 95th percentile, max), the reader's
# failed calls by errno, and the resident size of the supervisor and of the last worker.
# BENCH_MOUNT=PATH measures another mount.cssp. RESTART=1: planned restarts (mount.cssp
# --restart) instead of kills, back to back (a restart is no death).
#
#   KILLS=200 bench/restart.sh
#   RESTART=1 KILLS=50 bench/restart.sh
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=bench/common.sh
. "$REPO/bench/common.sh"
[[ $(id -u) == 0 ]] || { echo "restart: run as root (FUSE mounts)" >&2; exit 1; }
KILLS=${KILLS:-200}
FILES=${FILES:-20}

bench_mountpoint restart
CACHE=$(mktemp -d /tmp/cssp-bench-cache-XXXX)
"$MOUNT" "$URL" "$MNT" -f -o passwd_file="$CSSP_PASSWD_FILE",cache_dir="$CACHE" 2>"$CACHE.log" &
SUPERVISOR=$!
trap 'fusermount3 -u "$MNT" 2>/dev/null || true; wait "$SUPERVISOR" 2>/dev/null || true; rmdir "$MNT"; rm -rf "$CACHE" "$CACHE.log"' EXIT
for _ in $(seq 200); do mountpoint -q "$MNT" && break; sleep 0.05; done
mountpoint -q "$MNT" || { cat "$CACHE.log" >&2; exit 1; }
mkdir -p "$MNT/restart"
for i in $(seq "$FILES"); do printf 'file %d\n' "$i" >"$MNT/restart/f$i"; done

/usr/bin/python3 - "$MNT/restart" "$SUPERVISOR" "$KILLS" "$FILES" "${RESTART:-0}" "$MOUNT" "$MNT" <<'PY'
import errno, os, signal, statistics, subprocess, sys, threading, time

directory, supervisor, kills, files = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
restart, binary, mountpoint = sys.argv[5] == "1", sys.argv[6], sys.argv[7]
done = []            # when each of the reader's calls returned
failures = {}        # errno name -> count
stop = threading.Event()

def reader():
    i = 0
    while not stop.is_set():
        path = os.path.join(directory, "f%d" % (i % files + 1))
        try:
            os.stat(path)
            with open(path, "rb") as f:
                f.read()
        except OSError as e:
            name = errno.errorcode.get(e.errno, str(e.errno))
            failures[name] = failures.get(name, 0) + 1
        done.append(time.monotonic())
        i += 1

def worker():
    with open("/proc/%d/task/%d/children" % (supervisor, supervisor)) as f:
        children = f.read().split()
    return int(children[0]) if len(children) == 1 else None

def rss(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0

thread = threading.Thread(target=reader)
thread.start()
while len(done) < 10:
    time.sleep(0.01)
pauses = []
for _ in range(kills):
    old = worker()
    while old is None:
        time.sleep(0.001)
        old = worker()
    killed_at = time.monotonic()
    count = len(done)
    if restart:
        subprocess.run([binary, "--restart", mountpoint], check=True, stdout=subprocess.DEVNULL)
    else:
        os.kill(old, signal.SIGKILL)
    # The reader must have come back twice since: the pause is the gap around the kill.
    deadline = killed_at + 30
    while len(done) < count + 2 and time.monotonic() < deadline:
        time.sleep(0.001)
    if len(done) < count + 2:
        print("restart: the reader did not come back within 30 s of a kill", file=sys.stderr)
        break
    gaps = [b - a for a, b in zip(done[count - 1:count + 2], done[count:count + 2])]
    pauses.append(max(gaps))
    # A fifth death within 30 s gives up (the mount answers EIO): kills 7.6 s apart.
    while not restart and time.monotonic() - killed_at < 7.6:
        time.sleep(0.01)
stop.set()
thread.join()
pauses.sort()
last = worker()
what = "restart" if restart else "kill"
print("%ss %d, reader calls %d, failed calls %s" % (what, len(pauses), len(done), failures or "none"))
print("pause around a " + what + ", s: median %.3f, p95 %.3f, max %.3f" % (
    statistics.median(pauses), pauses[int(0.95 * (len(pauses) - 1))], pauses[-1]))
print("resident: supervisor %.1f MiB, worker %.1f MiB" % (rss(supervisor), rss(last) if last else 0))
PY
