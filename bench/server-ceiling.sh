#!/usr/bin/env bash
# What the local server itself can do, with no filesystem in the way (a benchmark, not a test):
# the ceilings that bound the compare.sh "until stored" and "until the server lists none" rows.
#   - 1000 x 4 KiB objects by parallel PUTs (cssp-tool put-many, 16 at once), objects/s
#   - HEADs of those 1000, 16 and 8 at once (cssp-tool head-many), HEADs/s: what bounds a walk
#     that needs one HEAD per object (issue 38: other tools' objects with foreign_attrs=head)
#   - the same 1000 files as one extract-archive tar, and as 4 tars of 250 sent at once, objects/s
#   - 1000 keys deleted by one bulk delete, and by 4 bulk deletes of 250 at once, s
# Extract-archive and bulk delete go through Swift's bulk middleware with the peers' tempauth
# account (CSSP_PEER_*), so that plain curl can send them; the middleware is the same.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=bench/common.sh
. "$REPO/bench/common.sh"
WORK=$(mktemp -d /tmp/cssp-bench-ceiling-XXXX)
trap 'rm -rf "$WORK"' EXIT

answer=$(curl -fsS -i -H "X-Auth-User: $CSSP_PEER_USER" -H "X-Auth-Key: $CSSP_PEER_KEY" "$CSSP_PEER_AUTH_URL" | tr -d '\r')
ACCOUNT=$(awk '/^X-Storage-Url:/ {print $2}' <<<"$answer")
TOKEN=$(awk '/^X-Auth-Token:/ {print $2}' <<<"$answer")
CONTAINER=bench-ceiling
curl -fsS -o /dev/null -X PUT -H "X-Auth-Token: $TOKEN" "$ACCOUNT/$CONTAINER"

for k in 0 1 2 3; do
    mkdir -p "$WORK/part$k/d"
    for i in $(seq $((k * 250 + 1)) $((k * 250 + 250))); do head -c 4096 /dev/urandom >"$WORK/part$k/d/f$i"; done
    tar -cf "$WORK/part$k.tar" -C "$WORK/part$k" d
done
mkdir -p "$WORK/all/d" && cp "$WORK"/part?/d/* "$WORK/all/d/" && tar -cf "$WORK/all.tar" -C "$WORK/all" d

# extract PREFIX TAR: one extract-archive request; fails unless all of its files were made.
extract() {
    curl -fsS -X PUT -H "X-Auth-Token: $TOKEN" -H "Accept: application/json" -T "$2" \
        "$ACCOUNT/$CONTAINER/$1?extract-archive=tar" | grep -q '"Errors": \[\]'
}
# bulk_delete PREFIX FIRST COUNT: one bulk delete of PREFIX/d/fFIRST... (COUNT keys).
bulk_delete() {
    seq "$2" $(($2 + $3 - 1)) | sed "s|^|$CONTAINER/$1/d/f|" |
        curl -fsS -X POST -H "X-Auth-Token: $TOKEN" -H "Content-Type: text/plain" -H "Accept: application/json" \
            --data-binary @- "$ACCOUNT?bulk-delete" | grep -q '"Number Deleted": '"$3"
}

puts=() heads16=() heads8=() one=() four=() del1=() del4=()
for run in $(seq "$RUNS"); do
    t=$(now)
    "$TOOL" "$CSSP_SERVER_URL/$CONTAINER" put-many "p$run/" 1000 4096 16 >/dev/null
    puts+=("$(awk -v s="$(since "$t")" 'BEGIN {print 1000 / s}')")
    heads16+=("$("$TOOL" "$CSSP_SERVER_URL/$CONTAINER" head-many "p$run/" 1000 16 | awk '{ print $(NF - 2) }')")
    heads8+=("$("$TOOL" "$CSSP_SERVER_URL/$CONTAINER" head-many "p$run/" 1000 8 | awk '{ print $(NF - 2) }')")
    t=$(now)
    extract "a$run" "$WORK/all.tar"
    one+=("$(awk -v s="$(since "$t")" 'BEGIN {print 1000 / s}')")
    t=$(now)
    for k in 0 1 2 3; do extract "b$run" "$WORK/part$k.tar" & done
    wait
    four+=("$(awk -v s="$(since "$t")" 'BEGIN {print 1000 / s}')")
    t=$(now)
    bulk_delete "a$run" 1 1000
    del1+=("$(since "$t")")
    t=$(now)
    for k in 0 1 2 3; do bulk_delete "b$run" $((k * 250 + 1)) 250 & done
    wait
    del4+=("$(since "$t")")
    "$TOOL" "$CSSP_SERVER_URL/$CONTAINER" rm-prefix "p$run/" >/dev/null
done

header
row "1000 x 4 KiB by PUTs, 16 at once, objects/s" "${puts[@]}"
row "HEADs of those, 16 at once, HEADs/s" "${heads16[@]}"
row "HEADs of those, 8 at once, HEADs/s" "${heads8[@]}"
row "the same as one extract-archive tar, objects/s" "${one[@]}"
row "the same as 4 tars of 250 at once, objects/s" "${four[@]}"
row "1000 keys by one bulk delete, s" "${del1[@]}"
row "1000 keys by 4 bulk deletes of 250 at once, s" "${del4[@]}"
