#!/usr/bin/python3
"""A Tencent COS front for the test server: checks COS signatures, speaks S3 behind.

csspfs's cos:// dialect is tested end to end through this front. It serves COS's XML API
(path-style: /BUCKET-APPID/KEY) on 127.0.0.1 and:

1. checks every request's ``Authorization`` the way COS documents its signature
   (q-sign-algorithm=sha1: SignKey = HMAC-SHA1(SecretKey, KeyTime); HttpString of the
   method, the decoded path, the signed parameters and headers; StringToSign =
   ``sha1\\nKeyTime\\nSHA1(HttpString)\\n``), refusing with 403 SignatureDoesNotMatch or
   AccessDenied otherwise. It also refuses a request that leaves ``host`` or an
   ``x-cos-`` header it sends out of the signature, and a KeyTime that is over or not
   yet begun;
2. turns COS's headers into S3's (``x-cos-meta-*``, ``x-cos-copy-source`` given as
   ``HOST/KEY``, ``x-cos-metadata-directive: Replaced``, ``x-cos-forbid-overwrite``)
   and forwards the request to the server's s3api, signed with AWS Signature V4 by the
   same key (UNSIGNED-PAYLOAD: bodies stream through);
3. turns the answer's ``x-amz-`` headers back into ``x-cos-`` ones.

Usage: cos_front.py CONFIG, an INI file with a [cos-front] section: ``bind_port``,
``upstream`` (http://127.0.0.1:PORT of the proxy), ``keys_file`` (``ACCESS_KEY:SECRET``
lines; the secret follows the last colon), ``region`` (what s3api signs for).
GET /healthcheck answers 200 unsigned.
"""

import configparser
import datetime
import hashlib
import hmac
import http.client
import http.server
import sys
import time
import urllib.parse

HOP_BY_HOP = {'connection', 'keep-alive', 'transfer-encoding', 'te', 'trailer', 'upgrade',
              'proxy-authorization', 'proxy-authenticate', 'host', 'authorization', 'expect'}


def encode(text):
    """COS's UrlEncode: every byte but RFC 3986's unreserved ones, upper-case hex."""
    return urllib.parse.quote(text, safe='-_.~')


def encoded_list(items):
    """``name=value&...`` (names encoded, lower-cased, sorted) and ``name;name``."""
    pairs = sorted((encode(name).lower(), encode(value)) for name, value in items)
    return '&'.join('%s=%s' % pair for pair in pairs), ';'.join(name for name, _ in pairs)


def query_items(raw_query):
    """The query's name/value pairs, decoded (``acl`` alone is ``acl=``)."""
    items = []
    for part in raw_query.split('&') if raw_query else []:
        name, _, value = part.partition('=')
        items.append((urllib.parse.unquote(name), urllib.parse.unquote(value)))
    return items


def cos_signature(secret, method, path, params, headers, key_time):
    """COS's q-signature of a request, as its documentation computes it."""
    sign_key = hmac.new(secret.encode(), key_time.encode(), hashlib.sha1).hexdigest()
    http_string = '%s\n%s\n%s\n%s\n' % (method.lower(), path, encoded_list(params)[0],
                                         encoded_list(headers)[0])
    string_to_sign = 'sha1\n%s\n%s\n' % (key_time, hashlib.sha1(http_string.encode()).hexdigest())
    return hmac.new(sign_key.encode(), string_to_sign.encode(), hashlib.sha1).hexdigest()


def sigv4_headers(access_key, secret, region, method, host, raw_path, raw_query, headers):
    """The headers that sign a request for s3api (AWS Signature V4, UNSIGNED-PAYLOAD)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    amz_date = now.strftime('%Y%m%dT%H%M%SZ')
    day = amz_date[:8]
    signed = dict((name.lower(), ' '.join(value.split())) for name, value in headers)
    signed['host'] = host
    signed['x-amz-date'] = amz_date
    signed['x-amz-content-sha256'] = 'UNSIGNED-PAYLOAD'
    names = sorted(signed)
    query = '&'.join(sorted('%s=%s' % (encode(n), encode(v)) for n, v in query_items(raw_query)))
    canonical = '\n'.join([method, raw_path, query,
                           ''.join('%s:%s\n' % (n, signed[n]) for n in names),
                           ';'.join(names), 'UNSIGNED-PAYLOAD'])
    scope = '%s/%s/s3/aws4_request' % (day, region)
    string_to_sign = 'AWS4-HMAC-SHA256\n%s\n%s\n%s' % (
        amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest())
    key = ('AWS4' + secret).encode()
    for part in (day, region, 's3', 'aws4_request'):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, string_to_sign.encode(), hashlib.sha256).hexdigest()
    authorization = 'AWS4-HMAC-SHA256 Credential=%s/%s, SignedHeaders=%s, Signature=%s' % (
        access_key, scope, ';'.join(names), signature)
    out = [(n, signed[n]) for n in ('x-amz-date', 'x-amz-content-sha256')]
    return out + [('Authorization', authorization)]


def to_s3(name, value):
    """A COS request header as s3api takes it (None: not sent on)."""
    lower = name.lower()
    if lower == 'x-cos-copy-source':
        # COS names the source BUCKET-APPID.cos.REGION.myqcloud.com/KEY; behind a path-style
        # endpoint csspfs sends HOST/BUCKET/KEY. s3api wants /BUCKET/KEY.
        rest = value.partition('/')[2]
        if '.myqcloud.com' in value.partition('/')[0]:
            rest = value.partition('.')[0] + '/' + rest
        return 'x-amz-copy-source', '/' + rest
    if lower == 'x-cos-metadata-directive':
        return 'x-amz-metadata-directive', {'replaced': 'REPLACE', 'copy': 'COPY'}.get(value.lower(), value)
    if lower == 'x-cos-forbid-overwrite':
        return ('if-none-match', '*') if value.lower() == 'true' else None
    if lower.startswith('x-cos-'):
        return 'x-amz-' + lower[len('x-cos-'):], value
    return name, value


def to_cos(name, value):
    lower = name.lower()
    if lower.startswith('x-amz-'):
        return 'x-cos-' + lower[len('x-amz-'):], value
    return name, value


def error_body(code, message):
    return ('<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>%s</Code><Message>%s</Message>'
            '</Error>' % (code, message)).encode()


class Front(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    keys = {}
    upstream = ('127.0.0.1', 8080)
    region = 'us-east-1'

    def log_message(self, fmt, *args):
        sys.stderr.write('cos-front: %s %s\n' % (self.address_string(), fmt % args))

    def refuse(self, status, code, message):
        body = error_body(code, message)
        self.send_response(status)
        self.send_header('Content-Type', 'application/xml')
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        if self.command != 'HEAD':
            self.wfile.write(body)

    def check_signature(self, raw_path, raw_query):
        """None when the request is signed as COS says, else (status, code, message)."""
        fields = dict(part.partition('=')[::2] for part in self.headers.get('Authorization', '').split('&'))
        if fields.get('q-sign-algorithm') != 'sha1':
            return 403, 'AccessDenied', 'no q-sign-algorithm=sha1 signature'
        secret = self.keys.get(fields.get('q-ak'))
        if secret is None:
            return 403, 'InvalidAccessKeyId', 'unknown q-ak'
        key_time = fields.get('q-key-time', '')
        if fields.get('q-sign-time') != key_time:
            return 403, 'AccessDenied', 'q-sign-time differs from q-key-time'
        try:
            start, end = (int(t) for t in key_time.split(';'))
        except ValueError:
            return 403, 'AccessDenied', 'bad q-key-time'
        now = time.time()
        if not start <= now <= end:
            return 403, 'RequestTimeTooSkewed', 'the signature is not valid now'
        header_names = [n for n in fields.get('q-header-list', '').split(';') if n]
        present = dict((n.lower(), v) for n, v in self.headers.items())
        if 'host' not in header_names:
            return 403, 'AccessDenied', 'host is not signed'
        for name in present:
            if name.startswith('x-cos-') and name not in header_names:
                return 403, 'AccessDenied', '%s is sent but not signed' % name
        missing = [n for n in header_names if n not in present]
        if missing:
            return 403, 'AccessDenied', 'signed headers not sent: %s' % ','.join(missing)
        params = query_items(raw_query)
        param_names = [n for n in fields.get('q-url-param-list', '').split(';') if n]
        if sorted(param_names) != sorted(encode(n).lower() for n, _ in params):
            return 403, 'AccessDenied', 'q-url-param-list does not name every parameter'
        path = urllib.parse.unquote(raw_path, errors='strict')
        expected = cos_signature(secret, self.command, path, params,
                                 [(n, present[n]) for n in header_names], key_time)
        if not hmac.compare_digest(expected, fields.get('q-signature', '')):
            return 403, 'SignatureDoesNotMatch', 'the q-signature is not the request\'s'
        return None

    def handle_any(self):
        raw_path, _, raw_query = self.path.partition('?')
        if raw_path == '/healthcheck' and self.command == 'GET':
            body = b'OK'
            self.send_response(200)
            self.send_header('Content-Length', '2')
            self.end_headers()
            self.wfile.write(body)
            return
        length = int(self.headers.get('Content-Length') or 0)
        if raw_path == '/info' and self.command in ('GET', 'HEAD'):
            # The server's limits (s3api's part limit), unsigned as Swift serves them.
            self.forward([], 0)
            return
        problem = self.check_signature(raw_path, raw_query)
        if problem is not None:
            self.rfile.read(length)
            self.refuse(*problem)
            return
        access_key = dict(part.partition('=')[::2] for part in self.headers['Authorization'].split('&'))['q-ak']
        headers = []
        for name, value in self.headers.items():
            if name.lower() in HOP_BY_HOP or name.lower() == 'date':
                continue
            mapped = to_s3(name, value)
            if mapped is not None:
                headers.append(mapped)
        host = '%s:%d' % self.upstream
        signing = [(n, v) for n, v in headers
                   if n.lower().startswith('x-amz-') or n.lower() in ('content-md5', 'content-type')]
        headers += sigv4_headers(access_key, self.keys[access_key], self.region, self.command, host,
                                 raw_path, raw_query, signing)
        self.forward(headers, length)

    def forward(self, headers, length):
        """Sends the request on with `headers`, and its answer back with COS's names."""
        host = '%s:%d' % self.upstream
        connection = http.client.HTTPConnection(*self.upstream, timeout=3600)
        try:
            connection.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            connection.putheader('Host', host)
            for name, value in headers:
                connection.putheader(name, value)
            connection.endheaders()
            remaining = length
            while remaining > 0:
                chunk = self.rfile.read(min(remaining, 1 << 20))
                if not chunk:
                    break
                connection.send(chunk)
                remaining -= len(chunk)
            answer = connection.getresponse()
            body_length = answer.getheader('Content-Length')
            self.send_response(answer.status, answer.reason)
            for name, value in answer.getheaders():
                if name.lower() in HOP_BY_HOP or name.lower() == 'content-length':
                    continue
                self.send_header(*to_cos(name, value))
            if self.command == 'HEAD' or answer.status in (204, 304):
                self.send_header('Content-Length', body_length or '0')
                self.end_headers()
                return
            if body_length is None:
                data = answer.read()
                self.send_header('Content-Length', str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            self.send_header('Content-Length', body_length)
            self.end_headers()
            while True:
                chunk = answer.read(1 << 20)
                if not chunk:
                    break
                self.wfile.write(chunk)
        finally:
            connection.close()

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = handle_any


def main(config_path):
    parser = configparser.ConfigParser()
    parser.read(config_path)
    section = parser['cos-front']
    keys = {}
    with open(section['keys_file']) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith('#'):
                access, _, secret = line.rpartition(':')
                keys[access] = secret
    upstream = urllib.parse.urlsplit(section['upstream'])
    Front.keys = keys
    Front.upstream = (upstream.hostname, upstream.port or 80)
    Front.region = section.get('region', 'us-east-1')
    server = http.server.ThreadingHTTPServer(('127.0.0.1', int(section['bind_port'])), Front)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == '__main__':
    main(sys.argv[1])
