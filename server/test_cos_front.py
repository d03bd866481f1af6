"""Tests of the COS front's signature check (server/cos_front.py) against COS's documented examples."""

import unittest

import cos_front

SECRET = 'BQYIM75p8x0iWVFSIgqEKwFprpRSVHlz'
HOST = 'examplebucket-1250000000.cos.ap-beijing.myqcloud.com'


class SignatureTests(unittest.TestCase):
    def test_the_documented_upload(self):
        headers = [('Date', 'Thu, 16 May 2019 06:45:51 GMT'), ('Host', HOST), ('Content-Type', 'text/plain'),
                   ('Content-Length', '13'), ('Content-MD5', 'mQ/fVh815F3k6TAUm8m0eg=='),
                   ('x-cos-acl', 'private'), ('x-cos-grant-read', 'uin="100000000011"')]
        self.assertEqual(
            cos_front.cos_signature(SECRET, 'PUT', '/exampleobject(腾讯云)', [], headers, '1557989151;1557996351'),
            '3b8851a11a569213c17ba8fa7dcf2abec6935172')

    def test_the_documented_download(self):
        params = cos_front.query_items(
            'response-content-type=application%2Foctet-stream&response-cache-control=max-age%3D600')
        headers = [('Date', 'Thu, 16 May 2019 06:55:53 GMT'), ('Host', HOST)]
        self.assertEqual(
            cos_front.cos_signature(SECRET, 'GET', '/exampleobject(腾讯云)', params, headers, '1557989753;1557996953'),
            '01681b8c9d798a678e43b685a9f1bba0f6c0e012')
        self.assertEqual(cos_front.encoded_list(params)[1], 'response-cache-control;response-content-type')

    def test_cos_headers_become_s3_ones(self):
        self.assertEqual(cos_front.to_s3('x-cos-meta-mode', '33188'), ('x-amz-meta-mode', '33188'))
        self.assertEqual(cos_front.to_s3('x-cos-copy-source', '127.0.0.1:8494/b-1/a b'), ('x-amz-copy-source', '/b-1/a b'))
        self.assertEqual(cos_front.to_s3('x-cos-copy-source', 'b-1.cos.ap-beijing.myqcloud.com/k'),
                         ('x-amz-copy-source', '/b-1/k'))
        self.assertEqual(cos_front.to_s3('x-cos-metadata-directive', 'Replaced'), ('x-amz-metadata-directive', 'REPLACE'))
        self.assertEqual(cos_front.to_s3('x-cos-forbid-overwrite', 'true'), ('if-none-match', '*'))
        self.assertIsNone(cos_front.to_s3('x-cos-forbid-overwrite', 'false'))
        self.assertEqual(cos_front.to_cos('x-amz-meta-mtime', '5'), ('x-cos-meta-mtime', '5'))


if __name__ == '__main__':
    unittest.main()
