"""Processes and threads around the kvtier Python package against real kvtierd processes: a
forked child refused on every call, blocking calls releasing the GIL, threads sharing a client, a
client reconnecting to a daemon that came back, and the package installed into a prefix and used
from there.

Fixtures: conftest.py; helpers shared with the other *_test.py: testlib/kvtier_test_helpers.py.
"""

from __future__ import annotations

import gc
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import numpy as np
import pytest

import kvtier
from kvtier.testing import Daemon

from kvtier_test_helpers import packed, prompt


def test_use_in_a_child_after_fork_raises_and_changes_nothing(
    client: kvtier.Client, layout: kvtier.Layout, seq: str
) -> None:
    space = client.open(layout)
    kv = packed(layout, 16)
    space.put(seq, 0, prompt(16), kv)
    h = space.get(seq)
    block = h.block(0)
    space.put_entry(kvtier.content_key(kv), kv)
    blob = space.get_entry(kvtier.content_key(kv))
    before = client.stats()
    pid = os.fork()
    if pid == 0:  # the child: report through the exit code, never return into pytest
        failures = 0
        for call in (
            client.stats,
            lambda: client.open(layout),
            lambda: space.put(seq, 0, prompt(16), kv),
            lambda: space.lookup(prompt(16)),
            lambda: h.block(0),
            lambda: np.asarray(block),
            lambda: h.copy_to(),
            h.release,
            blob.numpy,
            blob.release,
            lambda: space.get_entry(kvtier.content_key(kv)),
            lambda: space.put_many([(seq, 0, prompt(16), kv)]),
            client.close,
        ):
            try:
                call()
                failures += 1
            except kvtier.UsedAfterFork:
                pass
            except BaseException:
                failures += 1
        # Dropping every object in the child must neither hang nor reach the daemon.
        del block, h, blob, space
        gc.collect()
        os._exit(failures)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    after = client.stats()
    assert after["leases"] == before["leases"] and after["bytes"] == before["bytes"]
    assert after["sequences"] == before["sequences"]
    np.testing.assert_array_equal(block.numpy(), kv)  # the parent's objects still work
    assert blob.tobytes() == kv.tobytes()
    h.release()
    blob.release()


def test_blocking_calls_release_the_gil(daemon: Daemon) -> None:
    """Every call that waits for the daemon lets other Python threads run.

    The client thread talks to the daemon through a relay written in Python and run by the main
    thread: no call of the client (connect, open, put, lookup, stats, release, close) can be
    answered unless the main thread runs Python while the client thread waits in C++, which it
    cannot if that thread holds the GIL. Run in a subprocess, so that a regression fails on its
    timeout instead of hanging the suite.
    """
    script = textwrap.dedent(
        """
        import os, selectors, socket, sys, tempfile, threading
        import numpy as np, kvtier
        relay_dir = tempfile.TemporaryDirectory()  # removed when the script exits
        path = os.path.join(relay_dir.name, "relay.sock")
        server = socket.socket(socket.AF_UNIX)
        server.bind(path)
        server.listen()
        outcome = []
        def client():
            layout = kvtier.Layout("py/relay", 2, 2, 8, dtype="float32")
            with kvtier.Client(path) as c:
                space = c.open(layout)
                space.put("s", 0, list(range(32)), np.ones(layout.packed_shape(32), np.float32))
                with space.lookup(list(range(32))) as hit:
                    outcome.append(hit.matched_tokens)
                outcome.append(c.stats()["leases"]["read"])
        t = threading.Thread(target=client)
        t.start()
        downstream, _ = server.accept()
        upstream = socket.socket(socket.AF_UNIX)
        upstream.connect(sys.argv[1])
        peer = {downstream: upstream, upstream: downstream}
        relayed = 0
        with selectors.DefaultSelector() as selector:
            selector.register(downstream, selectors.EVENT_READ)
            selector.register(upstream, selectors.EVENT_READ)
            while True:                  # until the client closes: Python, on the main thread
                events = selector.select()
                data = b""
                for key, _ in events:
                    data = key.fileobj.recv(1 << 16)
                    if not data:
                        break
                    peer[key.fileobj].sendall(data)
                    relayed += len(data)
                if not data:
                    break
        upstream.close()
        downstream.close()
        t.join()
        print(outcome, relayed > 0)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script, daemon.socket],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == "[32, 0] True"


def test_threads_share_a_client(client: kvtier.Client, layout: kvtier.Layout) -> None:
    space = client.open(layout)
    errors = []

    def work(i: int) -> None:
        try:
            kv = packed(layout, 32, seed=i)
            name, tokens = f"thread-{i}", prompt(32)
            for _ in range(10):
                space.put(name, 0, tokens, kv)
                with space.get(name) as h:
                    np.testing.assert_array_equal(h.copy_to(), kv)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


@pytest.mark.parametrize("lane", [True, False])
def test_a_client_calling_without_pause_reconnects_within_a_second_of_the_daemons_return(
    daemon: Daemon, layout: kvtier.Layout, lane: bool
) -> None:
    with kvtier.Client(daemon.socket, client_name="pytest", lane=lane) as c:
        space = c.open(layout)
        tokens = prompt(32)
        kv = packed(layout, 32, seed=41)
        space.put("a", 0, tokens, kv)
        # The daemon crashes; a new one takes its socket a moment later. Meanwhile the loop never
        # pauses: every call fails fast, and none pushes the next attempt away.
        daemon.restart(signal.SIGKILL)
        back = time.monotonic()
        calls = 0
        while True:
            calls += 1
            try:
                with space.lookup(tokens) as hit:
                    matched = hit.matched_tokens
                break
            except kvtier.Unavailable:
                assert time.monotonic() - back < 10, f"no reconnection in 10 s of {calls} calls"
        assert time.monotonic() - back < 1.0, f"{calls} calls"
        assert c.reconnects == 1
        assert matched == 0  # a new daemon: its pool is new
        space.put("a", 0, tokens, kv)
        with space.lookup(tokens) as hit:
            np.testing.assert_array_equal(hit.copy_to(), kv)


# --- Installed package -------------------------------------------------------------------------


def test_importable_from_an_installed_prefix(daemon: Daemon, layout: kvtier.Layout) -> None:
    build = os.environ.get("KVTIER_BUILD_DIR")
    if not build:
        pytest.skip("KVTIER_BUILD_DIR is not set (run through ctest)")
    # Its own temporary directory, removed however the test ends (pytest's tmp_path outlives the
    # run: this pytest keeps the last three).
    with tempfile.TemporaryDirectory(prefix="kvtier-py-install-") as tmp:
        _install_and_import(daemon, build, pathlib.Path(tmp))


def _install_and_import(daemon: Daemon, build: str, tmp_path: pathlib.Path) -> None:
    prefix = tmp_path / "prefix"
    subprocess.run(
        [os.environ.get("KVTIER_CMAKE", "cmake"), "--install", build, "--prefix", str(prefix),
         "--component", "python"],
        check=True,
        capture_output=True,
    )
    site = prefix / f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
    script = textwrap.dedent(
        """
        import sys, numpy as np, kvtier
        print(kvtier.__file__)
        layout = kvtier.Layout("py/installed", 2, 2, 8, dtype="float32")
        with kvtier.Client(sys.argv[1]) as c:
            space = c.open(layout)
            kv = np.arange(np.prod(layout.packed_shape(16)), dtype=np.float32).reshape(
                layout.packed_shape(16))
            space.put("installed", 0, list(range(16)), kv)
            with space.lookup(list(range(16))) as hit:
                assert hit.matched_tokens == 16
                assert (hit.copy_to() == kv).all()
        print("ok")
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    out = subprocess.run(
        [sys.executable, "-c", script, daemon.socket],
        env=env,
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    file, ok = out.stdout.split()
    assert file.startswith(str(site)) and ok == "ok"
