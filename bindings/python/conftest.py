"""Fixtures of the kvtier Python tests: real kvtierd processes (kvtier.testing.Daemon).

The daemon's path comes from $KVTIER_DAEMON (ctest sets it). Every daemon is stopped, and its data
directory, socket and shared-memory segments removed, also when a test fails; a daemon that left
segments behind after a clean SIGTERM fails the test that used it.
"""

import os

import pytest

import kvtier
import kvtier.testing


def _daemon(host_pool_bytes):
    if not os.environ.get("KVTIER_DAEMON"):
        pytest.skip("KVTIER_DAEMON is not set (run through ctest)")
    daemon = kvtier.testing.Daemon(host_pool_bytes=host_pool_bytes)
    with daemon:
        yield daemon
        daemon.stop()
        assert daemon.exit_status == 0, "".join(daemon.output)
        assert daemon.leftover_segments == [], "kvtierd left shared memory behind"


@pytest.fixture
def daemon():
    """A kvtierd of the test's own (64 MiB host pool): no test sees another's leases, sessions
    or cached blocks."""
    yield from _daemon(64 << 20)


@pytest.fixture
def small_daemon():
    """A kvtierd of its own with a 1 MiB pool, for tests that fill it."""
    yield from _daemon(1 << 20)


@pytest.fixture
def client(daemon):
    """A client of `daemon`, closed after the test."""
    c = kvtier.Client(daemon.socket, client_name="pytest")
    yield c
    c.close()


@pytest.fixture
def layout():
    """2 layers, 2 KV heads, head dim 8, fp32, 16-token blocks: 256 B a token, 4 KiB a block."""
    return kvtier.Layout("py/tiny", num_layers=2, num_kv_heads=2, head_dim=8, dtype="float32")


@pytest.fixture
def seq(request):
    """A sequence name of this test's own."""
    return "seq-" + request.node.name

