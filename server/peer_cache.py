"""An in-process stand-in for memcache, for the test server's proxy.

tempauth keeps its tokens only in ``swift.cache`` (it answers 500 without one),
and s3api authenticates through tempauth. The test server runs one proxy
process and no memcached, so this filter puts a dictionary there instead.

Things that are easy to get wrong here:

1. Every request gets the cache, CSSP ones included, as every request would
   with memcached in a deployment: the proxy then caches account and
   container info instead of fetching both for each object request. Serving
   only the peers would make the server slower for csspfs than for them, and
   the benchmark unfair.
2. Values are stored as JSON, as memcache stores them, so a caller that
   mutates what it got back cannot change the cached copy, and tuples come
   back as lists, as they do from memcache.
3. Entries expire after their ``time`` (seconds; 0 = never, as in memcache).
   Expired entries are dropped when read; the dictionary is bounded by
   ``max_entries`` (oldest insertions dropped first): tokens and container
   infos are few here.

Filter options: ``max_entries`` (default 10000).
"""

import json
import time


class DictCache(object):
    """The subset of swift.common.memcached.MemcacheRing that the proxy,
    tempauth and s3api call, kept in a dict. Eventlet runs one green thread
    at a time and none of these methods yields, so no lock is needed."""

    def __init__(self, max_entries=10000, clock=time.time):
        self.max_entries = max_entries
        self.clock = clock
        self._entries = {}  # key -> (expires or 0, JSON text)

    def set(self, key, value, serialize=True, time=0, **_):
        self._entries.pop(key, None)
        while len(self._entries) >= self.max_entries:
            del self._entries[next(iter(self._entries))]
        expires = self.clock() + time if time else 0
        self._entries[key] = (expires, json.dumps(value))

    def get(self, key, raise_on_error=False, **_):
        entry = self._entries.get(key)
        if entry is None:
            return None
        expires, text = entry
        if expires and expires <= self.clock():
            del self._entries[key]
            return None
        return json.loads(text)

    def delete(self, key, **_):
        self._entries.pop(key, None)

    def incr(self, key, delta=1, time=0, **_):
        value = int(self.get(key) or 0) + delta
        self.set(key, value, time=time)
        return value

    def decr(self, key, delta=1, time=0, **_):
        return self.incr(key, -delta, time=time)

    def get_multi(self, keys, server_key=None, **_):
        return [self.get(key) for key in keys]

    def set_multi(self, mapping, server_key=None, serialize=True, time=0,
                  **_):
        for key, value in mapping.items():
            self.set(key, value, time=time)


class PeerCache(object):
    """The WSGI filter. See the module comment."""

    def __init__(self, app, conf, cache=None):
        self.app = app
        self.cache = cache or DictCache(int(conf.get('max_entries', 10000)))

    def __call__(self, env, start_response):
        env.setdefault('swift.cache', self.cache)
        return self.app(env, start_response)


def filter_factory(global_conf, **local_conf):
    conf = dict(global_conf)
    conf.update(local_conf)

    def peer_cache_filter(app):
        return PeerCache(app, conf)
    return peer_cache_filter
