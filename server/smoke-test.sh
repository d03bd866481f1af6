#!/usr/bin/env bash
#
# End-to-end check of the local CSSP test server through scripts/cssp-curl.
# Usage: server/smoke-test.sh   (after scripts/cssp-server start; honours
# CSSP_SERVER_DIR and CSSP_SERVER_PORT like cssp-server). Uses a fresh
# container smoke-<random>, deletes what it made, exits nonzero on the first
# failed check.

set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CURL=$REPO/scripts/cssp-curl
server_env=$("$REPO/scripts/cssp-server" env)
set -a
eval "$server_env"
set +a

TMP=$(mktemp -d)
CONTAINER=smoke-$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')
C=$CSSP_SERVER_URL/$CONTAINER
FAILURES=0
trap 'rm -rf "$TMP"; rm -f "$CSSP_SERVER_FAULT_FILE"' EXIT

check() {
    local what=$1 expected=$2 actual=$3
    if [[ $actual == "$expected" ]]; then
        echo "ok   $what"
    else
        echo "FAIL $what: expected '$expected', got '$actual'"
        FAILURES=$((FAILURES + 1))
    fi
}

status() {
    "$CURL" -s -o /dev/null -w '%{http_code}' "$@"
}

"$REPO/scripts/cssp-server" create-container "$CONTAINER" >/dev/null

echo 'hello world' >"$TMP/o1"
check "PUT with metadata" 201 "$(status -T "$TMP/o1" -H 'X-Object-Meta-Color: blue' \
    -H 'Content-Type: text/x-test' "$C/dir/o1")"
check "HEAD shows metadata" "X-Object-Meta-Color: blue" \
    "$("$CURL" -s -I "$C/dir/o1" | tr -d '\r' | grep -i '^x-object-meta-color')"
check "ranged GET status" 206 "$(status -H 'Range: bytes=0-4' "$C/dir/o1")"
check "ranged GET body" hello "$("$CURL" -s -H 'Range: bytes=0-4' "$C/dir/o1")"
check "unsatisfiable range" 416 "$(status -H 'Range: bytes=100-200' "$C/dir/o1")"
check "PUT with wrong ETag" 422 "$(status -T "$TMP/o1" -H 'ETag: 00000000000000000000000000000000' "$C/bad")"
check "PUT with right ETag" 201 "$(status -T "$TMP/o1" -H "ETag: $(md5sum <"$TMP/o1" | cut -d' ' -f1)" "$C/good")"

listing=$("$CURL" -s "$C?format=xml&delimiter=/&prefix=")
check "XML listing has subdir" 1 "$(grep -c '<subdir name="dir/"><name>dir/</name></subdir>' <<<"$listing")"
check "XML listing has object" 1 "$(grep -c '<object><name>good</name>' <<<"$listing")"

check "server-side copy" 201 "$(status -X PUT -H "X-Copy-From: /$CONTAINER/dir/o1" -H 'Content-Length: 0' "$C/copy")"
check "copy kept metadata" "X-Object-Meta-Color: blue" \
    "$("$CURL" -s -I "$C/copy" | tr -d '\r' | grep -i '^x-object-meta-color')"

head -c 1000 /dev/urandom >"$TMP/p1"
head -c 777 /dev/urandom >"$TMP/p2"
check "DLO part 1" 201 "$(status -T "$TMP/p1" "$C/big/u1/00000001")"
check "DLO part 2" 201 "$(status -T "$TMP/p2" "$C/big/u1/00000002")"
check "DLO manifest" 201 "$(status -X PUT -H "X-Object-Manifest: $CONTAINER/big/u1/" -H 'Content-Length: 0' "$C/big")"
check "DLO GET is the concatenation" "$(cat "$TMP/p1" "$TMP/p2" | md5sum)" "$("$CURL" -s "$C/big" | md5sum)"
check "DLO ranged GET across parts" "$(cat "$TMP/p1" "$TMP/p2" | tail -c +991 | head -c 20 | md5sum)" \
    "$("$CURL" -s -H 'Range: bytes=990-1009' "$C/big" | md5sum)"

odd=$(/usr/bin/python3 -c 'import urllib.parse; print(urllib.parse.quote("sp ace+plus%pct#hash?q \u00fc\u4e2d/x", safe="/+"))')
check "odd key PUT" 201 "$(status -T "$TMP/o1" "$C/$odd")"
check "odd key HEAD (+ as %2B)" 200 "$(status -I "$C/${odd//+/%2B}")"
check "odd key listed" 1 "$("$CURL" -s "$C?format=xml&prefix=sp" | grep -c '<name>sp ace+plus%pct#hash?q ü中/x</name>')"

meta=()
for i in $(seq 10); do
    meta+=(-H "X-Object-Meta-Field$i: $(head -c 150 /dev/zero | tr '\0' v)")
done
check "PUT with 10 metadata headers" 201 "$(status -T "$TMP/o1" "${meta[@]}" -H 'X-Object-Meta-Uni: grüße' "$C/meta10")"
check "all metadata back" 11 "$("$CURL" -s -I "$C/meta10" | grep -ci '^x-object-meta-')"

echo "$CSSP_TEST_ACCESS_KEY:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA" >"$TMP/badpw"
check "wrong secret" 403 "$(CSSP_PASSWD_FILE=$TMP/badpw status "$C/dir/o1")"
check "wrong secret code" 1 "$(CSSP_PASSWD_FILE=$TMP/badpw "$CURL" -s "$C/dir/o1" | grep -c '<Code>SignatureDoesNotMatch</Code>')"
check "unsigned request" 401 "$(curl -s -o /dev/null -w '%{http_code}' "$C/dir/o1")"
check "skewed Date" 1 "$(curl -s -H 'Date: Mon, 01 Jan 2001 00:00:00 GMT' \
    -H "Authorization: CSSP $CSSP_TEST_ACCESS_KEY:x" "$C/dir/o1" | grep -c RequestTimeTooSkewed)"
echo "$CSSP_TEST_ACCESS_KEY2:$CSSP_TEST_SECRET_KEY2" >"$TMP/pw2"
check "second account cannot see the container" 404 "$(CSSP_PASSWD_FILE=$TMP/pw2 status -I "$C")"

echo "PUT 503x1 /$CONTAINER/faulty" >"$CSSP_SERVER_FAULT_FILE"
check "injected fault" 503 "$(status -T "$TMP/o1" "$C/faulty")"
check "injected fault used up" 201 "$(status -T "$TMP/o1" "$C/faulty")"
rm -f "$CSSP_SERVER_FAULT_FILE"

for key in dir/o1 good copy big big/u1/00000001 big/u1/00000002 "$odd" meta10 faulty; do
    check "DELETE $key" 204 "$(status -X DELETE "$C/$key")"
done
check "DELETE absent" 404 "$(status -X DELETE "$C/good")"
check "DELETE container" 204 "$(status -X DELETE "$C")"

if ((FAILURES)); then
    echo "$FAILURES check(s) failed; logs in $CSSP_SERVER_LOG_DIR"
    exit 1
fi
echo "all checks passed"
