"""E2B's network options against Corral (docs/e2b.md#network-options): the unmodified SDK's
`allow_internet_access` and `network` (`allow_out`, `deny_out`, `ALL_TRAFFIC`, `dns_servers`,
...), and the same keys as raw HTTP. Corral's sandboxes reach only what an allow-list names,
so `allow_out` under `deny_out=[ALL_TRAFFIC]` (or `allow_internet_access=False`) is carried out
as that allow-list; what would deny less than all traffic, and every option Corral cannot carry
out, is refused with 400 and a message saying why, never ignored.

The test server has no `[network]` settings: every allow-list lies outside them (403), which is
how these tests see that the SDK's allow-list reached Corral's policy check.
"""

import os

import httpx
import pytest

from e2b import ALL_TRAFFIC, SandboxException
from e2b_code_interpreter import Sandbox


@pytest.fixture(scope="module")
def client(corral_server):
    with httpx.Client(base_url=corral_server, timeout=60) as c:
        yield c


def create(client, body):
    """POST /v2/sandboxes as the SDK does; kills what it made."""
    r = client.post("/v2/sandboxes", json=body, headers={"X-API-KEY": os.environ["E2B_API_KEY"]})
    if r.status_code == 201:
        client.delete(
            f"/sandboxes/{r.json()['sandboxID']}",
            headers={"X-API-KEY": os.environ["E2B_API_KEY"]},
        )
    return r


def refused(client, body, status):
    r = create(client, body)
    assert r.status_code == status, (body, r.text)
    assert r.json()["code"] == status, r.text
    return r.json()["message"]


def test_all_traffic_is_the_sdks_constant():
    assert ALL_TRAFFIC == "0.0.0.0/0"


def test_allow_out_under_all_traffic_denied_reaches_the_policy_check():
    # The allow-list is Corral's: this server allows nothing, so the first name is refused.
    with pytest.raises(SandboxException) as e:
        Sandbox.create(network={"allow_out": ["pypi.org"], "deny_out": [ALL_TRAFFIC]})
    assert "403" in str(e.value) and "pypi.org" in str(e.value), e.value
    with pytest.raises(SandboxException) as e:
        Sandbox.create(allow_internet_access=False, network={"allow_out": ["1.1.1.1"]})
    assert "403" in str(e.value) and "1.1.1.1" in str(e.value), e.value


def test_no_internet_is_a_sandbox_without_network():
    for kwargs in (
        {"allow_internet_access": False},
        {"network": {"deny_out": [ALL_TRAFFIC]}},
        {"network": {"deny_out": [ALL_TRAFFIC], "allow_out": []}},
    ):
        sbx = Sandbox.create(**kwargs)
        try:
            ran = sbx.run_code(
                "import socket\n"
                "try:\n"
                "    socket.create_connection(('1.1.1.1', 80), timeout=2)\n"
                "    print('connected')\n"
                "except OSError as e:\n"
                "    print('refused')\n"
            )
            assert "".join(ran.logs.stdout) == "refused\n", (kwargs, ran)
        finally:
            sbx.kill()


def test_what_denies_less_than_all_traffic_is_refused_saying_how_to_ask():
    # E2B would allow everything but these; Corral only allows what a list names.
    with pytest.raises(SandboxException) as e:
        Sandbox.create(network={"deny_out": ["8.8.8.8"]})
    assert "400" in str(e.value) and "8.8.8.8" in str(e.value), e.value
    with pytest.raises(SandboxException) as e:
        Sandbox.create(network={"allow_out": ["pypi.org"]})
    assert "400" in str(e.value) and "denyOut" in str(e.value), e.value
    # The SDK's callable form resolves on the client: the same rule.
    with pytest.raises(SandboxException) as e:
        Sandbox.create(network={"deny_out": lambda ctx: ["10.0.0.0/8"]})
    assert "400" in str(e.value), e.value


def test_allow_internet_access_takes_the_keys_default_which_this_server_lacks():
    with pytest.raises(SandboxException) as e:
        Sandbox.create(allow_internet_access=True)
    assert "403" in str(e.value) and "default" in str(e.value), e.value


def test_options_corral_cannot_carry_out_are_refused_never_ignored(client):
    deny_all = [ALL_TRAFFIC]
    for key, value in (
        ("dnsServers", ["8.8.8.8"]),
        ("egressProxy", {"address": "socks5://proxy.example:1080"}),
        ("rules", {"api.example.com": [{"transform": {"headers": {"x": "y"}}}]}),
        ("allowPublicTraffic", True),
        ("maskRequestHost", "${PORT}-sandbox.example"),
        ("httpsPorts", [8443]),
        ("someFutureRule", []),
    ):
        message = refused(client, {"network": {"denyOut": deny_all, key: value}}, 400)
        assert key in message, (key, message)
    # Names cannot be denied, as in E2B.
    message = refused(client, {"network": {"denyOut": ["evil.com", ALL_TRAFFIC]}}, 400)
    assert "evil.com" in message
    # What holds anyway is accepted: no DNS servers, no proxy, no rules, no public traffic.
    r = create(
        client,
        {
            "allow_internet_access": True,
            "network": {
                "denyOut": deny_all,
                "dnsServers": [],
                "egressProxy": None,
                "rules": {},
                "allowPublicTraffic": False,
            },
        },
    )
    assert r.status_code == 201, r.text
