"""api/client_address.py: which hop of X-Forwarded-For is the client, for given trusted proxies."""

from __future__ import annotations

import pytest

from api.client_address import client_address, parse_networks

LB = parse_networks(["10.0.0.0/20", "fd00::/8"])


@pytest.mark.parametrize(
    ("peer", "forwarded", "proxies", "client"),
    [
        ("203.0.113.5", "1.2.3.4", (), "203.0.113.5"),  # nothing trusted: the header is ignored
        ("203.0.113.5", "1.2.3.4", LB, "203.0.113.5"),  # an untrusted peer's header is ignored
        ("10.0.1.9", None, LB, "10.0.1.9"),
        ("10.0.1.9", "1.2.3.4, 198.51.100.7", LB, "198.51.100.7"),  # right-most untrusted
        ("10.0.1.9", "198.51.100.7, 10.0.2.2", LB, "198.51.100.7"),  # through two proxies
        ("10.0.1.9", "10.0.3.3, 10.0.2.2", LB, "10.0.3.3"),  # all trusted: the left-most
        ("10.0.1.9", "garbage, 10.0.2.2", LB, "10.0.2.2"),  # not an address: its proxy is the end
        ("10.0.1.9", "198.51.100.7:4711", LB, "198.51.100.7"),
        ("fd00::1", "[2001:db8::7]:443", LB, "2001:db8::7"),
    ],
)
def test_the_client_is_the_right_most_address_no_trusted_proxy_vouches_for(peer, forwarded, proxies, client):
    assert client_address(peer, forwarded, proxies) == client


def test_a_trusted_proxy_that_is_not_an_address_is_refused():
    with pytest.raises(ValueError):
        parse_networks(["10.0.0.0/20", "load-balancer"])
