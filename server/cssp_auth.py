"""CSSP request authentication for a local OpenStack Swift proxy (test server).

A CSSP endpoint is a container URL, ``http://HOST:PORT/<container>``, and every
request is signed (the CSSP protocol as its public SDK documents it):

    Authorization: CSSP <AccessKeyId>:base64(HMAC-SHA1(secret, StringToSign))
    StringToSign = METHOD \\n Content-MD5 \\n Content-Type \\n Date \\n
                   CanonicalizedMetaHeaders CanonicalizedResource

This middleware checks the signature, maps the access key to a Swift account
and rewrites ``/<container>[/<key>]`` to
``/v1/AUTH_<account>/<container>[/<key>]``. Pipeline position: after
catch_errors, gatekeeper, healthcheck and the first proxy-logging; before
listing_formats, copy and dlo, which only act on /v1 paths.

Things that are easy to get wrong here:

1. Bytes, not text. WSGI strings are latin-1 decoded bytes (PEP 3333), so every
   piece of the StringToSign is re-encoded with latin-1 to recover what the
   client sent; keys are UTF-8 and may hold non-ASCII, ``%``, ``+``, ``?``
   and ``#``.
2. The resource is PATH_INFO, which eventlet has already percent-decoded (a
   literal ``+`` stays a ``+``). The rewritten PATH_INFO keeps the same bytes.
3. Headers come from ``headers_raw`` (what the client really sent) when the
   server provides it: eventlet invents ``CONTENT_TYPE: text/plain`` for a
   request without Content-Type, and folds ``_`` into ``-`` in header names.
   Without ``headers_raw`` (unit tests, other servers) the environ is used.
4. Swift only authorizes through ``swift.authorize``; with no tempauth or
   keystone in the pipeline every request that reaches the proxy is allowed, so
   this middleware must answer every unauthenticated request itself. The key's
   owner is the account owner (``swift_owner``), so container ACL headers such
   as X-Container-Read are returned and accepted as on the real service.
   Sub-requests made by copy and dlo start below this middleware and inherit
   ``swift.authorize`` through make_env; it allows only the key's account.
5. Secrets and signatures never reach a log line; the StringToSign of a failed
   request does (at info level), because it is what a client author needs.
6. With ``pass_other_auth`` (off by default), a request that carries another
   scheme's credentials instead of a CSSP signature (see other_credentials)
   goes on unchanged, so that tempauth and s3api further down can serve the
   benchmark's peers (rclone, s3fs) on the same accounts. Those middlewares
   then must be in the pipeline: they, not this one, refuse bad tokens. A
   request with neither kind of credentials is still refused here.

7. ``GET /info`` (and HEAD) passes unauthenticated, as on stock Swift: it
   names no container, and says what the cluster offers (bulk delete and its
   limits), which clients ask before they sign anything.

Filter options: ``keys_file`` (lines ``ACCESS_KEY:SECRET:ACCOUNT``, ``#``
starts a comment; re-read when it changes), ``max_skew`` (seconds, default
900), ``fault_file`` (optional test hook, see parse_faults),
``pass_other_auth`` (boolean, default false; see point 6).
"""

import base64
import email.utils
import hmac
import hashlib
import os
import random
import threading
import time
from urllib.parse import quote

try:
    from eventlet import sleep as green_sleep
except ImportError:  # the unit tests run without eventlet
    green_sleep = time.sleep
from xml.sax.saxutils import escape

from swift.common.swob import (RESPONSE_REASONS, HTTPForbidden, Request,
                               Response)
from swift.common.utils import config_true_value, get_logger

XML_DECLARATION = '<?xml version="1.0" encoding="UTF-8"?>\n'
META_PREFIX = 'x-object-meta'
ACCOUNT_PREFIX = 'AUTH_'


class Credential(object):
    """One access key: its secret (bytes) and the Swift account it opens."""

    __slots__ = ('access_key', 'secret', 'account')

    def __init__(self, access_key, secret, account):
        self.access_key = access_key
        self.secret = secret
        self.account = account


def parse_keys(text):
    """Parse a keys file: ``ACCESS_KEY:SECRET:ACCOUNT`` per line.

    Returns a dict access key -> Credential. Raises ValueError on a bad line,
    so a typo shows up in the proxy log instead of as a mysterious AuthFailure.
    """
    keys = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith('#'):
            continue
        parts = line.split(':')
        if len(parts) != 3 or not all(parts):
            raise ValueError('line %d: expected ACCESS_KEY:SECRET:ACCOUNT'
                             % number)
        access_key, secret, account = parts
        keys[access_key] = Credential(access_key, secret.encode('utf-8'),
                                      account)
    return keys


class FileWatcher(object):
    """Re-parses a small file whenever its (mtime, size, inode) changes.

    ``parse`` turns the file text into a value; a missing file gives
    ``missing``. Thread-safe; parse errors propagate to the caller.
    """

    def __init__(self, path, parse, missing):
        self.path = path
        self._parse = parse
        self._missing = missing
        self._lock = threading.Lock()
        # protects the following
        self._stamp = None
        self._value = missing

    def get(self):
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None, self._missing
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        with self._lock:
            if stamp != self._stamp:
                with open(self.path, encoding='utf-8') as f:
                    self._value = self._parse(f.read())
                self._stamp = stamp
            return stamp, self._value


class FaultRule(object):
    __slots__ = ('method', 'status', 'times', 'path_part', 'retry_after',
                 'reset_after', 'stall', 'stall_after', 'drip', 'probability')

    def __init__(self, method, status, times, path_part, retry_after=None,
                 reset_after=None, stall=None, stall_after=None, drip=None,
                 probability=None):
        self.method = method
        self.status = status
        self.times = times
        self.path_part = path_part
        self.retry_after = retry_after
        self.reset_after = reset_after
        self.stall = stall
        self.stall_after = stall_after
        self.drip = drip
        self.probability = probability

    def matches(self, method, path):
        return ((self.method == '*' or self.method == method)
                and self.path_part in path)


# The network faults of a rule in the key=value form (see parse_faults).
FAULT_KEYS = {
    'status': int, 'retry-after': int, 'times': int, 'reset-after': int,
    'stall': float, 'stall-after': int, 'drip': float, 'probability': float,
}


def parse_fault_action(text, number):
    """``STATUS[xN]``, or ``key=value,...`` (see parse_faults)."""
    if '=' not in text:
        status, _, times = text.partition('x')
        return {'status': int(status), 'times': int(times) if times else None}
    action = {}
    for item in text.split(','):
        key, _, value = item.partition('=')
        if key not in FAULT_KEYS or not value:
            raise ValueError('line %d: unknown fault %r' % (number, item))
        action[key] = FAULT_KEYS[key](value)
    if ('status' in action) == any(k in action for k in (
            'reset-after', 'stall', 'drip')):
        raise ValueError('line %d: a fault is a status, or network faults '
                         '(reset-after, stall, drip)' % number)
    if 'stall-after' in action and 'stall' not in action:
        raise ValueError('line %d: stall-after needs stall' % number)
    return action


def parse_faults(text):
    """Parse a fault file.

    Each non-comment line is ``METHOD ACTION [path-substring]``: a request with
    that method (``*`` = any) whose decoded path contains the substring (which
    may contain spaces; absent = every path) gets the fault, after a successful
    authentication. The first matching line wins. ACTION is ``STATUS[xN]``, or
    comma-separated ``key=value`` items:

    - ``status=CODE``: fail with CODE; ``retry-after=S`` adds that header;
    - ``reset-after=BYTES``: pass the request on, and cut the connection after
      BYTES bytes of the answer's body (a reset or truncated body);
    - ``stall=SECONDS``: wait that long before the answer (before its head), or
      with ``stall-after=BYTES`` after BYTES bytes of its body;
    - ``drip=SECONDS``: send the body one byte every SECONDS;
    - ``times=N`` (``xN`` in the short form): only the first N matching requests
      after the file was last written (as seen by its mtime, size and inode;
      mtimes are coarse, so a rewrite with the same size within a few ms may not
      reset the count), which lets a test check that a client retries;
    - ``probability=P``: each matching request with probability P.
    """
    rules = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith('#'):
            continue
        fields = line.split(None, 2)
        if len(fields) < 2:
            raise ValueError('line %d: expected METHOD ACTION [path-substring]'
                             % number)
        action = parse_fault_action(fields[1], number)
        status = action.get('status')
        times = action.get('times')
        if ((status is not None and not 100 <= status <= 599)
                or (times is not None and times < 0)):
            raise ValueError('line %d: bad fault %r' % (number, fields[1]))
        path_part = fields[2] if len(fields) == 3 else ''
        rules.append(FaultRule(
            fields[0].upper(), status, times, path_part,
            retry_after=action.get('retry-after'),
            reset_after=action.get('reset-after'), stall=action.get('stall'),
            stall_after=action.get('stall-after'), drip=action.get('drip'),
            probability=action.get('probability')))
    return rules


class FaultRules(object):
    """The fault_file test hook, with per-rule use counts for ``times``."""

    def __init__(self, path):
        self.path = path
        self._watcher = FileWatcher(path, parse_faults, [])
        self._lock = threading.Lock()
        # protects the following
        self._counts_stamp = None
        self._counts = {}

    def match(self, method, path):
        """Returns the rule to apply to this request, or None."""
        stamp, rules = self._watcher.get()
        for index, rule in enumerate(rules):
            if not rule.matches(method, path):
                continue
            if (rule.probability is not None
                    and random.random() >= rule.probability):
                return None
            if rule.times is None:
                return rule
            with self._lock:
                if stamp != self._counts_stamp:
                    self._counts_stamp = stamp
                    self._counts = {}
                used = self._counts.get(index, 0)
                if used >= rule.times:
                    continue
                self._counts[index] = used + 1
            return rule
        return None


class InjectedReset(Exception):
    """Raised inside an answer's body: the server closes the connection."""


def faulty_body(app_iter, rule, sleep):
    """The answer's body, with the rule's network faults applied."""
    try:
        if rule.stall is not None and rule.stall_after is None:
            sleep(rule.stall)
        sent = 0
        stalled = False
        for chunk in app_iter:
            while chunk:
                piece = chunk
                if rule.drip is not None:
                    piece = chunk[:1]
                if rule.reset_after is not None:
                    piece = piece[:max(0, rule.reset_after - sent)]
                if (rule.stall_after is not None and not stalled
                        and sent + len(piece) > rule.stall_after):
                    piece = piece[:max(0, rule.stall_after - sent)]
                if piece:
                    yield piece
                    sent += len(piece)
                    chunk = chunk[len(piece):]
                if rule.reset_after is not None and sent >= rule.reset_after:
                    raise InjectedReset('reset after %d bytes' % sent)
                if (rule.stall_after is not None and not stalled
                        and sent >= rule.stall_after):
                    stalled = True
                    sleep(rule.stall)
                if rule.drip is not None and chunk:
                    sleep(rule.drip)
    finally:
        close = getattr(app_iter, 'close', None)
        if close is not None:
            close()


def request_headers(env):
    """Returns {lower-cased name: value} of the client's request headers.

    Values are WSGI strings (latin-1 decoded bytes); a header sent twice has
    its values joined by ``,``. See point 3 of the module comment.
    """
    headers = {}
    raw = env.get('headers_raw')
    if raw is not None:
        for name, value in raw:
            name = name.lower()
            if name in headers:
                headers[name] += ',' + value
            else:
                headers[name] = value
        return headers
    for key, value in env.items():
        if key.startswith('HTTP_'):
            name = key[5:]
        elif key in ('CONTENT_TYPE', 'CONTENT_LENGTH'):
            name = key
        else:
            continue
        headers[name.replace('_', '-').lower()] = value
    return headers


def string_to_sign(method, headers, path):
    """The CSSP StringToSign, as bytes.

    ``headers`` is request_headers(); ``path`` is the percent-decoded request
    path as a WSGI string.
    """
    def latin1(text):
        return text.encode('latin-1')

    parts = [latin1(method), b'\n',
             latin1(headers.get('content-md5', '')), b'\n',
             latin1(headers.get('content-type', '')), b'\n',
             latin1(headers.get('date', '')), b'\n']
    for name in sorted(n for n in headers if n.startswith(META_PREFIX)):
        parts.append(latin1('%s:%s\n' % (name, headers[name])))
    parts.append(latin1(path))
    return b''.join(parts)


def other_credentials(env):
    """True if the request carries non-CSSP credentials for a later middleware.

    Those are an S3 Authorization header (s3api, signature v2 or v4), or, with
    no Authorization header at all, a Swift token or tempauth's user and key
    headers (the v1 auth request). Read from the environ, where the later
    middlewares read them.
    """
    authorization = env.get('HTTP_AUTHORIZATION')
    if authorization is not None:
        return authorization.startswith(('AWS ', 'AWS4-HMAC-SHA256 '))
    return any(env.get(name) for name in (
        'HTTP_X_AUTH_TOKEN', 'HTTP_X_STORAGE_TOKEN',
        'HTTP_X_AUTH_USER', 'HTTP_X_STORAGE_USER'))


def sign(secret, string):
    """base64(HMAC-SHA1(secret, string)) as ASCII text."""
    digest = hmac.new(secret, string, hashlib.sha1).digest()
    return base64.b64encode(digest).decode('ascii')


def parse_http_date(value):
    """Returns the POSIX time of an RFC 1123 date, or None if unparseable."""
    try:
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if parsed is None or parsed.tzinfo is None:
        return None
    return parsed.timestamp()


def format_http_date(timestamp):
    return email.utils.formatdate(timestamp, usegmt=True)


class CsspAuth(object):
    """The WSGI middleware. See the module comment."""

    def __init__(self, app, conf, clock=time.time, logger=None, sleep=None):
        self.app = app
        self.logger = logger or get_logger(conf, log_route='cssp_auth')
        keys_file = conf.get('keys_file')
        if not keys_file:
            raise ValueError('cssp_auth: keys_file is required')
        self.keys = FileWatcher(keys_file, parse_keys, {})
        # Fail at start-up, not at the first request, if the file is broken.
        self.keys.get()
        self.max_skew = float(conf.get('max_skew', 900))
        fault_file = conf.get('fault_file')
        self.faults = FaultRules(fault_file) if fault_file else None
        self.pass_other_auth = config_true_value(
            conf.get('pass_other_auth', False))
        self.clock = clock
        # The proxy serves requests in green threads: time.sleep would stop them all.
        self.sleep = sleep or green_sleep

    def __call__(self, env, start_response):
        if self.pass_other_auth and other_credentials(env):
            # The fault file applies to other schemes' requests too: a benchmark slows
            # every client alike, and csspfs's own tests over S3 (s3api) get their
            # refusals as over CSSP.
            path = env.get('PATH_INFO', '')
            rule = self._fault(env, path)
            if rule is not None and rule.status is not None:
                return self._injected(env, path, rule)(env, start_response)
            return self._answer(env, start_response, rule)
        if env.get('PATH_INFO') == '/info' and \
                env.get('REQUEST_METHOD') in ('GET', 'HEAD'):
            # What the cluster offers (bulk delete, limits): unauthenticated,
            # as on stock Swift (point 7).
            return self.app(env, start_response)
        try:
            credential = self._authenticate(env)
        except ErrorResponse as error:
            return self._error_response(env, error)(env, start_response)

        path = env.get('PATH_INFO', '')
        if not path.startswith('/') or path == '/':
            return self._error_response(env, ErrorResponse(
                403, 'AccessDenied',
                'Requests must name a container: /<container>[/<key>].'))(
                    env, start_response)

        faults = None
        if self.faults is not None:
            rule = self._fault(env, path)
            if rule is not None and rule.status is not None:
                return self._injected(env, path, rule)(env, start_response)
            if rule is not None:
                self.logger.info('cssp_auth: injecting network faults for %s %s',
                                 env['REQUEST_METHOD'],
                                 quote(path.encode('latin-1')))
                faults = rule

        new_path = '/v1/%s%s%s' % (ACCOUNT_PREFIX, credential.account, path)
        env['PATH_INFO'] = new_path
        env['RAW_PATH_INFO'] = quote(new_path.encode('latin-1'), safe='/')
        env['REMOTE_USER'] = credential.access_key
        env['swift.authorize'] = _authorizer(
            ACCOUNT_PREFIX + credential.account)
        env['swift.authorize_override'] = True
        env['swift_owner'] = True
        env.pop('HTTP_AUTHORIZATION', None)
        return self._answer(env, start_response, faults)

    def _injected(self, env, path, rule):
        """The error answer of a fault rule with a status."""
        self.logger.info('cssp_auth: injecting %d for %s %s',
                         rule.status, env['REQUEST_METHOD'],
                         quote(path.encode('latin-1')))
        response = self._error_response(env, ErrorResponse(
            rule.status, 'InjectedFault',
            'Fault injected by the test server (fault_file).'))
        if rule.retry_after is not None:
            response.headers['Retry-After'] = str(rule.retry_after)
        return response

    def _answer(self, env, start_response, rule):
        """The next application's answer, with the network faults of ``rule`` (None: none)."""
        if rule is None:
            return self.app(env, start_response)
        if (rule.stall is not None and rule.stall_after is None
                and rule.drip is None and rule.reset_after is None):
            # Only a wait before the answer: the application's own body goes out as it
            # is, framed as without the rule. (Wrapped in a generator, a body of unknown
            # length goes out chunked, and a HEAD's answer then carried a stray chunk
            # terminator that broke Go clients' keep-alive connections: rclone's uploads
            # failed under bench/compare.sh LATENCY_MS.)
            self.sleep(rule.stall)
            return self.app(env, start_response)
        return faulty_body(self.app(env, start_response), rule, self.sleep)

    def _fault(self, env, path):
        """The fault_file rule for this request, or None."""
        if self.faults is None:
            return None
        try:
            return self.faults.match(
                env['REQUEST_METHOD'],
                path.encode('latin-1').decode('utf-8', 'replace'))
        except (OSError, ValueError) as e:
            self.logger.error('cssp_auth: ignoring fault_file %s: %s',
                              self.faults.path, e)
            return None

    def _authenticate(self, env):
        """Returns the Credential of a correctly signed request.

        Raises ErrorResponse otherwise. Check order: credentials present and
        well formed (401), key known (403), clock (403), signature (403).
        """
        headers = request_headers(env)
        authorization = headers.get('authorization')
        if authorization is None:
            raise ErrorResponse(401, 'AuthFailure',
                                'Missing Authorization header.')
        scheme, _, credentials = authorization.partition(' ')
        access_key, _, signature = credentials.strip().rpartition(':')
        if scheme != 'CSSP' or not access_key or not signature:
            raise ErrorResponse(
                401, 'AuthFailure',
                'Malformed Authorization header; expected '
                '"CSSP <AccessKeyId>:<Signature>".')

        try:
            _, keys = self.keys.get()
        except (OSError, ValueError) as e:
            self.logger.error('cssp_auth: cannot read keys_file %s: %s',
                              self.keys.path, e)
            raise ErrorResponse(500, 'InternalError',
                                'The server cannot read its key list.')
        credential = keys.get(access_key)
        if credential is None:
            self.logger.info('cssp_auth: unknown access key %r', access_key)
            raise ErrorResponse(403, 'AuthFailure',
                                'The access key is not known to the server.')

        now = self.clock()
        date = headers.get('date')
        timestamp = parse_http_date(date) if date else None
        if timestamp is None or abs(now - timestamp) > self.max_skew:
            if timestamp is None:
                what = ('Missing Date header' if date is None
                        else 'Unparseable Date header %r' % date)
            else:
                what = ('The difference between the request time (%s) and '
                        'the server time is too large'
                        % format_http_date(timestamp))
            raise ErrorResponse(
                403, 'RequestTimeTooSkewed',
                '%s; server time is %s, maximum allowed skew is %d s.'
                % (what, format_http_date(now), self.max_skew))

        string = string_to_sign(env['REQUEST_METHOD'], headers,
                                env.get('PATH_INFO', ''))
        expected = sign(credential.secret, string)
        if not hmac.compare_digest(expected.encode('ascii'),
                                   signature.encode('latin-1')):
            self.logger.info(
                'cssp_auth: signature mismatch for access key %r; '
                'StringToSign=%r', access_key, string)
            raise ErrorResponse(
                403, 'SignatureDoesNotMatch',
                'The request signature does not match the signature computed '
                'by the server. Check the secret key and the signing method.')
        return credential

    def _error_response(self, env, error):
        request_id = env.get('swift.trans_id', '')
        body = ('%s<Error><Code>%s</Code><Message>%s</Message>'
                '<RequestId>%s</RequestId></Error>'
                % (XML_DECLARATION, escape(error.code), escape(error.message),
                   escape(request_id)))
        status = error.status
        if status not in RESPONSE_REASONS:
            status = '%d %s' % (status, error.code)
        response = Response(status=status, body=body.encode('utf-8'),
                            content_type='application/xml', charset=None,
                            request=Request(env))
        if error.status == 401:
            response.headers['WWW-Authenticate'] = 'CSSP'
        return response


class ErrorResponse(Exception):
    """An error answered with the CSSP XML body."""

    def __init__(self, status, code, message):
        Exception.__init__(self, code)
        self.status = status
        self.code = code
        self.message = message


def _authorizer(account):
    """Returns the swift.authorize callback for a request signed for account.

    The proxy calls it for the request and for the sub-requests of copy and
    dlo; it allows everything inside the key's own account and nothing
    elsewhere (so X-Copy-From-Account cannot reach another account).
    """
    def authorize(request):
        try:
            _, request_account, _ = request.split_path(2, 3, True)
        except ValueError:
            return HTTPForbidden(request=request)
        if request_account != account:
            return HTTPForbidden(request=request)
        return None
    return authorize


def filter_factory(global_conf, **local_conf):
    conf = dict(global_conf)
    conf.update(local_conf)

    def cssp_auth_filter(app):
        return CsspAuth(app, conf)
    return cssp_auth_filter
