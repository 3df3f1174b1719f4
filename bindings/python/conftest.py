"""Fixtures of the kvtier Python tests: real kvtierd processes (kvtier.testing.Daemon).

The daemon's path comes from $KVTIER_DAEMON (ctest sets it). Every daemon is stopped, and its data
directory, socket and shared-memory segments removed, also when a test fails; a daemon that left
segments behind after a clean SIGTERM fails the test that used it.
"""

import contextlib
import os
import random
import socket
from collections.abc import Iterator

import pytest

import kvtier
from kvtier.testing import Daemon


def _daemon(host_pool_bytes: int) -> Iterator[Daemon]:
    if not os.environ.get("KVTIER_DAEMON"):
        pytest.skip("KVTIER_DAEMON is not set (run through ctest)")
    daemon = Daemon(host_pool_bytes=host_pool_bytes)
    with daemon:
        yield daemon
        daemon.stop()
        assert daemon.exit_status == 0, "".join(daemon.output)
        assert daemon.leftover_segments == [], "kvtierd left shared memory behind"


@pytest.fixture
def daemon() -> Iterator[Daemon]:
    """A kvtierd of the test's own (64 MiB host pool): no test sees another's leases, sessions
    or cached blocks."""
    yield from _daemon(64 << 20)


@pytest.fixture
def small_daemon() -> Iterator[Daemon]:
    """A kvtierd of its own with a 1 MiB pool, for tests that fill it."""
    yield from _daemon(1 << 20)


@pytest.fixture
def client(daemon: Daemon) -> Iterator[kvtier.Client]:
    """A client of `daemon`, closed after the test."""
    c = kvtier.Client(daemon.socket, client_name="pytest")
    yield c
    c.close()


@pytest.fixture
def layout() -> kvtier.Layout:
    """2 layers, 2 KV heads, head dim 8, fp32, 16-token blocks: 256 B a token, 4 KiB a block."""
    return kvtier.Layout("py/tiny", num_layers=2, num_kv_heads=2, head_dim=8, dtype="float32")


@pytest.fixture
def state_layout() -> kvtier.Layout:
    """`layout` of a hybrid model: the same KV, and a 1000-byte recurrent state at each cached
    prefix's end."""
    return kvtier.Layout("py/hybrid", num_layers=2, num_kv_heads=2, head_dim=8, dtype="float32",
                         state_bytes=1000)


@pytest.fixture
def seq(request: pytest.FixtureRequest) -> str:
    """A sequence name of this test's own."""
    return "seq-" + request.node.name



def _free_port() -> int:
    """A loopback port free now, picked below the kernel's ephemeral range: no port the kernel
    hands out on its own (outgoing connections, the daemons' UCX listeners on port 0) can take it
    before the daemon listens on it."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low = int(f.read().split()[0])
    for _ in range(1000):
        port = random.randint(10000, low - 1) if low > 11000 else 0
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise RuntimeError("no free port to bind")


@pytest.fixture
def two_nodes() -> Iterator[list[Daemon]]:
    """Two kvtierd of the test's own joined as a cluster by static peers on loopback (nodes 'n0'
    and 'n1'); both stopped and their segments checked as for `daemon`."""
    if not os.environ.get("KVTIER_DAEMON"):
        pytest.skip("KVTIER_DAEMON is not set (run through ctest)")
    ports = [_free_port(), _free_port()]
    daemons = [
        Daemon(extra_args=[
            "--listen", "127.0.0.1:%d" % ports[i], "--peers", "127.0.0.1:%d" % ports[1 - i],
            "--node-id", "n%d" % i, "--peer-timeout-ms", "1000"])
        for i in range(2)
    ]
    with contextlib.ExitStack() as stack:
        for d in daemons:
            stack.enter_context(d)
        yield daemons
        for d in daemons:
            d.stop()
            assert d.exit_status == 0, "".join(d.output)
            assert d.leftover_segments == [], "kvtierd left shared memory behind"
