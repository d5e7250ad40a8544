"""The tests' HTTP requests: httpx's functions (``web.get``, ``web.post``, ...), each on a
connection of its own and keeping no cookies, as httpx.get's and httpx.post's are, but
sent through one client: httpx's functions make a client, and with it a TLS context that
reads the CA bundle, at every call."""

from http.cookiejar import CookieJar, DefaultCookiePolicy

import httpx

_client = httpx.Client(
    limits=httpx.Limits(max_connections=None, max_keepalive_connections=0),
    cookies=CookieJar(DefaultCookiePolicy(allowed_domains=[])))

get, post, head, options, put, delete, request, stream = (
    _client.get, _client.post, _client.head, _client.options, _client.put, _client.delete,
    _client.request, _client.stream)
