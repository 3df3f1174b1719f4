"""Lifetimes in the kvtier Python package against real kvtierd processes: every touch of a
released handle's block raising, release, commit, abort and close refused while an array or
memoryview of the pool is alive (nothing changed), an exception leaving a `with` block not masked,
the pin kept until the last view, a closed client ending every handle.

Fixtures: conftest.py; helpers shared with the other *_test.py: testlib/kvtier_test_helpers.py.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import kvtier
from kvtier.testing import Daemon

from kvtier_test_helpers import leases, packed, prompt, wait_for_stats


def test_a_block_of_a_released_handle_raises_on_every_touch(
    client: kvtier.Client, layout: kvtier.Layout, seq: str
) -> None:
    space = client.open(layout)
    space.put(seq, 0, prompt(16), packed(layout, 16))
    h = space.get(seq)
    block = h.block(0)
    h.release()
    h.release()  # idempotent
    assert h.closed
    touches: tuple[Callable[[Any], object], ...] = (
        np.asarray,
        np.array,
        lambda b: b.numpy(),
        lambda b: h.block(0),
        lambda b: h.blocks(),
        lambda b: h.copy_to(),
    )
    for touch in touches:
        with pytest.raises(kvtier.Released):
            touch(block)
    # A Block is not itself a buffer (a consumer could keep it and drop the buffer): only its
    # counted views are.
    not_buffers: tuple[Callable[[Any], object], ...] = (
        memoryview, bytes, lambda b: np.frombuffer(b, dtype=np.uint8))
    for touch in not_buffers:
        with pytest.raises(TypeError):
            touch(block)
    assert leases(client) == (0, 0, 0)


def test_release_is_refused_while_an_array_is_alive(
    client: kvtier.Client, layout: kvtier.Layout, seq: str
) -> None:
    space = client.open(layout)
    kv = packed(layout, 16, seed=6)
    space.put(seq, 0, prompt(16), kv)
    h = space.get(seq)
    block = h.block(0)
    a = block.numpy()
    view = memoryview(np.asarray(block)[0])  # holds its array, which holds its view
    with pytest.raises(kvtier.BufferInUse) as refused:
        h.release()
    assert isinstance(refused.value, BufferError) and "2 view(s)" in str(refused.value)
    # Nothing changed: still open, still pinned, the bytes still the sequence's.
    assert not h.closed and leases(client)[0] == 1
    np.testing.assert_array_equal(a, kv)
    del a
    view.release()
    h.release()  # `block` is still referenced: a Block holds no memory
    assert leases(client) == (0, 0, 0)
    with pytest.raises(kvtier.Released):
        block.numpy()


def test_exit_with_a_live_view_raises_and_keeps_the_pin(
    client: kvtier.Client, layout: kvtier.Layout, seq: str
) -> None:
    space = client.open(layout)
    space.put(seq, 0, prompt(16), packed(layout, 16))
    with pytest.raises(kvtier.BufferInUse):
        with space.get(seq) as h:
            a = h.block(0).numpy()
    assert not h.closed and leases(client)[0] == 1
    a[...]  # still valid memory: the lease is still held
    del a
    h.release()
    assert leases(client) == (0, 0, 0)


def test_an_exception_leaving_a_with_block_is_not_masked_and_release_waits_for_views(
    client: kvtier.Client, layout: kvtier.Layout, seq: str
) -> None:
    space = client.open(layout)
    kv = packed(layout, 16, seed=7)
    space.put(seq, 0, prompt(16), kv)
    with pytest.raises(KeyError):
        with space.get(seq) as h:
            a = h.block(0).numpy()
            raise KeyError("engine failed")
    assert h.closed
    with pytest.raises(kvtier.Released):
        h.block(0)
    # The view still sees the pinned bytes; the pin goes with the last view.
    assert leases(client)[0] == 1
    np.testing.assert_array_equal(a, kv)
    del a
    assert leases(client) == (0, 0, 0)


def test_a_view_outliving_its_handle_object_keeps_the_bytes_pinned(
    client: kvtier.Client, layout: kvtier.Layout, seq: str
) -> None:
    space = client.open(layout)
    kv = packed(layout, 16, seed=8)
    space.put(seq, 0, prompt(16), kv)
    a = space.get(seq).block(0).numpy()  # the handle object is gone at once
    gc.collect()
    space.remove(seq)  # the sequence lets go of the block; the view's lease still pins it
    space.put("other", 0, prompt(16), packed(layout, 16, seed=9))
    np.testing.assert_array_equal(a, kv)
    assert leases(client)[0] == 1
    del a
    assert leases(client)[0] == 0


def test_commit_and_abort_are_refused_while_a_view_is_alive(
    client: kvtier.Client, layout: kvtier.Layout, seq: str
) -> None:
    space = client.open(layout)
    w = space.begin_put(seq, 0, prompt(16))
    a = w.block(0).numpy()
    a[...] = 3.0
    with pytest.raises(kvtier.BufferInUse):
        w.commit()
    with pytest.raises(kvtier.BufferInUse):
        w.abort()
    assert not w.closed and space.length(seq) is None
    del a
    assert w.commit().length == 16
    with pytest.raises(kvtier.Released):
        w.commit()
    with pytest.raises(kvtier.Released):
        w.block(0)


def test_an_exception_in_a_write_block_aborts(
    client: kvtier.Client, layout: kvtier.Layout, seq: str
) -> None:
    space = client.open(layout)
    tokens = prompt(32)
    with pytest.raises(RuntimeError):
        with space.begin_put(seq, 0, tokens) as w:
            w.write(0, 32, packed(layout, 32))
            raise RuntimeError("model crashed")
    assert w.closed
    assert space.length(seq) is None
    assert leases(client) == (0, 0, 0)
    with space.lookup(tokens) as hit:
        assert hit.matched_tokens == 0


def test_close_ends_every_handle_but_not_while_a_view_is_alive(
    daemon: Daemon, layout: kvtier.Layout, seq: str
) -> None:
    c = kvtier.Client(daemon.socket)
    space = c.open(layout)
    space.put(seq, 0, prompt(16), packed(layout, 16))
    space.put_entry(kvtier.content_key(seq.encode()), seq.encode())
    r = space.get(seq)
    w = space.begin_put(seq + "-w", 0, prompt(16))
    b = space.get_entry(kvtier.content_key(seq.encode()))
    a = b.numpy()
    with pytest.raises(kvtier.BufferInUse):
        c.close()
    assert not c.closed and c.stats()["leases"] == {"read": 2, "write": 1}
    del a
    c.close()
    c.close()  # idempotent
    assert c.closed and r.closed and w.closed and b.closed
    for call in (
        c.stats,
        lambda: c.open(layout),
        lambda: space.put(seq, 0, prompt(16), packed(layout, 16)),
        lambda: space.length(seq),
        lambda: r.block(0),
        lambda: r.copy_to(),
        lambda: w.commit(),
        lambda: w.write(0, 16, packed(layout, 16)),
        lambda: b.numpy(),
        lambda: space.get_entry(kvtier.content_key(seq.encode())),
        lambda: space.put_many([]),
    ):
        with pytest.raises(kvtier.Released):
            call()
    r.release()  # a no-op on an ended handle
    b.release()
    with kvtier.Client(daemon.socket) as other:
        stats = wait_for_stats(other, lambda s: s["leases"] == {"read": 0, "write": 0})
        assert stats["leases"] == {"read": 0, "write": 0} and stats["blocks"]["pinned"] == 0
        assert other.open(layout).length(seq + "-w") is None  # the write was aborted


def test_client_is_a_context_manager(daemon: Daemon, layout: kvtier.Layout) -> None:
    with kvtier.Client(daemon.socket) as c:
        assert c.daemon_version.startswith("kvtierd")
        space = c.open(layout)
        assert c.mapped  # open() mapped the pool
    assert c.closed
    with pytest.raises(kvtier.Released):
        space.length("x")
