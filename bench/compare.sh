#!/usr/bin/env bash
# Issue 4 numbers (a benchmark, not a test): csspfs side by side with its peers, rclone mount
# (Swift backend) and s3fs (through s3api), each as installed and tuned, and the raw ceiling
# (curl and cssp-tool), on one local server and one container, in one run:
#   read     sequential dd read of a 1 GiB object: cold (fresh mount, page cache dropped),
#            then warm (again on the same mount), MB/s
#   fio      4 KiB random reads of that object, fio psync, 4 jobs, FIO_SECONDS (default 20) s, IOPS
#   write    dd of a 1 GiB file into the mount, until the object is on the server, MB/s
#   create   cp -r of 1000 files of 4 KiB: until cp returns, and until all are on the server,
#            files/s
#   ls       ls -l of a 10 000-object directory: fresh mount, then again on the same mount, s
#   rsync    rsync -a re-run over 1000 unchanged files after a remount (must send nothing), s;
#            then again after a remount that keeps the cache directory
#   creates4 4 processes each creating 1000 empty files in one directory (issue 24): files/s
#            until the last close returned and until all are stored, and the listing requests
#            the tool sent meanwhile (counted in the server's access log by User-Agent)
#   rsync1   rsync -a first run of 1000 files of 1 KiB to 256 KiB into an empty directory: until
#            rsync returns and until all are stored, s; and the HTTP requests the tool sent
#            meanwhile, per file (counted in the server's access log by User-Agent)
#   rmrf     rm -rf of a directory of 1000 files of 4 KiB (written through the same tool, then a
#            fresh mount): until rm returns, and until the server lists none of them, s
#   find     find of the rsync tree (1000 files), fresh mount, s
#   findtree find and du -s of a tree of 100 directories of 10 files each (seeded through the API,
#            kept between runs), fresh mount each, s
#   walk     find, du -s and rsync -a --dry-run (the re-run that finds nothing to do: it stats every
#            file) of seed/huge-tree/, 100 000 objects in 1 000 directories, fresh mount each, s
#   lshuge   ls (names only) and ls -l of seed/huge-flat/, 200 000 objects in one directory, fresh
#            mount each, s; and the HEAD requests csspfs sent during the ls without -l
#            (walk and lshuge: seeded by bench/seed-huge.sh, kept between runs; a walk that
#            takes longer than WALK_LIMIT, 600 s, is stopped and shown as "> 600 s")
#   fwalk    walk over seed/foreign-tree/, the same tree written as other tools write it (the
#            mtime only in X-Object-Meta-Mtime, 64 bytes an object; issue 38): find, du -s, and
#            rsync -an of a local tree holding the same files (it must send nothing), each on a
#            fresh mount; then du -s and the rsync again after a remount with the same cache_dir
#            (csspfs keeps what HEADs said in it); and the HEADs each of those sent
#   flshuge  lshuge over seed/foreign-flat/ (200 000 such objects): ls, ls -l on fresh mounts,
#            ls -l again after a remount with the same cache_dir, and the HEADs each sent
# and, for every mount the workloads make, the time from the mount command to the first `ls`
# (median) and the daemon's peak RSS (VmHWM before unmount, maximum). The ceiling also reads the
# object with 4 parallel ranged GETs of a quarter each (the parallel-GET ceiling); for walk and
# lshuge it is the raw paged listing of the prefix (10 000 names a page; no delimiter for the
# tree, "/" for the flat directory), shown in each of their rows; for fwalk and flshuge also the
# HEAD ceiling: 20 000 HEADs of seed/foreign-flat/, 16 at once (HEADs a second; a walk that HEADs
# each of N objects takes at least N / that).
#
# LATENCY_MS=20 adds that much to every request of every client (csspfs, the ceiling, rclone
# and s3fs, listings included) before the server answers (the test server's fault file,
# `stall=`, which cssp_auth applies to other schemes' requests too), which models a distant
# server.
#
#   bench/compare.sh                          everything, medians of RUNS=3 (about 40 minutes)
#   RUNS=1 TOOLS="csspfs s3fs-default" WORKLOADS="read ls" bench/compare.sh
#
# Environment: RUNS (3); TOOLS or ONLY (ceiling csspfs csspfs-wb csspfs-listing rclone-default
# rclone-tuned s3fs-default s3fs-tuned; csspfs-wb is csspfs with -o writeback, csspfs-listing
# csspfs with -o foreign_attrs=listing; only when named: csspfs-s3, csspfs over s3:// through the
# same s3api as s3fs, and rclone-s3-tuned, rclone mount tuned with its S3 backend on that
# s3api); WORKLOADS (read fio write create creates4 ls rsync rsync1 rmrf find findtree;
# walk, lshuge, fwalk, flshuge and visibility only when named);
# FIO_SECONDS (20); WALK_LIMIT (600); VIS_CHANGES (100), VIS_LIMIT (10 s) and VIS_IDLE (30 s)
# for visibility; WAIT_TIMEOUT
# (seconds to wait for uploads, 900); COMPARE_SERVER_DIR (.work/compare-server) and
# COMPARE_SERVER_PORT (8470), so that the test suite's (8490) and the demo server (8480) are
# left alone; KEEP_SERVER=1 leaves a server this script started running; RCLONE_TUNED_EXTRA and
# S3FS_TUNED_EXTRA (more rclone flags, more s3fs -o options) try other tunings; CSSPFS_EXTRA
# (more -o options of csspfs and csspfs-wb, e.g. list_ahead=0); BENCH_MOUNT=PATH
# measures another mount.cssp (an older build) as csspfs.
#
# Subtleties:
# 1. "Until stored" means the object is on the server, not that close returned: rclone with a
#    VFS cache uploads after close, so every write workload polls the server (HEAD or LIST)
#    until the sizes match, and the clock stops then.
# 2. Cold means cold everywhere: each mount gets a fresh, empty cache directory (csspfs
#    cache_dir, rclone --cache-dir, s3fs use_cache) and the page cache is dropped before it.
#    The isolated cache directory is not a tuning; the tuned options are in TUNED below.
# 3. Seeds persist in the server's container "compare" and are checked, not trusted:
#    seed/big-1g, seed/many/ (10 000 objects; seeding takes minutes), and one rsync tree per
#    peer and API (rsync-csspfs/, rsync-csspfs-s3/, rsync-rclone/, rsync-rclone-s3/,
#    rsync-s3fs/), written by an untimed first rsync when the server does not hold it yet. The
#    1000-file source is made deterministic (content and mtime) so that trees from an earlier
#    run still match it; the re-run's transfer count (reported if not 0) checks that.
# 4. Write workloads write below w-<tool>/ and delete it after each run, with the parts of
#    multipart uploads: csspfs's below .cssp-parts/, s3api's in container compare+segments.
# 5. Each tool writes only below its own top-level prefixes: the tools disagree on directory
#    markers and on X-Object-Meta-Mode (csspfs writes octal permissions, s3fs a decimal
#    st_mode), and s3fs shows a csspfs-made "dir/" marker as a file.
# 6. rclone and s3fs authenticate through tempauth and s3api on the same account as the CSSP
#    key (scripts/cssp-server, subtlety 6), so all of them see the same objects.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export CSSP_SERVER_DIR=${COMPARE_SERVER_DIR:-$REPO/.work/compare-server}
export CSSP_SERVER_PORT=${COMPARE_SERVER_PORT:-8470}
ALL_TOOLS="ceiling csspfs csspfs-wb csspfs-listing rclone-default rclone-tuned s3fs-default s3fs-tuned"
NAMED_TOOLS="csspfs-s3 rclone-s3-tuned" # measured only when named
TOOLS=${ONLY:-${TOOLS:-$ALL_TOOLS}}
WORKLOADS=${WORKLOADS:-read fio write create creates4 ls rsync rsync1 rmrf find findtree}
FIO_SECONDS=${FIO_SECONDS:-20}
WALK_LIMIT=${WALK_LIMIT:-600}
export LATENCY_MS=${LATENCY_MS:-0}
WAIT_TIMEOUT=${WAIT_TIMEOUT:-900}
VIS_CHANGES=${VIS_CHANGES:-100}
VIS_LIMIT=${VIS_LIMIT:-10}
VIS_IDLE=${VIS_IDLE:-30}
CONTAINER=compare
GIB=1073741824
MANY=10000

die() {
    echo "compare: $*" >&2
    exit 1
}
note() { echo "compare: $*" >&2; }

for t in $TOOLS; do [[ " $ALL_TOOLS $NAMED_TOOLS " == *" $t "* ]] || die "unknown tool $t (known: $ALL_TOOLS $NAMED_TOOLS)"; done
for w in $WORKLOADS; do
    [[ " read fio write create creates4 ls rsync rsync1 rmrf find findtree walk lshuge fwalk flshuge visibility " == *" $w "* ]] ||
        die "unknown workload $w (read fio write create creates4 ls rsync rsync1 rmrf find findtree walk lshuge fwalk flshuge visibility)"
done
wants() { [[ " $WORKLOADS " == *" $1 "* ]]; }
uses() { [[ " $TOOLS " == *" $1"* ]]; }

# fio is a bench-only dependency; scripts/setup installs rclone and s3fs (the interop tests
# use them). Whatever is missing is installed here.
needed=()
uses rclone && ! command -v rclone >/dev/null && needed+=(rclone)
uses s3fs && ! command -v s3fs >/dev/null && needed+=(s3fs)
wants fio && ! command -v fio >/dev/null && needed+=(fio)
command -v rsync >/dev/null || needed+=(rsync)
if ((${#needed[@]})); then
    note "installing ${needed[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q "${needed[@]}" >/dev/null 2>&1 || {
        apt-get update -q >/dev/null
        apt-get install -y -q "${needed[@]}" >/dev/null
    }
fi
[[ $(id -u) == 0 ]] || die "run as root (drop_caches, FUSE mounts)"

server_was_running=false
"$REPO/scripts/cssp-server" status >/dev/null 2>&1 && server_was_running=true
# shellcheck source=bench/common.sh
. "$REPO/bench/common.sh"
URL=$("$REPO/scripts/cssp-server" create-container "$CONTAINER")
if [[ $LATENCY_MS != 0 ]]; then
    [[ $LATENCY_MS =~ ^[0-9]+$ ]] || die "LATENCY_MS must be a whole number of milliseconds"
    printf '* stall=%s /%s\n' "$(awk -v ms="$LATENCY_MS" 'BEGIN { print ms / 1000 }')" "$CONTAINER" >"$CSSP_SERVER_FAULT_FILE"
    note "every request waits $LATENCY_MS ms before its answer (fault file $CSSP_SERVER_FAULT_FILE)"
fi
SEGMENTS_URL=$URL+segments # s3api's multipart segments
OUT=$REPO/.work/compare
rm -rf "$OUT"
mkdir -p "$OUT/logs"
RESULTS=$OUT/results.tsv
: >"$RESULTS"
WORK=$(mktemp -d /tmp/cssp-compare-XXXX)
MNT=$WORK/mnt
CACHE=$WORK/cache
mkdir -p "$MNT"

export RCLONE_CONFIG_CSSP_TYPE=swift RCLONE_CONFIG_CSSP_AUTH=$CSSP_PEER_AUTH_URL
export RCLONE_CONFIG_CSSP_USER=$CSSP_PEER_USER RCLONE_CONFIG_CSSP_KEY=$CSSP_PEER_KEY
: >"$WORK/rclone.conf"
# rclone-s3-tuned: the S3 backend on the s3api csspfs-s3 and s3fs use.
export RCLONE_CONFIG_CSSPS3_TYPE=s3 RCLONE_CONFIG_CSSPS3_PROVIDER=Other RCLONE_CONFIG_CSSPS3_ENDPOINT=$CSSP_SERVER_URL
export RCLONE_CONFIG_CSSPS3_FORCE_PATH_STYLE=true RCLONE_CONFIG_CSSPS3_REGION=us-east-1
export RCLONE_CONFIG_CSSPS3_ACCESS_KEY_ID=$CSSP_PEER_USER RCLONE_CONFIG_CSSPS3_SECRET_ACCESS_KEY=$CSSP_PEER_KEY

# What a user would tune; see bench/RESULTS.md ("Issue 4") for the reasons.
RCLONE_TUNED=(--vfs-cache-mode full --vfs-write-back 0s --buffer-size 32M --vfs-read-ahead 128M
    --vfs-read-chunk-size 32M --vfs-read-chunk-size-limit off --dir-cache-time 1h --attr-timeout 10s
    --transfers 8 --checkers 16 --vfs-fast-fingerprint)
read -ra extra <<<"${RCLONE_TUNED_EXTRA:-}"
RCLONE_TUNED+=("${extra[@]}")
S3FS_TUNED=use_cache=$CACHE,parallel_count=8,multipart_size=64,multireq_max=40,max_stat_cache_size=200000,stat_cache_expire=3600,enable_noobj_cache,kernel_cache
S3FS_TUNED+=${S3FS_TUNED_EXTRA:+,$S3FS_TUNED_EXTRA}

TOOL_NAME= # the tool being measured
DAEMON=    # PID of its mount daemon

cleanup() {
    local status=$?
    if mountpoint -q "$MNT" 2>/dev/null; then
        fusermount3 -u "$MNT" 2>/dev/null || fusermount3 -uz "$MNT" || true
    fi
    rm -rf "$WORK"
    [[ $LATENCY_MS == 0 ]] || rm -f "$CSSP_SERVER_FAULT_FILE"
    if ! $server_was_running && [[ ${KEEP_SERVER:-0} != 1 ]]; then
        "$REPO/scripts/cssp-server" stop >/dev/null || true
    fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

record() { printf '%s\t%s\t%s\n' "$TOOL_NAME" "$1" "$2" >>"$RESULTS"; }
per_second() { awk -v n="$1" -v s="$2" 'BEGIN { print n / s }'; }
drop_caches() {
    sync
    echo 3 >/proc/sys/vm/drop_caches
}

pid_alive() {
    local state
    kill -0 "$1" 2>/dev/null || return 1
    state=$(awk '/^State:/ { print $2 }' "/proc/$1/status" 2>/dev/null) || return 1
    [[ -n $state && $state != Z ]]
}

# The PID of the daemon serving $MNT: the one mount.cssp, rclone or s3fs process with $MNT as
# an argument (the mount point is a fresh temporary directory, so the match is exact). A csspfs
# mount has two (issue 40): the supervisor, which holds the mount, and its worker, which serves
# and is the one measured.
daemon_pid() {
    local proc comm found=() pid
    for proc in /proc/[0-9]*; do
        comm=$(cat "$proc/comm" 2>/dev/null) || continue
        case $comm in mount.cssp* | rclone | s3fs) ;; *) continue ;; esac
        if tr '\0' '\n' <"$proc/cmdline" 2>/dev/null | grep -qxF -- "$MNT"; then
            found+=("${proc#/proc/}")
        fi
    done
    if ((${#found[@]} == 2)); then
        for pid in "${found[@]}"; do
            if [[ " ${found[*]} " == *" $(awk '/^PPid:/ { print $2 }' "/proc/$pid/status" 2>/dev/null) "* ]]; then
                echo "$pid"
                return
            fi
        done
    fi
    ((${#found[@]} == 1)) || die "expected one daemon for $MNT, found: ${found[*]:-none}"
    echo "${found[0]}"
}

mount_command() {
    local log=$OUT/logs/$TOOL_NAME.log
    case $TOOL_NAME in
        csspfs) "$MOUNT" "$URL" "$MNT" -o passwd_file="$CSSP_PASSWD_FILE",cache_dir="$CACHE"${CSSPFS_EXTRA:+,$CSSPFS_EXTRA} ;;
        csspfs-wb) "$MOUNT" "$URL" "$MNT" -o passwd_file="$CSSP_PASSWD_FILE",cache_dir="$CACHE",writeback${CSSPFS_EXTRA:+,$CSSPFS_EXTRA} ;;
        csspfs-listing) "$MOUNT" "$URL" "$MNT" -o passwd_file="$CSSP_PASSWD_FILE",cache_dir="$CACHE",foreign_attrs=listing${CSSPFS_EXTRA:+,$CSSPFS_EXTRA} ;;
        csspfs-s3) AWS_ACCESS_KEY_ID=$CSSP_PEER_USER AWS_SECRET_ACCESS_KEY=$CSSP_PEER_KEY \
            "$MOUNT" "s3://$CONTAINER" "$MNT" -o endpoint="$CSSP_SERVER_URL",cache_dir="$CACHE"${CSSPFS_EXTRA:+,$CSSPFS_EXTRA} ;;
        rclone-s3-tuned)
            # (rclone 1.60's S3 backend refuses any AWS_CA_BUNDLE, which some machines set.)
            env -u AWS_CA_BUNDLE rclone mount "cssps3:$CONTAINER" "$MNT" --daemon --config "$WORK/rclone.conf" \
                --cache-dir "$CACHE" --log-file "$OUT/logs/$TOOL_NAME.rclone.log" "${RCLONE_TUNED[@]}"
            ;;
        rclone-default | rclone-tuned)
            local tuned=()
            [[ $TOOL_NAME == rclone-tuned ]] && tuned=("${RCLONE_TUNED[@]}")
            rclone mount "cssp:$CONTAINER" "$MNT" --daemon --config "$WORK/rclone.conf" \
                --cache-dir "$CACHE" --log-file "$OUT/logs/$TOOL_NAME.rclone.log" "${tuned[@]}"
            ;;
        s3fs-default | s3fs-tuned)
            local opts=url=$CSSP_SERVER_URL,use_path_request_style
            [[ $TOOL_NAME == s3fs-tuned ]] && opts+=,$S3FS_TUNED
            AWSACCESSKEYID=$CSSP_PEER_USER AWSSECRETACCESSKEY=$CSSP_PEER_KEY s3fs "$CONTAINER" "$MNT" -o "$opts"
            ;;
    esac >>"$log" 2>&1
}

# A fresh mount of $TOOL_NAME on $MNT, page cache dropped and cache directory empty. Records
# the time from the mount command to the first successful ls.
mount_fresh() {
    rm -rf "$CACHE"
    mount_again
}

# mount_fresh, keeping what the cache directory holds (a remount).
mount_again() {
    mkdir -p "$CACHE"
    drop_caches
    local t deadline=$((SECONDS + 60))
    t=$(now)
    mount_command || die "mounting $TOOL_NAME failed; see $OUT/logs/$TOOL_NAME.log"
    until mountpoint -q "$MNT" && ls "$MNT" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || die "$TOOL_NAME: no answer from $MNT after 60 s; see $OUT/logs/$TOOL_NAME.log"
        sleep 0.01
    done
    record mount "$(since "$t")"
    DAEMON=$(daemon_pid)
}

# Records the daemon's peak RSS, unmounts and waits until the daemon has exited; the cache
# directory goes too unless $1 is "keep".
unmount_it() {
    local hwm deadline=$((SECONDS + 120))
    hwm=$(awk '/^VmHWM:/ { print $2 }' "/proc/$DAEMON/status") || die "$TOOL_NAME daemon $DAEMON is gone"
    record rss "$(awk -v k="$hwm" 'BEGIN { print k / 1024 }')"
    # A walk the limit stopped may leave its processes a moment in the mount (waiting for the
    # answers of a slow peer): busy until they are gone.
    until fusermount3 -u "$MNT" 2>>"$OUT/logs/unmount.log"; do
        ((SECONDS < deadline)) || die "cannot unmount $MNT ($TOOL_NAME): busy for 120 s; see $OUT/logs/unmount.log"
        sleep 0.5
    done
    while pid_alive "$DAEMON"; do
        ((SECONDS < deadline)) || die "$TOOL_NAME daemon $DAEMON still runs 120 s after unmount"
        sleep 0.05
    done
    [[ ${1:-} == keep ]] || rm -rf "$CACHE"
}

# Copies $1 to $2 with dd bs=1M; prints the seconds. Dies unless 1 GiB went through.
dd_gib() {
    local t out bytes
    t=$(now)
    out=$(dd if="$1" of="$2" bs=1M 2>&1) || die "$TOOL_NAME: dd $1 -> $2 failed: $out"
    t=$(since "$t")
    bytes=$(awk '/copied/ { print $1 }' <<<"$out")
    [[ $bytes == "$GIB" ]] || die "$TOOL_NAME: dd $1 -> $2 moved $bytes bytes"
    echo "$t"
}

# Waits until object $1 has size $2 on the server.
wait_object() {
    local deadline=$((SECONDS + WAIT_TIMEOUT))
    until [[ $("$TOOL" "$URL" stat "$1" 2>/dev/null | awk 'NR == 1 && $1 == "size" { print $2 }') == "$2" ]]; do
        ((SECONDS < deadline)) || die "$TOOL_NAME: $1 not stored with size $2 after $WAIT_TIMEOUT s"
        sleep 0.1
    done
}

# Waits until $2 objects of $3 bytes are stored below prefix $1.
wait_objects() {
    local deadline=$((SECONDS + WAIT_TIMEOUT)) n
    while :; do
        n=$("$TOOL" "$URL" ls "$1" | awk -v size="$3" '$1 == size' | wc -l)
        ((n >= $2)) && return 0
        ((SECONDS < deadline)) || die "$TOOL_NAME: only $n of $2 objects below $1 after $WAIT_TIMEOUT s"
        sleep 0.2
    done
}

# Waits until $2 objects whose names do not end in "/" (directory markers) exist below prefix $1.
wait_names() {
    local deadline=$((SECONDS + WAIT_TIMEOUT)) n
    while :; do
        n=$("$TOOL" "$URL" ls "$1" | awk '$NF !~ /\/$/' | wc -l)
        ((n >= $2)) && return 0
        ((SECONDS < deadline)) || die "$TOOL_NAME: only $n of $2 objects below $1 after $WAIT_TIMEOUT s"
        sleep 0.2
    done
}

remove_writes() {
    "$TOOL" "$URL" rm-prefix w- >/dev/null
    "$TOOL" "$URL" rm-prefix .cssp-parts/ >/dev/null # csspfs's multipart parts
    if "$TOOL" "$SEGMENTS_URL" head >/dev/null 2>&1; then
        "$TOOL" "$SEGMENTS_URL" rm-prefix "" >/dev/null
    fi
}

ls_many() { # prints the seconds of one ls -l of seed/many through the mount
    local t n
    t=$(now)
    n=$(ls -l "$MNT/seed/many" | wc -l)
    t=$(since "$t")
    ((n == MANY + 1)) || die "$TOOL_NAME: ls -l of seed/many printed $n lines, expected $((MANY + 1))"
    echo "$t"
}

# --- the workloads through a mount ---

workload_read() {
    local s
    mount_fresh
    s=$(dd_gib "$MNT/seed/big-1g" /dev/null)
    record read_cold "$(per_second 1073.741824 "$s")"
    s=$(dd_gib "$MNT/seed/big-1g" /dev/null)
    record read_warm "$(per_second 1073.741824 "$s")"
    unmount_it
}

workload_fio() {
    local json=$OUT/logs/fio-$TOOL_NAME.json iops
    mount_fresh
    fio --name=randread --filename="$MNT/seed/big-1g" --readonly --rw=randread --bs=4k \
        --ioengine=psync --direct=0 --invalidate=0 --numjobs=4 --group_reporting \
        --time_based --runtime="$FIO_SECONDS" --output-format=json --output="$json" \
        >>"$OUT/logs/fio.log" 2>&1 || die "$TOOL_NAME: fio failed; see $OUT/logs/fio.log"
    iops=$(/usr/bin/python3 -c '
import json, sys
job = json.load(open(sys.argv[1]))["jobs"][0]
if job["error"]:
    sys.exit("fio error %d" % job["error"])
print(job["read"]["iops"])' "$json") || die "$TOOL_NAME: no IOPS in $json"
    record fio "$iops"
    unmount_it
}

workload_write() {
    local s t
    mount_fresh
    mkdir -p "$MNT/w-$TOOL_NAME"
    t=$(now)
    dd_gib "$SRC_1G" "$MNT/w-$TOOL_NAME/big-1g" >/dev/null
    wait_object "w-$TOOL_NAME/big-1g" "$GIB"
    s=$(since "$t")
    record write "$(per_second 1073.741824 "$s")"
    unmount_it
    remove_writes
}

workload_create() {
    local t
    mount_fresh
    mkdir -p "$MNT/w-$TOOL_NAME"
    t=$(now)
    cp -r "$SRC_SMALL" "$MNT/w-$TOOL_NAME/create"
    record create_return "$(per_second 1000 "$(since "$t")")"
    wait_objects "w-$TOOL_NAME/create/" 1000 4096
    record create "$(per_second 1000 "$(since "$t")")"
    unmount_it
    remove_writes
}

workload_creates4() {
    local prefix=w-$TOOL_NAME/creates4 agent t offset pids=() pid failed=0
    agent=$(user_agent)
    mount_fresh
    mkdir -p "$MNT/$prefix"
    offset=$(access_log_size)
    t=$(now)
    for p in 1 2 3 4; do
        (for i in $(seq 1000); do : >"$MNT/$prefix/p$p-$i" || exit 1; done) &
        pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
    if ((failed)); then
        # A tool that refused a create has no rate to show: say so instead of a number.
        note "WARNING: $TOOL_NAME: a creating process failed; creates4 not recorded"
    else
        record creates4 "$(per_second 4000 "$(since "$t")")"
        wait_names "$prefix/" 4000
        record creates4_stored "$(per_second 4000 "$(since "$t")")"
        record creates4_listings "$(listings_since "$offset" "$agent")"
    fi
    unmount_it
    remove_writes
}

workload_ls() {
    local s
    mount_fresh
    s=$(ls_many)
    record ls_cold "$s"
    s=$(ls_many)
    record ls_warm "$s"
    unmount_it
}

# Writes the rsync tree $1 through the tool under test unless the server holds it already
# (untimed; kept for later runs). Fails (after a warning) when the tool did not store it all
# within WAIT_TIMEOUT: the workloads that need it are then not recorded for that tool.
seed_rsync_tree() {
    if [[ $("$TOOL" "$URL" ls "$1/" | awk '$1 == 4096' | wc -l) != 1000 ]]; then
        note "$TOOL_NAME: first rsync into $1/ (untimed; kept for later runs)"
        mount_fresh
        rsync -a "$SRC_SMALL/" "$MNT/$1/" || true
        if ! (wait_objects "$1/" 1000 4096); then
            note "WARNING: $TOOL_NAME did not store the rsync tree $1/; its rsync and find rows are left out"
            unmount_it
            return 1
        fi
        unmount_it
    fi
}

# The rsync tree of the tool under test: one per peer, and one per API for csspfs and rclone
# (over S3 a listing shows no attributes: the re-run finds what HEADs say).
rsync_tree() {
    case $TOOL_NAME in *-s3*) echo "rsync-${TOOL_NAME%%-*}-s3" ;; *) echo "rsync-${TOOL_NAME%%-*}" ;; esac
}

workload_rsync() {
    local tree
    tree=$(rsync_tree)
    seed_rsync_tree "$tree" || return 0
    mount_fresh
    rsync_rerun "$tree" rsync
    unmount_it keep
    # Again after a remount that keeps the cache directory, as a user's next run finds it
    # (csspfs's metadata index; each peer's own cache).
    mount_again
    rsync_rerun "$tree" rsync_remount
    unmount_it
}

# One timed rsync -a of the 1000-file source onto tree $1, recorded as metric $2 (and what it
# sent as $2_sent, which must be 0).
rsync_rerun() {
    local t out s sent
    t=$(now)
    out=$(rsync -a --stats "$SRC_SMALL/" "$MNT/$1/")
    s=$(since "$t")
    sent=$(awk -F': ' '/^Number of regular files transferred/ { print $2 }' <<<"$out")
    [[ -n $sent ]] || die "$TOOL_NAME: no transfer count in rsync --stats"
    record "$2" "$s"
    record "$2_sent" "$sent"
    ((sent == 0)) || note "WARNING: $TOOL_NAME: the rsync re-run sent $sent unchanged files again"
}

# The requests in the server's access log after byte $1 whose User-Agent starts with $2.
requests_since() {
    tail -c +$(($1 + 1)) "$CSSP_SERVER_LOG_DIR/proxy.log" | awk -v agent="$2" '$2 != "-" && index($10, agent) == 1' | wc -l
}
access_log_size() { stat -c %s "$CSSP_SERVER_LOG_DIR/proxy.log"; }
# The listing requests (GETs of the container itself) among those.
listings_since() {
    tail -c +$(($1 + 1)) "$CSSP_SERVER_LOG_DIR/proxy.log" |
        awk -v agent="$2" -v c="$CONTAINER" '$2 != "-" && index($10, agent) == 1 && $5 == "GET" && $6 ~ ("/" c "(%3F|$)")' | wc -l
}
# The HEAD requests among those.
heads_since() {
    tail -c +$(($1 + 1)) "$CSSP_SERVER_LOG_DIR/proxy.log" | awk -v agent="$2" '$2 != "-" && index($10, agent) == 1 && $5 == "HEAD"' | wc -l
}
# The User-Agent prefix of the tool under test.
user_agent() {
    case $TOOL_NAME in csspfs*) echo csspfs/ ;; rclone*) echo rclone/ ;; s3fs*) echo s3fs/ ;; esac
}

workload_rsync1() {
    local prefix=w-$TOOL_NAME/rsync1/ agent t offset n
    agent=$(user_agent)
    mount_fresh
    mkdir -p "$MNT/w-$TOOL_NAME"
    offset=$(access_log_size)
    t=$(now)
    rsync -a "$SRC_MIXED/" "$MNT/$prefix" || note "WARNING: $TOOL_NAME: rsync exited with $?"
    record rsync1_return "$(since "$t")"
    if wait_tree "$prefix" "$SRC_MIXED"; then
        record rsync1 "$(since "$t")"
    else
        record rsync1_incomplete 1
        note "WARNING: $TOOL_NAME: below $prefix the server does not hold the whole tree after $WAIT_TIMEOUT s"
    fi
    n=$(requests_since "$offset" "$agent")
    record rsync1_requests "$(awk -v n="$n" 'BEGIN { print n / 1000 }')"
    unmount_it
    remove_writes
}

workload_rmrf() {
    local prefix=w-$TOOL_NAME/rmrf t
    mount_fresh
    mkdir -p "$MNT/w-$TOOL_NAME"
    cp -r "$SRC_SMALL" "$MNT/$prefix"
    wait_objects "$prefix/" 1000 4096
    unmount_it
    mount_fresh
    t=$(now)
    rm -rf "${MNT:?}/$prefix"
    record rmrf_return "$(since "$t")"
    wait_gone "$prefix/"
    record rmrf "$(since "$t")"
    unmount_it
    remove_writes
}

# find of directory $1 of a fresh mount, recorded as $2; it must print $3 names.
timed_find() {
    local t n
    mount_fresh
    t=$(now)
    n=$(find "$MNT/$1" | wc -l)
    record "$2" "$(since "$t")"
    ((n == $3)) || die "$TOOL_NAME: find of $1 printed $n names, expected $3"
    unmount_it
}

workload_find() {
    local tree
    tree=$(rsync_tree)
    seed_rsync_tree "$tree" || return 0
    timed_find "$tree" find 1001
}

# A tree of 100 directories of 10 one-byte files each below seed/tree/, put through the API
# (no directory markers: the layout other tools leave), unless the server holds it already.
seed_find_tree() {
    [[ $("$TOOL" "$URL" ls seed/tree/ | wc -l) == 1000 ]] && return 0
    note "seeding seed/tree/ (100 directories of 10 files; kept for later runs)"
    local d
    for d in $(seq -w 0 99); do
        "$TOOL" "$URL" put-many "seed/tree/d$d/f" 10 1 10 >/dev/null
    done
}

workload_findtree() {
    local t
    seed_find_tree
    timed_find seed/tree findtree 1101
    mount_fresh
    t=$(now)
    du -s "$MNT/seed/tree" >/dev/null
    record dutree "$(since "$t")"
    unmount_it
}

# timed_walk METRIC CMD...: runs CMD (a walk through the mount) under WALK_LIMIT, its output in
# $WORK/walk.out, and records its seconds as METRIC; a walk the limit stopped is recorded as
# METRIC_over (shown as "> WALK_LIMIT s") and returns 1.
timed_walk() {
    local metric=$1 t status=0
    shift
    t=$(now)
    timeout "$WALK_LIMIT" "$@" >"$WORK/walk.out" 2>>"$OUT/logs/walk-$TOOL_NAME.log" || status=$?
    if ((status == 124)); then
        note "$TOOL_NAME: $metric stopped after $WALK_LIMIT s"
        record "${metric}_over" "$WALK_LIMIT"
        return 1
    fi
    ((status == 0)) || die "$TOOL_NAME: $metric: $* exited with $status; see $OUT/logs/walk-$TOOL_NAME.log"
    record "$metric" "$(since "$t")"
}

workload_walk() {
    local tree=$MNT/seed/huge-tree n sent
    mount_fresh
    if timed_walk walk_find find "$tree"; then
        n=$(wc -l <"$WORK/walk.out")
        ((n == 101001)) || die "$TOOL_NAME: find of seed/huge-tree printed $n names, expected 101001"
    fi
    unmount_it
    mount_fresh
    timed_walk walk_du du -s "$tree" || true
    unmount_it
    mount_fresh
    if timed_walk walk_rsync rsync -an --stats "$SRC_HUGE/" "$tree/"; then
        sent=$(awk -F': ' '/^Number of regular files transferred/ { print $2 }' "$WORK/walk.out")
        [[ $sent == 0 ]] || note "WARNING: $TOOL_NAME: the rsync dry run of seed/huge-tree would send ${sent:-?} files"
    fi
    unmount_it
}

workload_lshuge() {
    local dir=$MNT/seed/huge-flat agent offset n
    agent=$(user_agent)
    mount_fresh
    offset=$(access_log_size)
    if timed_walk lshuge_names ls "$dir"; then
        n=$(wc -l <"$WORK/walk.out")
        ((n == 200000)) || die "$TOOL_NAME: ls of seed/huge-flat printed $n names, expected 200000"
        record lshuge_heads "$(heads_since "$offset" "$agent")"
    fi
    unmount_it
    mount_fresh
    if timed_walk lshuge ls -l "$dir"; then
        n=$(wc -l <"$WORK/walk.out")
        ((n == 200001)) || die "$TOOL_NAME: ls -l of seed/huge-flat printed $n lines, expected 200001"
    fi
    unmount_it
}

# passes METRIC CHECK CMD...: CMD (a walk) on a fresh mount, recorded as METRIC, and again after
# a remount that keeps the cache directory, as METRIC_again, with the HEADs each sent
# (METRIC_heads, METRIC_again_heads); CHECK METRIC runs after each walk that finished.
passes() {
    local metric=$1 check=$2 pass offset agent
    shift 2
    agent=$(user_agent)
    for pass in "" _again; do
        if [[ -z $pass ]]; then mount_fresh; else mount_again; fi
        offset=$(access_log_size)
        if timed_walk "$metric$pass" "$@"; then "$check" "$metric$pass"; fi
        record "$metric${pass}_heads" "$(heads_since "$offset" "$agent")"
        unmount_it keep
    done
    rm -rf "$CACHE"
}

# CHECKs of passes: what rsync -an would send; the lines of ls -l of the flat directory.
rsync_sent() { record "$1_sent" "$(awk -F': ' '/^Number of regular files transferred/ { gsub(",", "", $2); print $2 }' "$WORK/walk.out")"; }
flat_lines() {
    local n
    n=$(wc -l <"$WORK/walk.out")
    ((n == 200001)) || die "$TOOL_NAME: ls -l of seed/foreign-flat printed $n lines, expected 200001"
}

# once METRIC LINES CMD...: CMD (a walk) on a fresh mount, recorded as METRIC, which must
# print LINES lines, and the HEADs it sent (METRIC_heads).
once() {
    local metric=$1 lines=$2 offset n
    shift 2
    mount_fresh
    offset=$(access_log_size)
    if timed_walk "$metric" "$@"; then
        n=$(wc -l <"$WORK/walk.out")
        ((n == lines)) || die "$TOOL_NAME: $* printed $n lines, expected $lines"
    fi
    record "${metric}_heads" "$(heads_since "$offset" "$(user_agent)")"
    unmount_it
}

# fwalk: the walk over objects other tools wrote (issue 38): find on a fresh mount, then du -s
# and rsync -an each on a fresh mount and again after a remount that keeps the cache directory.
workload_fwalk() {
    local tree=$MNT/seed/foreign-tree
    once fwalk_find 101001 find "$tree"
    passes fwalk_du : du -s "$tree"
    passes fwalk_rsync rsync_sent rsync -an --stats "$SRC_FOREIGN/" "$tree/"
}

# flshuge: lshuge over objects other tools wrote, and ls -l again after a remount.
workload_flshuge() {
    once flshuge_names 200000 ls "$MNT/seed/foreign-flat"
    passes flshuge flat_lines ls -l "$MNT/seed/foreign-flat"
}

# Waits until reading $1 through the mount gives exactly the text $2, reading every 50 ms, for
# at most $3 seconds; false if it never did.
wait_text() {
    local deadline
    deadline=$(awk -v s="$3" -v n="$(now)" 'BEGIN { printf "%.3f", n + s }')
    while :; do
        [[ "$(cat "$1" 2>/dev/null)" == "$2" ]] && return 0
        awk -v d="$deadline" -v n="$(now)" 'BEGIN { exit !(n > d) }' && return 1
        sleep 0.05
    done
}

# Issue 22: another client (the CSSP API) rewrites a file that a reader of the mount reads every
# 50 ms. Records the seconds from the PUT's answer to the first read of the new bytes, for
# VIS_CHANGES changes (median and p99; one not seen within VIS_LIMIT s counts as VIS_LIMIT and
# as missed, and a tool that misses 3 in a row stops there), then the daemon's requests a second
# while the mount is idle for VIS_IDLE s.
workload_visibility() {
    local key=w-$TOOL_NAME/visible/file agent offset i t missed=0 row=0 n
    local times=()
    agent=$(user_agent)
    mount_fresh
    mkdir -p "$MNT/w-$TOOL_NAME/visible"
    "$TOOL" "$URL" put-bytes "$key" "version 0" >/dev/null
    if ! wait_text "$MNT/$key" "version 0" 60; then
        note "WARNING: $TOOL_NAME: $key never showed in the mount"
        unmount_it
        return
    fi
    for i in $(seq "$VIS_CHANGES"); do
        "$TOOL" "$URL" put-bytes "$key" "version $i" >/dev/null
        t=$(now)
        if wait_text "$MNT/$key" "version $i" "$VIS_LIMIT"; then
            times+=("$(since "$t")")
            row=0
        else
            times+=("$VIS_LIMIT")
            missed=$((missed + 1))
            row=$((row + 1))
            ((row < 3)) || break
        fi
    done
    read -r n p50 p99 < <(printf '%s\n' "${times[@]}" | sort -n |
        awk '{ a[NR] = $1 } END { print NR, a[int((NR + 1) / 2)], a[int(NR * 0.99 + 0.999)] }')
    record visible_median "$p50"
    record visible_p99 "$p99"
    record visible_missed "$missed"
    offset=$(access_log_size)
    sleep "$VIS_IDLE"
    record idle_rps "$(per_second "$(requests_since "$offset" "$agent")" "$VIS_IDLE")"
    unmount_it
    "$TOOL" "$URL" rm "$key" >/dev/null 2>&1 || true
}

# Waits until the server lists nothing below prefix $1 (directory markers included).
wait_gone() {
    local deadline=$((SECONDS + WAIT_TIMEOUT)) n
    while :; do
        n=$("$TOOL" "$URL" ls "$1" | wc -l)
        ((n == 0)) && return 0
        ((SECONDS < deadline)) || die "$TOOL_NAME: $n objects still below $1 after $WAIT_TIMEOUT s"
        sleep 0.05
    done
}

# Waits until every file of local tree $2 is stored below prefix $1 with its size (and no
# other object is: rsync's temporary names must be gone).
wait_tree() {
    local deadline=$((SECONDS + WAIT_TIMEOUT)) want have
    want=$(cd "$2" && find . -type f -printf '%P %s\n' | sort)
    while :; do
        have=$("$TOOL" "$URL" ls "$1" | awk -v p="$1" '{ n = substr($NF, length(p) + 1) } n != "" && n !~ /\/$/ { print n, $1 }' | sort)
        [[ $have == "$want" ]] && return 0
        ((SECONDS < deadline)) || return 1
        sleep 0.2
    done
}

# --- the ceiling: the same requests without a filesystem ---

ceiling_run() {
    local t s code n metric
    if wants read; then
        drop_caches
        for metric in read_cold read_warm; do
            t=$(now)
            code=$("$REPO/scripts/cssp-curl" -s -o /dev/null -w '%{http_code} %{size_download}' "$URL/seed/big-1g")
            s=$(since "$t")
            [[ $code == "200 $GIB" ]] || die "ceiling: GET seed/big-1g: $code"
            record "$metric" "$(per_second 1073.741824 "$s")"
        done
        drop_caches
        local quarter=$((GIB / 4)) i pids=()
        t=$(now)
        for i in 0 1 2 3; do
            "$REPO/scripts/cssp-curl" -s -o /dev/null -w '%{http_code} %{size_download}\n' \
                -r "$((i * quarter))-$(((i + 1) * quarter - 1))" "$URL/seed/big-1g" >"$WORK/part$i" &
            pids+=($!)
        done
        wait "${pids[@]}"
        s=$(since "$t")
        for i in 0 1 2 3; do
            [[ $(cat "$WORK/part$i") == "206 $quarter" ]] || die "ceiling: ranged GET $i of seed/big-1g: $(cat "$WORK/part$i")"
        done
        record read_cold_parallel "$(per_second 1073.741824 "$s")"
    fi
    if wants write; then
        t=$(now)
        code=$("$REPO/scripts/cssp-curl" -s -o /dev/null -w '%{http_code}' -T "$SRC_1G" "$URL/w-ceiling/big-1g")
        s=$(since "$t")
        [[ $code == 201 ]] || die "ceiling: PUT w-ceiling/big-1g: $code"
        wait_object w-ceiling/big-1g "$GIB"
        record write "$(per_second 1073.741824 "$s")"
        remove_writes
    fi
    if wants create; then # serial PUTs, as cp makes them
        t=$(now)
        "$TOOL" "$URL" put-many w-ceiling/create/f 1000 4096 1 >/dev/null
        record create "$(per_second 1000 "$(since "$t")")"
        remove_writes
    fi
    if wants walk; then
        t=$(now)
        n=$("$TOOL" "$URL" ls seed/huge-tree/ | wc -l)
        s=$(since "$t")
        ((n == 100000)) || die "ceiling: listed $n objects below seed/huge-tree/"
        for metric in walk_find walk_du walk_rsync; do record "$metric" "$s"; done
    fi
    if wants fwalk; then
        t=$(now)
        n=$("$TOOL" "$URL" ls seed/foreign-tree/ | wc -l)
        s=$(since "$t")
        ((n == 100000)) || die "ceiling: listed $n objects below seed/foreign-tree/"
        for metric in fwalk_find fwalk_du fwalk_rsync fwalk_du_again fwalk_rsync_again; do record "$metric" "$s"; done
    fi
    if wants flshuge; then
        t=$(now)
        n=$("$TOOL" "$URL" ls seed/foreign-flat/ / | wc -l)
        s=$(since "$t")
        ((n == 200000)) || die "ceiling: listed $n objects below seed/foreign-flat/"
        for metric in flshuge_names flshuge flshuge_again; do record "$metric" "$s"; done
    fi
    if wants fwalk || wants flshuge; then
        record head_rate "$("$TOOL" "$URL" head-many seed/foreign-flat/ 20000 16 | awk '{ print $(NF - 2) }')"
    fi
    if wants lshuge; then
        t=$(now)
        n=$("$TOOL" "$URL" ls seed/huge-flat/ / | wc -l)
        s=$(since "$t")
        ((n == 200000)) || die "ceiling: listed $n objects below seed/huge-flat/"
        for metric in lshuge_names lshuge; do record "$metric" "$s"; done
    fi
    if wants ls; then
        for metric in ls_cold ls_warm; do
            t=$(now)
            n=$("$TOOL" "$URL" ls seed/many/ / | wc -l)
            record "$metric" "$(since "$t")"
            ((n == MANY)) || die "ceiling: listed $n objects below seed/many/"
        done
    fi
}

# --- seeds and sources ---

if wants read || wants fio; then
    if ! "$TOOL" "$URL" stat seed/big-1g 2>/dev/null | grep -q "^size $GIB "; then
        note "seeding seed/big-1g"
        head -c "$GIB" /dev/urandom >"$WORK/seed-1g"
        "$TOOL" "$URL" put seed/big-1g "$WORK/seed-1g" >/dev/null
        rm -f "$WORK/seed-1g"
    fi
fi
if wants ls && [[ $("$TOOL" "$URL" ls seed/many/ | wc -l) != "$MANY" ]]; then
    note "seeding $MANY objects below seed/many/ (a few minutes; kept for later runs)"
    "$TOOL" "$URL" rm-prefix seed/many/ >/dev/null
    "$TOOL" "$URL" put-many seed/many/obj- "$MANY" 1 16 >/dev/null
fi
wants walk && "$REPO/bench/seed-huge.sh" "$URL" tree
wants lshuge && "$REPO/bench/seed-huge.sh" "$URL" flat
wants fwalk && "$REPO/bench/seed-huge.sh" "$URL" foreign-tree
wants flshuge && "$REPO/bench/seed-huge.sh" "$URL" foreign-flat
# local_tree DIR BODY: the tree seed-huge.sh stores below seed/huge-tree/ or
# seed/foreign-tree/, as local files (BODY: the bytes of each, a Python expression; mode 0644,
# mtime 1700000000), for rsync to compare with.
local_tree() {
    /usr/bin/python3 - "$1" "$2" <<'PY'
import os, sys
root, body = sys.argv[1], eval(sys.argv[2])
for d in range(1000):
    directory = os.path.join(root, "d%03d" % d)
    os.makedirs(directory)
    for f in range(100):
        path = os.path.join(directory, "f%08d" % f)
        with open(path, "wb") as out:
            out.write(body)
        os.chmod(path, 0o644)
        os.utime(path, (1700000000, 1700000000))
PY
}
SRC_HUGE=$WORK/huge
SRC_FOREIGN=$WORK/foreign
if wants walk; then local_tree "$SRC_HUGE" 'b"x"'; fi
if wants fwalk; then local_tree "$SRC_FOREIGN" 'bytes(range(64))'; fi
SRC_1G=$WORK/src-1g
if wants write; then
    head -c "$GIB" /dev/urandom >"$SRC_1G"
fi
SRC_SMALL=$WORK/small
SRC_MIXED=$WORK/mixed
if wants rsync1; then # 1000 files, 1 KiB to 256 KiB
    /usr/bin/python3 - "$SRC_MIXED" <<'PY'
import os, random, sys
root = sys.argv[1]
os.makedirs(root)
sizes = random.Random(1)
for i in range(1000):
    path = os.path.join(root, "m%04d" % i)
    with open(path, "wb") as f:
        f.write(os.urandom(sizes.randint(1024, 256 * 1024)))
    os.chmod(path, 0o644)
PY
fi
if wants create || wants rsync || wants rmrf || wants find; then
    # Deterministic content and mtimes (subtlety 3).
    /usr/bin/python3 - "$SRC_SMALL" <<'PY'
import os, random, sys
root = sys.argv[1]
os.makedirs(root)
for i in range(1000):
    path = os.path.join(root, "f%04d" % i)
    with open(path, "wb") as f:
        f.write(random.Random(i).randbytes(4096))
    os.utime(path, (1700000000, 1700000000))
os.utime(root, (1700000000, 1700000000))
PY
fi
remove_writes

started=$SECONDS
for run in $(seq "$RUNS"); do
    for TOOL_NAME in $TOOLS; do
        note "run $run/$RUNS: $TOOL_NAME ($((SECONDS - started)) s so far)"
        if [[ $TOOL_NAME == ceiling ]]; then
            ceiling_run
            continue
        fi
        for w in $WORKLOADS; do
            "workload_$w"
        done
    done
done
note "measured in $((SECONDS - started)) s; raw values in $RESULTS, daemon logs in $OUT/logs"

/usr/bin/python3 - "$RESULTS" "$RUNS" $TOOLS <<'PY'
import os, statistics, sys
path, runs, tools = sys.argv[1], sys.argv[2], sys.argv[3:]
values = {}
for line in open(path):
    tool, metric, value = line.rstrip("\n").split("\t")
    values.setdefault((tool, metric), []).append(float(value))

# metric, label, higher is better
ROWS = [
    ("read_cold", "seq read 1 GiB, cold, MB/s", True),
    ("read_cold_parallel", "  the same, 4 parallel ranged GETs, MB/s", True),
    ("read_warm", "seq read 1 GiB, warm (same mount), MB/s", True),
    ("fio", "4 KiB random read, fio 4 jobs, IOPS", True),
    ("write", "seq write 1 GiB until stored, MB/s", True),
    ("create_return", "create 1000 x 4 KiB (cp -r), return, files/s", True),
    ("create", "  the same, until stored, files/s", True),
    ("creates4", "4 procs x 1000 empty creates, return, files/s", True),
    ("creates4_stored", "  the same, until stored, files/s", True),
    ("creates4_listings", "  listing requests meanwhile", False),
    ("ls_cold", "ls -l 10 000 entries, fresh mount, s", False),
    ("ls_warm", "ls -l 10 000 entries, same mount, s", False),
    ("rsync", "rsync -a re-run, 1000 unchanged files, s", False),
    ("rsync_remount", "  the same after a remount keeping the cache, s", False),
    ("rsync1_return", "rsync -a first run, 1000 files, return, s", False),
    ("rsync1", "  the same, until stored, s", False),
    ("rsync1_requests", "  HTTP requests per file in that run", False),
    ("rmrf_return", "rm -rf of 1000 files, return, s", False),
    ("rmrf", "  the same, until the server lists none, s", False),
    ("find", "find of 1000 files, fresh mount, s", False),
    ("findtree", "find of 100 dirs x 10 files, fresh mount, s", False),
    ("dutree", "du -s of the same, fresh mount, s", False),
    ("walk_find", "find of 100 000 in 1 000 dirs, fresh mount, s", False),
    ("walk_du", "du -s of the same, fresh mount, s", False),
    ("walk_rsync", "rsync -an of the same (stats all), s", False),
    ("lshuge_names", "ls of 200 000 in one dir, fresh mount, s", False),
    ("lshuge_heads", "  HEAD requests during it", False),
    ("lshuge", "ls -l of the same, fresh mount, s", False),
    ("head_rate", "the server's HEADs a second, 16 at once", True),
    ("fwalk_find", "other tools' 100 000 in 1 000 dirs: find, s", False),
    ("fwalk_find_heads", "  HEAD requests during it", False),
    ("fwalk_du", "  du -s, fresh mount, s", False),
    ("fwalk_du_heads", "  HEAD requests during it", False),
    ("fwalk_du_again", "  du -s after a remount (same cache), s", False),
    ("fwalk_du_again_heads", "  HEAD requests during it", False),
    ("fwalk_rsync", "  rsync -an of the same files, fresh, s", False),
    ("fwalk_rsync_sent", "  files it would send", False),
    ("fwalk_rsync_heads", "  HEAD requests during it", False),
    ("fwalk_rsync_again", "  rsync -an after a remount, s", False),
    ("fwalk_rsync_again_sent", "  files it would send", False),
    ("fwalk_rsync_again_heads", "  HEAD requests during it", False),
    ("flshuge_names", "other tools' 200 000 in one dir: ls, s", False),
    ("flshuge_names_heads", "  HEAD requests during it", False),
    ("flshuge", "  ls -l, fresh mount, s", False),
    ("flshuge_heads", "  HEAD requests during it", False),
    ("flshuge_again", "  ls -l after a remount (same cache), s", False),
    ("flshuge_again_heads", "  HEAD requests during it", False),
    ("visible_median", "another client's PUT to new bytes read, median, s", False),
    ("visible_p99", "  the same, p99, s", False),
    ("visible_missed", "  changes not seen within VIS_LIMIT s", False),
    ("idle_rps", "requests a second of the idle mount", False),
    ("mount", "mount command to first ls, s", False),
    ("rss", "peak RSS of the daemon (VmHWM), MiB", False),
]
MINE = [t for t in tools if t.startswith("csspfs")]
PEERS = [t for t in tools if t != "ceiling" and t not in MINE]

def summary(tool, metric):
    # A tool that never stored the whole tree has no rsync1 time, and its request count is
    # not one of a finished run.
    if metric == "rsync1_requests" and values.get((tool, "rsync1_incomplete")):
        return None
    v = values.get((tool, metric))
    if not v:
        return None
    return max(v) if metric == "rss" else statistics.median_low(sorted(v))

LIMIT = float(os.environ.get("WALK_LIMIT", "600"))

def over(tool, metric):
    # A walk stopped at the time limit in any run: its time is "more than the limit".
    return bool(values.get((tool, metric + "_over")))

def fmt(x):
    if x is None:
        return "-"
    if x >= 100:
        return "%.0f" % x
    if x >= 10:
        return "%.1f" % x
    if x >= 1:
        return "%.2f" % x
    return "%.3f" % x

width = 44
show_ratio = bool(MINE and PEERS)
latency = os.environ.get("LATENCY_MS", "0")
if latency != "0":
    print("every request (every tool, listings included) waited %s ms before its answer" % latency)
print("%-*s" % (width, "workload (median of %s; RSS: max)" % runs)
      + "".join("%15s" % t for t in tools)
      + ("".join("%15s" % (m + "/best") for m in MINE) if show_ratio else ""))
for metric, label, higher in ROWS:
    cells = [summary(t, metric) for t in tools]
    if all(c is None and not over(t, metric) for t, c in zip(tools, cells)):
        continue
    line = "%-*s" % (width, label) + "".join(
        "%15s" % ("> %.0f" % LIMIT if over(t, metric) else fmt(c)) for t, c in zip(tools, cells))
    if show_ratio:
        # A peer stopped at the limit counts as the limit: the ratio is then an upper bound.
        stopped = [t for t in PEERS if over(t, metric)]
        peers = [LIMIT if t in stopped else summary(t, metric) for t in PEERS]
        peers = [p for p in peers if p is not None]
        for m in MINE:
            mine = summary(m, metric)
            if mine is None or over(m, metric) or not peers:
                line += "%15s" % "-"
            else:
                best = max(peers) if higher else min(peers)
                bound = "<" if stopped and best == LIMIT else ""
                line += "%15s" % (bound + "%.3g" % (mine / best) if best else "-")
    print(line)
if show_ratio:
    print("csspfs/best: csspfs (csspfs-wb: with -o writeback) divided by the best peer; above 1 is better for MB/s, IOPS and files/s,"
          " below 1 for s and MiB.")
for t in tools:
    if values.get((t, "rsync1_incomplete")):
        print("note: rsync -a first run on %s never stored the whole tree in %d of %s runs (its time is left out)"
              % (t, len(values[(t, "rsync1_incomplete")]), runs))
    sent = values.get((t, "rsync_sent"), [])
    if any(sent):
        print("note: the rsync re-run on %s sent %s unchanged files again (runs: %s)"
              % (t, int(max(sent)), ", ".join("%d" % s for s in sent)))
PY
