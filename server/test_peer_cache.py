"""Unit tests of peer_cache (the test server's memcache stand-in).

Run: /usr/bin/python3 -m unittest discover -s server -p 'test_*.py'
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from swift.common.swob import Request, Response  # noqa: E402

import peer_cache  # noqa: E402


class Clock(object):
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class DictCacheTests(unittest.TestCase):

    def setUp(self):
        self.clock = Clock()
        self.cache = peer_cache.DictCache(max_entries=3, clock=self.clock)

    def test_values_round_trip_as_json(self):
        value = {'groups': ['a', 'b'], 'n': 1}
        self.cache.set('k', value)
        got = self.cache.get('k')
        self.assertEqual(got, value)
        got['groups'].append('c')
        self.assertEqual(self.cache.get('k'), value)
        self.cache.set('t', (12.5, 'g1,g2'))
        self.assertEqual(self.cache.get('t'), [12.5, 'g1,g2'])
        self.assertIsNone(self.cache.get('missing'))

    def test_expiry(self):
        self.cache.set('short', 1, time=10)
        self.cache.set('forever', 2)
        self.clock.now += 9.9
        self.assertEqual(self.cache.get('short'), 1)
        self.clock.now += 0.1
        self.assertIsNone(self.cache.get('short'))
        self.clock.now += 1e6
        self.assertEqual(self.cache.get('forever'), 2)

    def test_bounded_drops_oldest_insertion(self):
        for key in ('a', 'b', 'c'):
            self.cache.set(key, key)
        self.cache.set('a', 'again')  # re-inserting makes 'a' the newest
        self.cache.set('d', 'd')
        self.assertIsNone(self.cache.get('b'))
        self.assertEqual([self.cache.get(k) for k in ('a', 'c', 'd')],
                         ['again', 'c', 'd'])

    def test_delete_incr_multi(self):
        self.assertEqual(self.cache.incr('n', 2), 2)
        self.assertEqual(self.cache.decr('n'), 1)
        self.cache.delete('n')
        self.cache.delete('n')
        self.assertIsNone(self.cache.get('n'))
        self.cache.set_multi({'x': 1, 'y': 2}, 'server')
        self.assertEqual(self.cache.get_multi(['x', 'y', 'z'], 'server'),
                         [1, 2, None])


class PeerCacheFilterTests(unittest.TestCase):

    def setUp(self):
        self.seen = []

        def app(env, start_response):
            self.seen.append(env.get('swift.cache'))
            return Response(status=204)(env, start_response)
        self.filter = peer_cache.filter_factory({}, max_entries='5')(app)

    def test_peer_requests_get_the_cache(self):
        Request.blank('/auth/v1.0').get_response(self.filter)
        Request.blank('/v1/AUTH_a/c').get_response(self.filter)
        self.assertIsInstance(self.seen[0], peer_cache.DictCache)
        self.assertIs(self.seen[0], self.seen[1])
        self.assertEqual(self.seen[0].max_entries, 5)

    def test_cssp_requests_get_the_same_cache(self):
        # As with memcached in a deployment: csspfs and the peers see one server.
        Request.blank('/auth/v1.0').get_response(self.filter)
        Request.blank('/v1/AUTH_a/c', environ={
            'swift.authorize_override': True}).get_response(self.filter)
        self.assertIsInstance(self.seen[1], peer_cache.DictCache)
        self.assertIs(self.seen[0], self.seen[1])


if __name__ == '__main__':
    unittest.main()
