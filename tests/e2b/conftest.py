"""The Corral server the E2B SDK tests talk to.

With CORRAL_URL set (and CORRAL_API_KEY, when that server needs a key), the tests use that
server. Otherwise this starts one (tests/corral_testing: the binary from $CORRAL_BIN or the
repository's target directory, a fresh database in a temporary directory, the image store of
$CORRAL_DATA_DIR) with a key made by `corral key create`; it is stopped with SIGTERM at the end.
"""

import os

import pytest

from corral_testing import Server


def point_sdk_at(url, key):
    # The SDK reads these when each request's connection config is built. An http:// URL is
    # what makes it speak plain HTTP; E2B_DEBUG must stay off (in debug mode the SDK skips
    # POST /v2/sandboxes and DELETE entirely).
    os.environ["E2B_API_URL"] = url
    os.environ["E2B_SANDBOX_URL"] = url
    os.environ["E2B_API_KEY"] = key
    os.environ["E2B_DEBUG"] = "false"
    os.environ.pop("E2B_DOMAIN", None)


@pytest.fixture(scope="session", autouse=True)
def corral_server(tmp_path_factory):
    """The base URL of the server under test; the SDK is pointed at it."""
    url = os.environ.get("CORRAL_URL", "").rstrip("/")
    if url:
        point_sdk_at(url, os.environ.get("CORRAL_API_KEY", "corral-missing-api-key"))
        yield url
        return
    server = Server(tmp_path_factory.mktemp("corral-server"))
    key = server.create_key("e2b-test")
    with server:
        point_sdk_at(server.url, key.secret)
        yield server.url
