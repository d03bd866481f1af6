#!/usr/bin/env bash
# Seeds the big trees of the issue 21 and 38 benchmarks into a container, idempotently (what the
# server holds already is listed and not sent again), and kept between runs:
#   tree          seed/huge-tree/dNNN/fNNNNNNNN: 100 000 objects in 1 000 directories of 100
#   flat          seed/huge-flat/fNNNNNNNN: 200 000 objects in one directory
#   foreign-tree  seed/foreign-tree/dNNN/fNNNNNNNN: the tree, written as other tools write
#   foreign-flat  seed/foreign-flat/fNNNNNNNN: the flat directory, written as other tools write
# (eight digits, from 0)
# An object of tree and flat is one byte, "x", stored as csspfs stores a file (mode 0644, owner
# 0:0, mtime 1700000000): the attributes in the content type's cssp- parameters, which listings
# show, and in X-Object-Meta-Mtime/-Mode/-Uid/-Gid, which rclone and s3fs read.
# An object of the foreign variants is 64 bytes stored as python-swiftclient and rclone store a
# file: content type application/octet-stream and the mtime only in X-Object-Meta-Mtime
# (1700000000.000000), which no listing shows (issue 38).
# No directory markers in either (the layout other tools leave). Sent as tars of
# 5 000 files, 4 at once, through Swift's extract-archive when the server's /info offers
# bulk_upload (about 230 objects/s on the local server), else by PUTs, 16 at once.
#
#   bench/seed-huge.sh URL tree flat foreign-tree foreign-flat   (URL: the container, as mount.cssp takes it)
# Credentials as for cssp-curl ($CSSP_PASSWD_FILE). Prints nothing when everything is there.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[[ $# -ge 2 ]] || {
    echo "usage: $0 URL tree|flat|foreign-tree|foreign-flat..." >&2
    exit 2
}
exec /usr/bin/python3 - "$REPO" "$@" <<'PY'
import concurrent.futures, io, json, subprocess, sys, tarfile, urllib.parse

repo, url, kinds = sys.argv[1], sys.argv[2].rstrip("/"), sys.argv[3:]
curl = [repo + "/scripts/cssp-curl", "-fsS"]
MTIME = 1700000000
# kind -> (content type, metadata, body)
STYLES = {
    "own": ("application/octet-stream;cssp-mtime=%d.000000000;cssp-mode=0644;cssp-uid=0;cssp-gid=0" % MTIME,
            {"mtime": "%d.000000000" % MTIME, "mode": "0644", "uid": "0", "gid": "0"}, b"x"),
    "foreign": ("application/octet-stream", {"mtime": "%d.000000" % MTIME}, bytes(range(64))),
}

def names(kind):
    base = kind.split("-")[-1]
    top = "seed/foreign-" if kind.startswith("foreign-") else "seed/huge-"
    if base == "tree" and kind in ("tree", "foreign-tree"):
        return [top + "tree/d%03d/f%08d" % (d, f) for d in range(1000) for f in range(100)]
    if base == "flat" and kind in ("flat", "foreign-flat"):
        return [top + "flat/f%08d" % i for i in range(200000)]
    sys.exit("seed-huge: unknown tree %r (tree, flat, foreign-tree, foreign-flat)" % kind)

def listed(prefix, style):
    content_type, _, body = style
    found, marker = set(), ""
    while True:
        query = urllib.parse.urlencode({"prefix": prefix, "format": "json", "limit": 10000, "marker": marker})
        page = json.loads(subprocess.run(curl + [url + "?" + query], check=True, capture_output=True).stdout or b"[]")
        if not page:
            return found
        found.update(entry["name"] for entry in page if entry.get("bytes") == len(body) and entry.get("content_type") == content_type)
        marker = page[-1]["name"]

def bulk_upload():
    base = url.rsplit("/", 1)[0]
    try:
        info = json.loads(subprocess.run(["curl", "-fsS", base + "/info"], check=True, capture_output=True).stdout)
    except (subprocess.CalledProcessError, ValueError):
        return False
    return "bulk_upload" in info

def extract(prefix, batch, style):
    content_type, meta, body = style
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in batch:
            info = tarfile.TarInfo(name[len(prefix):])
            info.size, info.mtime, info.mode = len(body), MTIME, 0o644
            info.pax_headers = {"SCHILY.xattr.user.mime_type": content_type}
            info.pax_headers.update(("SCHILY.xattr.user.meta." + k, v) for k, v in meta.items())
            tar.addfile(info, io.BytesIO(body))
    answer = subprocess.run(
        curl + ["-H", "Accept: application/json", "-T", "-", url + "/" + urllib.parse.quote(prefix) + "?extract-archive=tar"],
        input=buf.getvalue(), check=True, capture_output=True).stdout
    result = json.loads(answer)
    if result.get("Errors") or result.get("Number Files Created") != len(batch):
        sys.exit("seed-huge: extract-archive below %s: %s" % (prefix, answer.decode()[:300]))

bulk = bulk_upload()
for kind in kinds:
    wanted = names(kind)
    style = STYLES["foreign" if kind.startswith("foreign-") else "own"]
    content_type, meta, body = style
    prefix = wanted[0].split("/")[0] + "/" + wanted[0].split("/")[1] + "/"
    have = listed(prefix, style)
    missing = [n for n in wanted if n not in have]
    if not missing:
        continue
    print("seed-huge: %d of %d objects below %s to send (kept for later runs)" % (len(missing), len(wanted), prefix), file=sys.stderr)
    if bulk:
        batches = [missing[i:i + 5000] for i in range(0, len(missing), 5000)]
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            for done in pool.map(lambda b: extract(prefix, b, style), batches):
                pass
    else:
        # One PUT each, 16 at once (minutes more; servers without the bulk middleware are rare).
        headers = ["-H", "Content-Type: " + content_type] + [x for k, v in meta.items() for x in ("-H", "X-Object-Meta-%s: %s" % (k.capitalize(), v))]
        def put(name):
            subprocess.run(curl + headers + ["-o", "/dev/null", "-T", "-", url + "/" + urllib.parse.quote(name)],
                           input=body, check=True, capture_output=True)
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            for done in pool.map(put, missing):
                pass
    now = listed(prefix, style)
    left = [n for n in wanted if n not in now]
    if left:
        sys.exit("seed-huge: %d objects below %s still missing after seeding (first: %s)" % (len(left), prefix, left[0]))
PY
