"""The browser guard's rules (ingest_gateway.browser_guard), and the JSON error excerpt."""

from __future__ import annotations

import json

import pytest

from ingest_gateway.browser_guard import _hostname, allowed_hosts, cross_site
from ingest_gateway.kit.errors import MalformedRequestError
from ingest_gateway.kit.json_body import loads


def scope(method: str = "POST", **headers: str) -> dict:
    return {"method": method, "headers": [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]}


@pytest.mark.parametrize(
    ("headers", "refused"),
    [
        ({}, False),  # not a browser
        ({"sec_fetch_site": "same-origin", "origin": "http://a:1", "host": "a:1"}, False),
        ({"sec_fetch_site": "none"}, False),  # typed in the address bar
        ({"sec_fetch_site": "cross-site", "origin": "http://a:1", "host": "a:1"}, True),
        ({"sec_fetch_site": "same-site"}, True),  # another port of this host
        # behind a proxy that rewrote Host, Fetch Metadata decides alone
        ({"sec_fetch_site": "same-origin", "origin": "https://proxy.example:8443", "host": "proxy.example"}, False),
        ({"origin": "http://a:1", "host": "a:1"}, False),  # a browser without Fetch Metadata
        ({"origin": "http://evil.example", "host": "a:1"}, True),
        ({"origin": "null", "host": "a:1"}, True),
    ],
)
def test_cross_site(headers, refused):
    assert (cross_site(scope(**headers)) is not None) is refused


def test_host_names():
    assert _hostname("[::1]:8080") == "::1" and _hostname("LocalHost.:80") == "localhost" and _hostname("::1") == "::1"
    assert allowed_hosts("127.0.0.1", ()) == {"localhost", "127.0.0.1", "::1"}
    assert allowed_hosts("0.0.0.0", ()) is None  # bound elsewhere: any name, unless configured
    assert allowed_hosts("0.0.0.0", ["*"]) is None
    # configured names add to the loopback ones (local clients keep working), and the advertised one
    assert allowed_hosts("0.0.0.0", ["Proxy.Example"], ["gw1:8080"]) == {
        "localhost", "127.0.0.1", "::1", "proxy.example", "gw1",
    }  # fmt: skip


def test_a_json_error_quotes_the_text_around_it_safely():
    with pytest.raises(MalformedRequestError) as err:
        loads(b'{"records": [{"value": {"a": 1,}}]}')
    assert ">>>}" in err.value.message and "Fix the JSON there" in err.value.message
    # bytes json decodes to a lone surrogate must still make an answer that encodes
    with pytest.raises(MalformedRequestError) as err:
        loads(b'{"a": "\xed\xa0\x80" oops}')
    json.dumps(err.value.to_dict()).encode("utf-8")
    err.value.message.encode("utf-8")
