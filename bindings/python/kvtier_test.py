"""Tests of the kvtier Python package against real kvtierd processes (fixtures: conftest.py)."""

from __future__ import annotations

import gc
import itertools
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pytest

import kvtier
from kvtier.testing import Daemon

if TYPE_CHECKING:
    from kvtier._kvtier import _SpaceStats, _Stats

try:
    import torch
except ImportError:  # the torch tests skip
    torch = None  # type: ignore[assignment]

needs_torch = pytest.mark.skipif(torch is None, reason="python3-torch is not installed")


def packed(layout: kvtier.Layout, tokens: int, seed: int = 0) -> npt.NDArray[Any]:
    """Random packed KV for `tokens` tokens of `layout`."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal(layout.packed_shape(tokens)).astype(layout.numpy_dtype)


_prompts = itertools.count(1)


def prompt(n: int) -> list[int]:
    """n token ids no other prompt of the run shares: blocks of equal tokens are shared in a
    namespace (a put of tokens already cached shares the cached block), so tests must not
    collide."""
    start = next(_prompts) * 100_000
    return list(range(start, start + n))


def leases(client: kvtier.Client) -> tuple[int, int, int]:
    stats = client.stats()
    return stats["leases"]["read"], stats["leases"]["write"], stats["blocks"]["pinned"]


def wait_for_stats(
    client: kvtier.Client, pred: Callable[[_Stats], bool], timeout_s: float = 10.0
) -> _Stats:
    """The daemon notices a closed connection asynchronously: polls stats() until pred holds (or
    the deadline passes) and returns the last ones."""
    deadline = time.monotonic() + timeout_s
    stats = client.stats()
    while not pred(stats) and time.monotonic() < deadline:
        time.sleep(0.005)
        stats = client.stats()
    return stats


def committed(results: list[kvtier.CommitInfo | kvtier.Error]) -> list[tuple[int, int]]:
    """(length, sealed_blocks) of each result of put_many, every one a CommitInfo."""
    assert all(isinstance(r, kvtier.CommitInfo) for r in results), results
    return [(r.length, r.sealed_blocks) for r in results if isinstance(r, kvtier.CommitInfo)]


def expected_block(
    kv: npt.NDArray[Any], block_index: int, layout: kvtier.Layout, first_position: int = 0
) -> npt.NDArray[Any]:
    """What block `block_index` must hold for packed `kv` starting at position first_position."""
    bt = layout.block_tokens
    begin = block_index * bt - first_position
    n = min(bt, kv.shape[2] - begin)
    return kv[:, :, begin : begin + n]


# --- Round trips -------------------------------------------------------------------------------


def test_put_then_get_round_trips_bytes_through_numpy_views(
    client: kvtier.Client, layout: kvtier.Layout, seq: str
) -> None:
    space = client.open(layout)
    kv = packed(layout, 40)
    info = space.put(seq, 0, prompt(40), kv)
    assert (info.length, info.sealed_blocks) == (40, 2)
    assert space.length(seq) == 40
    with space.get(seq) as h:
        assert (h.begin, h.end, h.matched_tokens, h.block_count) == (0, 40, 40, 3)
        assert not h.inline_data
        np.testing.assert_array_equal(h.copy_to(), kv)
        np.testing.assert_array_equal(h.copy_to(5, 21), kv[:, :, 5:21])
        # A range past the handle is refused before anything is allocated for it.
        for start, stop in ((0, 2**40), (0, 41), (39, 2**63)):
            with pytest.raises(kvtier.InvalidArgument, match="outside the handle"):
                h.copy_to(start, stop)
        for i, block in enumerate(h.blocks()):
            a = np.asarray(block)
            assert a.shape == layout.block_shape == block.shape
            assert a.dtype == np.float32 and not a.flags.writeable
            want = expected_block(kv, i, layout)
            np.testing.assert_array_equal(a[:, :, : want.shape[2]], want)
            assert block.first_position == 16 * i
            del a
        # Writing into a pinned, sealed block from Python is refused, not done.
        a = h.block(0).numpy()
        with pytest.raises(ValueError):
            a[0, 0, 0, 0, 0] = 1.0
        del a


def test_lookup_from_another_client_hits_the_longest_block_aligned_prefix(
    daemon: Daemon, client: kvtier.Client, layout: kvtier.Layout
) -> None:
    kv = packed(layout, 40, seed=1)
    tokens = prompt(40)
    client.open(layout).put("writer-A", 0, tokens, kv)
    with kvtier.Client(daemon.socket) as other:
        space = other.open(layout)
        shared_35 = tokens[:35] + [7, 8, 9, 10, 11]
        with space.lookup(shared_35) as hit:
            assert hit.matched_tokens == 32 and hit.block_count == 2
            for i, block in enumerate(hit.blocks()):
                np.testing.assert_array_equal(block.numpy(), expected_block(kv, i, layout))
        with space.lookup([1, 2, 3]) as miss:
            assert miss.matched_tokens == 0 and miss.block_count == 0
        with space.lookup(tokens, bind_seq="bound") as hit:
            assert hit.matched_tokens == 32
        assert space.length("bound") == 32


def test_write_handle_blocks_are_written_in_place(
    client: kvtier.Client, layout: kvtier.Layout, seq: str
) -> None:
    space = client.open(layout)
    kv = packed(layout, 20, seed=2)
    with space.begin_put(seq, 0, prompt(20)) as w:
        assert (w.begin, w.end, w.first_position, w.block_count) == (0, 20, 0, 2)
        for i, block in enumerate(w.blocks()):
            a = np.asarray(block)
            assert a.flags.writeable and a.shape == layout.block_shape
            want = expected_block(kv, i, layout)
            a[:, :, : want.shape[2]] = want
            del a
        assert space.length(seq) is None  # nothing visible before the commit
    # Leaving the block committed it.
    assert space.length(seq) == 20
    with space.get(seq) as h:
        np.testing.assert_array_equal(h.copy_to(), kv)


def test_write_handle_write_and_partial_commit(
    client: kvtier.Client, layout: kvtier.Layout, seq: str
) -> None:
    space = client.open(layout)
    kv = packed(layout, 24, seed=3)
    w = space.begin_put(seq, 0, prompt(24))
    w.write(0, 24, kv)
    with pytest.raises(kvtier.InvalidArgument):
        w.commit(up_to=99)  # a bad up_to leaves the handle open
    assert not w.closed
    info = w.commit(up_to=16)
    assert (info.length, info.sealed_blocks) == (16, 1) and w.closed
    with space.get(seq) as h:
        np.testing.assert_array_equal(h.copy_to(), kv[:, :, :16])


def test_put_many_stores_each_item_as_put_would(
    daemon: Daemon, client: kvtier.Client, layout: kvtier.Layout, seq: str
) -> None:
    s0, s1, s2, busy, bad = (seq + "-" + n for n in ("0", "1", "2", "busy", "bad"))
    t0, t1, t2 = prompt(24), prompt(40), prompt(16)
    kv0, kv1, kv2 = (packed(layout, n, seed=n) for n in (24, 40, 16))
    key = kvtier.content_key(b"put_many " + seq.encode())
    with kvtier.Client(daemon.socket, client_name="writer") as writer:
        space = writer.open(layout)
        w = space.begin_put(busy, 0, prompt(16))  # holds `busy`: a put of it conflicts
        results = space.put_many([
            (s0, 0, t0[:16], np.ascontiguousarray(kv0[:, :, :16])),
            kvtier.PutItem(s1, 0, t1, kv1, detached=True),
            kvtier.PutItem(s2, 0, t2, kv2, keys=[key]),
            kvtier.PutItem(busy, 0, prompt(16), kv2),
            kvtier.PutItem(bad, 5, prompt(16), kv2),  # begin past the end
            kvtier.PutItem(s0, 16, t0[16:], np.ascontiguousarray(kv0[:, :, 16:])),  # after item 0
        ])
        w.abort()
        # One result per item: a failure is returned, not raised, and stops no other item.
        assert committed(results[:3]) == [(16, 1), (40, 2), (16, 1)]
        assert isinstance(results[3], kvtier.Conflict) and results[3].retryable
        assert isinstance(results[4], kvtier.InvalidArgument) and results[4].code == 1
        assert committed(results[5:]) == [(24, 0)]
        assert space.length(bad) is None and space.length(busy) is None
        for name, kv in ((s0, kv0), (s1, kv1), (s2, kv2)):
            with space.get(name) as h:
                np.testing.assert_array_equal(h.copy_to(), kv)
        with client.open(layout).lookup_keys([key]) as hit:  # the item's own keys
            assert hit.matched_tokens == 16
    # detached=True: s1 outlives the writer's session; s0 and s2 go with it.
    wait_for_stats(client, lambda stats: stats["sequences"] == 1)
    space = client.open(layout)
    assert (space.length(s0), space.length(s1), space.length(s2)) == (None, 40, None)
    assert space.put_many([]) == []


def test_put_many_without_the_fast_lane_or_a_mapped_pool(
    daemon: Daemon, layout: kvtier.Layout, seq: str
) -> None:
    # Without a lane to pipeline over, the SDK puts one item after the other: same results.
    for k, c in enumerate(
        (kvtier.Client(daemon.socket, lane=False), kvtier.Client(daemon.socket, map_pool=False))
    ):
        with c:
            space = c.open(layout)
            items = [(f"{seq}-{k}-{n}", 0, prompt(n), packed(layout, n, seed=n)) for n in (20, 16)]
            results = space.put_many(items)
            assert committed(results) == [(20, 1), (16, 1)]
            for name, _, _, kv in items:
                with space.get(name) as h:
                    np.testing.assert_array_equal(h.copy_to(), kv)


def test_put_many_checks_every_item_before_sending_any(
    client: kvtier.Client, layout: kvtier.Layout, seq: str
) -> None:
    space = client.open(layout)
    b, kv = seq + "-b", packed(layout, 16)
    good = (seq, 0, prompt(16), kv)
    before = client.stats()
    bad: list[tuple[type[Exception], str, Any]] = [
        # (exception, message, the second item)
        (kvtier.InvalidArgument, r"items\[1\]\.kv has shape", (b, 0, prompt(16), kv[:, :, :15])),
        (kvtier.InvalidArgument, r"token 0 is -1", kvtier.PutItem(b, 0, [-1] * 16, kv)),
        (kvtier.InvalidArgument, r"16 bytes", kvtier.PutItem(b, 0, prompt(16), kv, keys=[b"k"])),
        (TypeError, r"items\[1\] must be", (b, 0, prompt(16))),
        (TypeError, r"items\[1\] must be", "not an item"),
        (TypeError, r"items\[1\]\.kv must be", (b, 0, prompt(16), kv.tolist())),
        (TypeError, r"items\[1\]\.tokens must be", (b, 0, "tokens", kv)),
        (TypeError, r"", (b, -1, prompt(16), kv)),
    ]
    for exception, message, item in bad:
        with pytest.raises(exception, match=message):
            space.put_many([good, item])
    with pytest.raises(TypeError):
        space.put_many(42)  # type: ignore[arg-type]
    # Nothing was sent: not even the good first item.
    assert space.length(seq) is None and space.length(b) is None
    after = client.stats()
    assert after["bytes"] == before["bytes"] and after["sequences"] == before["sequences"]


@needs_torch
def test_torch_from_numpy_shares_the_pool_memory(
    client: kvtier.Client, layout: kvtier.Layout, seq: str
) -> None:
    space = client.open(layout)
    with space.begin_put(seq, 0, prompt(16)) as w:
        a = w.block(0).numpy()
        t = torch.from_numpy(a)
        assert t.data_ptr() == a.ctypes.data
        t.fill_(1.5)
        t[1, 1] = -2.0
        del a, t
    with space.get(seq) as h:
        a = h.block(0).numpy()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # torch: "array is not writable"
            t = torch.from_numpy(a)
        assert t.data_ptr() == a.ctypes.data
        assert float(t[0, 0].min()) == 1.5 and float(t[1, 1].max()) == -2.0
        with pytest.raises(kvtier.BufferInUse):
            h.release()  # the tensor alone keeps the view alive
        del a
        with pytest.raises(kvtier.BufferInUse):
            h.release()
        del t
    assert h.closed


@needs_torch
def test_torch_frombuffer_of_a_block_array_keeps_the_handle_open(
    client: kvtier.Client, layout: kvtier.Layout, seq: str
) -> None:
    # torch.frombuffer lets go of the buffer at once and keeps a reference to the object it was
    # given: the array, which holds its counted view.
    space = client.open(layout)
    kv = packed(layout, 16, seed=10)
    space.put(seq, 0, prompt(16), kv)
    h = space.get(seq)
    block = h.block(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch: "buffer is not writable"
        t = torch.frombuffer(block.numpy(), dtype=torch.float32)
        with pytest.raises((TypeError, ValueError)):
            torch.frombuffer(block, dtype=torch.float32)  # a Block is not a buffer
    with pytest.raises(kvtier.BufferInUse):
        h.release()
    assert torch.equal(t, torch.from_numpy(kv.reshape(-1)))
    del t
    h.release()
    assert leases(client) == (0, 0, 0)


def test_inline_client_moves_bytes_in_messages(
    daemon: Daemon, layout: kvtier.Layout, seq: str
) -> None:
    with kvtier.Client(daemon.socket, map_pool=False) as c:
        assert not c.mapped
        space = c.open(layout)
        kv = packed(layout, 20, seed=4)
        with space.begin_put(seq, 0, prompt(20)) as w:
            with pytest.raises(kvtier.NotSupported):
                w.block(0)
            w.write(0, 20, kv)
        with space.get(seq) as h:
            assert h.inline_data
            np.testing.assert_array_equal(h.copy_to(), kv)
            np.testing.assert_array_equal(h.block(0).numpy(), kv[:, :, :16])
        # Blobs travel in the messages too; the handle's array is its private copy.
        key = kvtier.content_key(kv)
        space.put_entry(key, kv)
        with space.get_entry(key) as e:
            np.testing.assert_array_equal(e.numpy().view(kv.dtype), kv.reshape(-1))


def test_sequence_operations(client: kvtier.Client, layout: kvtier.Layout, seq: str) -> None:
    space = client.open(layout)
    kv = packed(layout, 40, seed=5)
    space.put(seq, 0, prompt(40), kv)
    space.copy_prefix(seq, seq + "-copy", 20)
    assert space.length(seq + "-copy") == 20
    space.truncate(seq, 30)
    assert space.length(seq) == 30
    assert space.can_resume(seq, 30) and not space.can_resume(seq, 31)
    snap = space.snapshot(seq, 16)
    assert (snap.start, snap.end) == (16, 30)
    space.remove(seq, 16)
    assert space.length(seq) == 16
    space.restore(seq, snap.id, 30)
    with space.get(seq) as h:
        np.testing.assert_array_equal(h.copy_to(), kv[:, :, :30])
    space.drop_snapshot(snap.id)
    space.remove(seq)
    assert space.length(seq) in (0, None)  # emptied (the daemon may forget an empty sequence)


def test_snapshots_split_merge_info_and_rewind(
    client: kvtier.Client, layout: kvtier.Layout, seq: str
) -> None:
    space = client.open(layout)
    kv = packed(layout, 48, seed=7)
    space.put(seq, 0, prompt(48), kv)
    whole = space.snapshot(seq)
    head, tail = space.split_snapshot(whole.id, 16)
    assert (head.start, head.end, tail.start, tail.end) == (0, 16, 16, 48)
    merged = space.merge_snapshots(head.id, tail.id)
    assert (merged.start, merged.end) == (0, 48)
    info = space.snapshot_info(merged.id)
    assert (info.id, info.start, info.end) == (merged.id, 0, 48)
    # The merged snapshot restores the bytes the sequence held.
    space.restore(seq + "-merged", merged.id, 48)
    with space.get(seq + "-merged") as h:
        np.testing.assert_array_equal(h.copy_to(), kv)
    # Snapshots that do not meet are not merged; an unknown one is not found: nothing changed.
    with pytest.raises(kvtier.InvalidArgument):
        space.merge_snapshots(tail.id, head.id)
    with pytest.raises(kvtier.NotFound):
        space.snapshot_info(10**12)
    assert space.snapshot_info(head.id).end == 16
    # rewind: back without a snapshot; never forward.
    space.rewind(seq, 20)
    assert space.length(seq) == 20
    with pytest.raises(kvtier.InvalidArgument):
        space.rewind(seq, 30)
    assert space.length(seq) == 20
    with space.get(seq) as h:
        np.testing.assert_array_equal(h.copy_to(), kv[:, :, :20])
    for snap in (whole, head, tail, merged):
        space.drop_snapshot(snap.id)


def test_recurrent_state_checkpoints(
    client: kvtier.Client, layout: kvtier.Layout, seq: str
) -> None:
    space = client.open(layout)
    space.put(seq, 0, prompt(32), packed(layout, 32, seed=8))
    state = np.arange(64, dtype=np.float32)
    space.put_checkpoint(seq, 16, state)  # any bytes-like object
    space.put_checkpoint(seq, 32, state.tobytes())
    assert space.checkpoints(seq) == [16, 32]
    snap = space.snapshot(seq)
    assert list(snap.checkpoints) == [16, 32]
    # A snapshot with checkpoints cannot be split; bad checkpoints change nothing.
    with pytest.raises(kvtier.NotSupported):
        space.split_snapshot(snap.id, 16)
    with pytest.raises(kvtier.InvalidArgument):
        space.put_checkpoint(seq, 40, b"past the end")
    with pytest.raises(TypeError):
        space.put_checkpoint(seq, 16, "text")  # type: ignore[arg-type]
    with pytest.raises(kvtier.InvalidArgument):
        space.put_checkpoint(seq, 16, np.arange(8, dtype=np.float32)[::2])  # not contiguous
    assert space.checkpoints(seq) == [16, 32]
    # A recurrent sequence rewinds only to a checkpoint.
    with pytest.raises(kvtier.InvalidArgument):
        space.rewind(seq, 20)
    space.rewind(seq, 16)
    assert space.length(seq) == 16
    space.drop_snapshot(snap.id)


# --- Blobs: checkpoints and entries ------------------------------------------------------------


def test_entries_are_read_in_place_by_every_client_of_the_layout(
    daemon: Daemon, client: kvtier.Client, layout: kvtier.Layout
) -> None:
    space = client.open(layout)
    data = np.arange(1000, dtype=np.float32)  # an image embedding, say
    key = kvtier.content_key(data)
    space.put_entry(key, data)
    space.put_entry(key, b"other bytes")  # a key that exists keeps its bytes
    assert client.stats()["entries"] == 1
    with kvtier.Client(daemon.socket, client_name="other") as other:
        ospace = other.open(layout)
        with ospace.get_entry(key) as h, ospace.get_entry(key) as again:
            assert isinstance(h, kvtier.BlobHandle) and h.nbytes == data.nbytes and not h.closed
            a = h.numpy()
            assert a.dtype == np.uint8 and a.shape == (data.nbytes,) and not a.flags.writeable
            with pytest.raises(ValueError):
                a[0] = 1  # the pool's bytes are not written through a read lease
            view = a.data  # memoryview(a)
            assert view.readonly and view.nbytes == data.nbytes
            np.testing.assert_array_equal(np.frombuffer(view, np.float32), data)
            np.testing.assert_array_equal(a.view(np.float32), data)
            # No copy: every array, of either handle, is the one pool block.
            b = np.asarray(again)
            assert a.ctypes.data == np.frombuffer(view, np.uint8).ctypes.data == b.ctypes.data
            assert h.tobytes() == data.tobytes()
            del view, a, b
        assert h.closed and again.closed
        with pytest.raises(kvtier.NotFound):  # the package's miss, as get() of no sequence
            ospace.get_entry(kvtier.content_key(b"never stored"))
    assert leases(client) == (0, 0, 0)


def test_get_checkpoint_reads_a_recurrent_state_back(
    client: kvtier.Client, layout: kvtier.Layout, seq: str
) -> None:
    space = client.open(layout)
    space.put(seq, 0, prompt(32), packed(layout, 32, seed=13))
    state = np.random.default_rng(13).standard_normal(300).astype(np.float32)
    space.put_checkpoint(seq, 16, state)
    space.put_checkpoint(seq, 32, state[::-1].copy())
    with space.get_checkpoint(seq, 16) as at16, space.get_checkpoint(seq, 32) as at32:
        assert at16.nbytes == state.nbytes
        np.testing.assert_array_equal(np.frombuffer(at16.numpy(), np.float32), state)
        np.testing.assert_array_equal(at32.numpy().view(np.float32), state[::-1])
    for pos_of in ((seq, 8), (seq, 48), (seq + "-none", 0)):
        with pytest.raises(kvtier.NotFound):
            space.get_checkpoint(*pos_of)
    assert leases(client) == (0, 0, 0)


def test_bad_blob_input_raises_and_changes_nothing(
    client: kvtier.Client, layout: kvtier.Layout, seq: str
) -> None:
    space = client.open(layout)
    space.put(seq, 0, prompt(16), packed(layout, 16))
    key = kvtier.content_key(seq.encode())
    before = client.stats()
    bad: list[tuple[type[Exception], Callable[[], object]]] = [
        (kvtier.InvalidArgument, lambda: space.put_entry(b"short", b"data")),
        (kvtier.InvalidArgument, lambda: space.put_entry(key, b"")),  # a blob is >= 1 byte
        (kvtier.InvalidArgument, lambda: space.put_entry(key, np.arange(8.0)[::2])),
        (TypeError, lambda: space.put_entry(key, "text")),  # type: ignore[arg-type]
        (TypeError, lambda: space.put_entry(key.hex()[:16], b"data")),  # type: ignore[arg-type]
        (TypeError, lambda: space.put_entry(key, None)),  # type: ignore[arg-type]
        (kvtier.InvalidArgument, lambda: space.get_entry(bytes(15))),
        (TypeError, lambda: space.get_entry(None)),  # type: ignore[arg-type]
        (TypeError, lambda: space.get_checkpoint(seq, -1)),
        (TypeError, lambda: space.get_checkpoint(None, 0)),  # type: ignore[arg-type]
        (kvtier.NotFound, lambda: space.get_entry(key)),
    ]
    for exception, call in bad:
        with pytest.raises(exception):
            call()
    after = client.stats()
    assert after["entries"] == before["entries"] == 0 and after["bytes"] == before["bytes"]
    assert after["checkpoints"] == before["checkpoints"] and leases(client) == (0, 0, 0)


def test_a_blob_view_cannot_outlive_its_handle(
    client: kvtier.Client, layout: kvtier.Layout
) -> None:
    space = client.open(layout)
    data = b"recurrent state " * 64
    key = kvtier.content_key(data)
    space.put_entry(key, data)
    h = space.get_entry(key)
    # The handle is not itself a buffer (a consumer could keep it and drop the buffer): only
    # its counted views are.
    not_buffers: tuple[Callable[[Any], object], ...] = (
        memoryview, bytes, lambda o: np.frombuffer(o, np.uint8))
    for touch in not_buffers:
        with pytest.raises(TypeError):
            touch(h)
    a = h.numpy()
    words = h.numpy().view(np.uint32)  # holds its array, which holds its view
    view = np.asarray(h)[16:].data  # a memoryview: likewise
    with pytest.raises(kvtier.BufferInUse) as refused:
        h.release()
    assert "3 view(s)" in str(refused.value)
    with pytest.raises(kvtier.BufferInUse):
        client.close()
    # Nothing changed: still open, still pinned, the bytes still the entry's.
    assert not h.closed and leases(client)[0] == 1
    assert a.tobytes() == words.tobytes() == data and bytes(view) == data[16:]
    del a, words
    with pytest.raises(kvtier.BufferInUse):
        h.release()
    view.release()
    h.release()
    h.release()  # idempotent
    assert h.closed and leases(client) == (0, 0, 0)
    touches: tuple[Callable[[], object], ...] = (h.numpy, h.tobytes, lambda: np.asarray(h))
    for touch in touches:
        with pytest.raises(kvtier.Released):
            touch()
    # An exception leaving the `with` block is not masked; the pin goes with the last view.
    with pytest.raises(KeyError):
        with space.get_entry(key) as h:
            a = h.numpy()
            raise KeyError("engine failed")
    assert h.closed and leases(client)[0] == 1
    if torch is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # torch: "buffer is not writable"
            t = torch.frombuffer(a, dtype=torch.uint8)  # keeps the array
        del a
        assert leases(client)[0] == 1 and bytes(t.numpy()) == data
        del t
    else:
        assert a.tobytes() == data
        del a
    assert leases(client) == (0, 0, 0)
    # The handle object may go first: the array keeps the lease.
    a = space.get_entry(key).numpy()
    gc.collect()
    assert leases(client)[0] == 1 and a.tobytes() == data
    del a
    assert leases(client) == (0, 0, 0)


def test_lookup_keys_finds_blocks_put_with_the_engines_own_keys(
    daemon: Daemon, client: kvtier.Client, layout: kvtier.Layout, seq: str
) -> None:
    space = client.open(layout)
    kv = packed(layout, 40, seed=9)
    keys = [kvtier.content_key(b"block %d of " % i + seq.encode()) for i in range(2)]
    assert all(isinstance(k, bytes) and len(k) == 16 for k in keys)
    assert kvtier.content_key(b"x") == kvtier.content_key(bytearray(b"x"))
    space.put(seq, 0, prompt(40), kv, keys=keys)  # completes two blocks
    with kvtier.Client(daemon.socket, client_name="other") as other:
        ospace = other.open(layout)
        with ospace.lookup_keys(keys + [kvtier.content_key(b"not cached")]) as hit:
            assert hit.matched_tokens == 32
            np.testing.assert_array_equal(hit.copy_to(), kv[:, :, :32])
        # The match ends at the first key not cached (the engine's keys chain its blocks).
        with ospace.lookup_keys([kvtier.content_key(b"not cached")] + keys) as miss:
            assert miss.matched_tokens == 0
    # A sequence the lookup binds takes the window it is given: positions before it are gone.
    with space.lookup_keys(keys, bind_seq=seq + "-bound", window=16) as hit:
        assert hit.matched_tokens == 32
    assert space.length(seq + "-bound") == 32
    assert space.can_resume(seq + "-bound", 32) and not space.can_resume(seq + "-bound", 16)
    with pytest.raises(kvtier.InvalidArgument):
        space.lookup_keys([b"short"])
    with pytest.raises(TypeError):
        space.lookup_keys(b"0123456789abcdef")  # type: ignore[arg-type]
    with pytest.raises(kvtier.InvalidArgument):
        space.put(seq + "-bad", 0, prompt(40), kv, keys=keys[:1])  # two blocks, one key
    assert space.length(seq + "-bad") is None


# --- Prefix states ------------------------------------------------------------------------------


def state_bytes(layout: kvtier.Layout, seed: int) -> npt.NDArray[np.uint8]:
    """A random recurrent state for `layout`."""
    return np.random.default_rng(seed).integers(0, 256, layout.state_bytes, dtype=np.uint8)


def test_a_lookup_restores_at_the_deepest_cached_state(
    daemon: Daemon, client: kvtier.Client, state_layout: kvtier.Layout, seq: str
) -> None:
    space = client.open(state_layout)
    tokens = prompt(48)
    kv = packed(state_layout, 48, seed=21)
    space.put(seq, 0, tokens, kv)
    at32, at40 = state_bytes(state_layout, 32), state_bytes(state_layout, 40)
    space.put_state(tokens[:32], at32.tobytes())  # at a block boundary: any bytes-like object
    # Inside a block: with the KV of the 8 positions past the last whole block.
    space.put_state(tokens[:40], at40, partial_kv=np.ascontiguousarray(kv[:, :, 32:40]))
    with kvtier.Client(daemon.socket, client_name="other") as other:
        ospace = other.open(state_layout)
        with ospace.lookup(tokens + [7, 8, 9]) as hit:
            assert (hit.matched_tokens, hit.begin, hit.end, hit.first_position) == (40, 0, 40, 0)
            assert hit.has_state and hit.partial_tokens == 8 and hit.block_count == 3
            state = hit.read_state()
            assert state.dtype == np.uint8 and state.shape == (1000,)
            np.testing.assert_array_equal(state, at40)
            # The partial KV is in the first slots of the last block; copy_to reads it.
            np.testing.assert_array_equal(hit.copy_to(), kv[:, :, :40])
            np.testing.assert_array_equal(hit.copy_to(30, 40), kv[:, :, 30:40])
            last = hit.block(2).numpy()
            np.testing.assert_array_equal(last[:, :, :8], kv[:, :, 32:40])
            del last
            # Into a buffer of the caller's: any writable one of exactly state_bytes bytes.
            words = np.empty(250, np.float32)
            assert hit.read_state(words) is words
            assert words.tobytes() == at40.tobytes()
            raw = bytearray(1000)
            assert hit.read_state(raw) is raw and bytes(raw) == at40.tobytes()
            wrong_sizes: tuple[bytearray | npt.NDArray[np.uint8], ...] = (
                bytearray(999), np.empty(1001, np.uint8))
            for wrong in wrong_sizes:
                with pytest.raises(kvtier.InvalidArgument, match="state is 1000"):
                    hit.read_state(wrong)
            with pytest.raises(kvtier.InvalidArgument, match="read-only"):
                hit.read_state(bytes(1000))  # type: ignore[call-overload]
        # A prompt that stops short of position 40: the state at the boundary before it.
        with ospace.lookup(tokens[:39]) as hit:
            assert (hit.matched_tokens, hit.partial_tokens, hit.block_count) == (32, 0, 2)
            np.testing.assert_array_equal(hit.read_state(), at32)
            np.testing.assert_array_equal(hit.copy_to(), kv[:, :, :32])
        with ospace.lookup(tokens[:31]) as miss:  # no state at or before position 31
            assert (miss.matched_tokens, miss.block_count, miss.has_state) == (0, 0, False)
    # A client that moves bytes inline reads the same state and KV.
    with kvtier.Client(daemon.socket, client_name="inline", map_pool=False) as inline:
        with inline.open(state_layout).lookup(tokens) as hit:
            assert hit.inline_data and hit.matched_tokens == 40 and hit.partial_tokens == 8
            np.testing.assert_array_equal(hit.read_state(), at40)
            np.testing.assert_array_equal(hit.copy_to(), kv[:, :, :40])
    # Binding a sequence matches whole blocks alone, without a state.
    with space.lookup(tokens, bind_seq=seq + "-bound") as bound:
        assert bound.matched_tokens == 48 and not bound.has_state
        with pytest.raises(kvtier.NotFound):
            bound.read_state()
    with space.get(seq) as h:
        assert not h.has_state and h.partial_tokens == 0
    h.release()
    with pytest.raises(kvtier.Released):
        h.read_state()
    assert leases(client) == (0, 0, 0)


def test_a_lookup_without_a_cached_state_matches_nothing(
    client: kvtier.Client, state_layout: kvtier.Layout, seq: str
) -> None:
    space = client.open(state_layout)
    tokens = prompt(48)
    kv = packed(state_layout, 48, seed=22)
    space.put(seq, 0, tokens, kv)
    with space.get(seq) as h:  # the blocks are there
        assert h.block_count == 3
    # Blocks without their state cannot restore a recurrent model: a miss, nothing pinned.
    with space.lookup(tokens) as miss:
        assert miss.matched_tokens == 0 and miss.block_count == 0 and not miss.has_state
        with pytest.raises(kvtier.NotFound):
            miss.read_state()
    # A state after other tokens does not help.
    space.put_state(prompt(16), state_bytes(state_layout, 22))
    with space.lookup(tokens) as miss:
        assert miss.matched_tokens == 0
    # The engine's own keys: lookup_keys answers the deepest block boundary with a state.
    keys = [kvtier.content_key(b"state block %d of " % i + seq.encode()) for i in range(2)]
    space.put(seq + "-keyed", 0, prompt(32), kv[:, :, :32].copy(), keys=keys)
    with space.lookup_keys(keys) as miss:
        assert miss.matched_tokens == 0
    after16 = state_bytes(state_layout, 16)
    space.put_state_keys(keys[:1], after16)
    with space.lookup_keys(keys) as hit:
        assert hit.matched_tokens == 16 and hit.has_state and hit.partial_tokens == 0
        np.testing.assert_array_equal(hit.read_state(), after16)
        np.testing.assert_array_equal(hit.copy_to(), kv[:, :, :16])
    assert leases(client) == (0, 0, 0)


def test_a_layout_without_kv_caches_states_only(client: kvtier.Client) -> None:
    ssm = kvtier.Layout("py/ssm", num_layers=0, num_kv_heads=0, head_dim=0, state_bytes=5000)
    assert not ssm.has_kv and ssm.has_state and ssm.state_bytes == 5000
    assert ssm.block_bytes == 0 and ssm.packed_shape(3) == (0, 2, 3, 0, 0)
    assert repr(ssm).endswith("block_tokens=16, state_bytes=5000)")
    with pytest.raises(kvtier.InvalidArgument):
        kvtier.Layout("py/ssm", 0, 0, 0)  # no KV and no state
    space = client.open(ssm)
    tokens = prompt(48)
    with pytest.raises(kvtier.InvalidArgument, match="no KV"):
        space.put("ssm", 0, tokens, np.empty(ssm.packed_shape(48), ssm.numpy_dtype))
    at20, at37 = state_bytes(ssm, 20), state_bytes(ssm, 37)
    space.put_state(tokens[:20], at20)  # no partial KV: the model has none
    space.put_state(tokens[:37], at37)
    with space.lookup(tokens) as hit:
        assert hit.matched_tokens == 37 and hit.has_state and hit.block_count == 0
        assert hit.partial_tokens == 0
        np.testing.assert_array_equal(hit.read_state(), at37)
        assert hit.copy_to().shape == (0, 2, 37, 0, 0)
    with space.lookup(tokens[:36]) as hit:
        assert hit.matched_tokens == 20
        np.testing.assert_array_equal(hit.read_state(), at20)
    assert leases(client) == (0, 0, 0)


def test_a_bad_state_raises_and_stores_nothing(
    client: kvtier.Client, layout: kvtier.Layout, state_layout: kvtier.Layout
) -> None:
    space = client.open(state_layout)
    tokens = prompt(40)
    kv = packed(state_layout, 40, seed=23)
    space.put("bad-state", 0, tokens, kv)
    good = state_bytes(state_layout, 23)
    partial = np.ascontiguousarray(kv[:, :, 32:40])
    before = client.stats()
    bad: list[tuple[type[Exception], Callable[[], object]]] = [
        (kvtier.InvalidArgument, lambda: space.put_state(tokens[:32], good[:999])),
        (kvtier.InvalidArgument, lambda: space.put_state(tokens[:32], bytes(1001))),
        (kvtier.InvalidArgument, lambda: space.put_state(tokens[:40], good[:999], partial)),
        (kvtier.InvalidArgument, lambda: space.put_state(tokens[:40], good)),  # no partial_kv
        (kvtier.InvalidArgument, lambda: space.put_state(tokens[:39], good, partial)),
        (kvtier.InvalidArgument, lambda: space.put_state(tokens[:32], good, partial)),
        (kvtier.InvalidArgument, lambda: space.put_state(tokens[:40], good, kv[:, :, 32:40])),
        (kvtier.InvalidArgument,
         lambda: space.put_state(tokens[:40], good, partial.astype(np.float16))),
        (kvtier.InvalidArgument, lambda: space.put_state([], good)),
        (kvtier.InvalidArgument, lambda: space.put_state([-1] * 32, good)),
        (kvtier.InvalidArgument, lambda: space.put_state(tokens[:32], good[::2])),
        (TypeError, lambda: space.put_state(tokens[:32], "text")),  # type: ignore[arg-type]
        (TypeError, lambda: space.put_state(tokens[:32], None)),  # type: ignore[arg-type]
        (kvtier.InvalidArgument, lambda: space.put_state_keys([], good)),
        (kvtier.InvalidArgument, lambda: space.put_state_keys([bytes(16)], good[:10])),
        (kvtier.InvalidArgument, lambda: space.put_state_keys([b"short"], good)),
        # A layout without a state has none to store.
        (kvtier.InvalidArgument,
         lambda: client.open(layout).put_state(tokens[:32], bytes(layout.state_bytes))),
    ]
    for exception, call in bad:
        with pytest.raises(exception):
            call()
    after = client.stats()
    assert after["blocks"]["used"] == before["blocks"]["used"]
    assert after["bytes"]["put"] == before["bytes"]["put"] and leases(client) == (0, 0, 0)
    with space.lookup(tokens) as miss:
        assert miss.matched_tokens == 0


def test_read_state_refuses_a_state_whose_pool_bytes_changed(
    daemon: Daemon, client: kvtier.Client, state_layout: kvtier.Layout, seq: str
) -> None:
    space = client.open(state_layout)
    tokens = prompt(32)
    space.put(seq, 0, tokens, packed(state_layout, 32, seed=24))
    state = state_bytes(state_layout, 24)
    space.put_state(tokens, state)
    with space.lookup(tokens) as hit:
        chunk = hit.refs[-1]  # the state's one chunk, after the two blocks
        assert hit.has_state and len(hit.refs) == 3
        segment = os.path.join("/dev/shm", (daemon.segment_prefix or "") + str(chunk.extent))
        if not os.path.exists(segment):
            pytest.skip("the pool is on huge pages: its memory has no name to write through")
        # A fault in the pool (here: another process writing its memory) changes a state byte.
        with open(segment, "r+b") as f:
            f.seek(chunk.offset + 10)
            f.write(bytes([state[10] ^ 0xFF]))
        try:
            with pytest.raises(kvtier.ChecksumMismatch, match="differs from what its writer"):
                hit.read_state()
        finally:
            with open(segment, "r+b") as f:
                f.seek(chunk.offset + 10)
                f.write(bytes([state[10]]))
        np.testing.assert_array_equal(hit.read_state(), state)


def test_block_refs_read_back_until_their_block_is_reused(
    small_daemon: Daemon, layout: kvtier.Layout, seq: str
) -> None:
    with kvtier.Client(small_daemon.socket) as client:
        space = client.open(layout)
        kv = packed(layout, 48, seed=12)
        space.put(seq, 0, prompt(48), kv)
        with space.get(seq) as h:
            refs = h.refs
        assert len(refs) == 3 and all(isinstance(r, kvtier.BlockRef) for r in refs)
        assert refs[0].bytes == layout.block_bytes
        # Read back after the handle is gone: the bytes of the blocks, in order.
        blocks = space.read_refs(refs)
        for i, b in enumerate(blocks):
            assert b == expected_block(kv, i, layout).tobytes()
        space.remove(seq)
        # Fill the 1 MiB pool (256 blocks) several times over: the blocks are reused, and their
        # references are stale — refused, never another block's bytes.
        for n in range(40):
            space.put("%s-fill-%d" % (seq, n), 0, prompt(256), packed(layout, 256, seed=n))
            space.remove("%s-fill-%d" % (seq, n))
        with pytest.raises(kvtier.StaleReference):
            space.read_refs(refs)
        forged = kvtier.BlockRef(extent=refs[0].extent, offset=refs[0].offset + 1,
                                 bytes=refs[0].bytes, generation=refs[0].generation)
        with pytest.raises((kvtier.StaleReference, kvtier.InvalidArgument)):
            space.read_refs([forged])


# --- GPU: spaces on a device, paged copies ---------------------------------------------------


def test_a_daemon_without_gpu_pools_opens_host_spaces_only(
    client: kvtier.Client, layout: kvtier.Layout
) -> None:
    assert client.devices == []  # the test daemons run with --gpus none
    assert client.open(layout).device is None
    # NotSupported from a client built without CUDA.
    with pytest.raises((kvtier.InvalidArgument, kvtier.NotSupported)):
        client.open(layout, device=0)
    with pytest.raises(kvtier.InvalidArgument):
        client.open(layout, device=-1)


def paged_cache(
    layers: int = 2, shape: tuple[int, ...] = (4, 16, 2, 8), dtype: torch.dtype | None = None
) -> kvtier.PagedKvCache:
    """A paged cache of CPU tensors (a GPU one needs a device), zeros."""
    dtype = dtype or torch.float32
    return kvtier.PagedKvCache(
        [torch.zeros(shape, dtype=dtype) for _ in range(layers)],
        [torch.zeros(shape, dtype=dtype) for _ in range(layers)],
    )


@needs_torch
def test_paged_copies_check_their_arguments_and_change_nothing(
    client: kvtier.Client, layout: kvtier.Layout, seq: str
) -> None:
    space = client.open(layout)
    kv = packed(layout, 32, seed=14)
    space.put(seq, 0, prompt(32), kv)
    cache = paged_cache()
    assert (cache.block_tokens, len(cache.keys), len(cache.values)) == (16, 2, 2)
    assert kvtier.PagedKvCache(cache.keys, cache.values).block_tokens == 16
    r = space.get(seq)
    w = space.begin_put(seq + "-w", 0, prompt(32))
    other = client.open(layout)
    before = client.stats()
    bad: list[tuple[type[Exception], Callable[[], object]]] = [
        # A cache that is not one.
        (kvtier.InvalidArgument, lambda: kvtier.PagedKvCache(cache.keys, cache.values[:1])),
        (kvtier.InvalidArgument, lambda: kvtier.PagedKvCache([], [])),
        (kvtier.InvalidArgument, lambda: paged_cache(shape=(4, 16, 16))),
        (kvtier.InvalidArgument, lambda: kvtier.PagedKvCache(
            cache.keys, [cache.values[0], torch.zeros((4, 2, 16, 8)).transpose(1, 2)])),
        (kvtier.InvalidArgument, lambda: kvtier.PagedKvCache(
            cache.keys, [cache.values[0], torch.zeros((4, 16, 2, 8), dtype=torch.float16)])),
        (TypeError, lambda: kvtier.PagedKvCache(
            [np.zeros((4, 16, 2, 8))] * 2, cache.values)),  # type: ignore[list-item]
        (TypeError, lambda: kvtier.PagedKvCache("keys", cache.values)),  # type: ignore[arg-type]
        # A cache that does not fit the layout.
        (kvtier.InvalidArgument, lambda: space.put_paged(
            seq, 0, prompt(32), paged_cache(3), [0, 1])),
        (kvtier.InvalidArgument, lambda: space.put_paged(
            seq, 0, prompt(32), paged_cache(shape=(4, 16, 1, 8)), [0, 1])),
        (kvtier.InvalidArgument, lambda: space.put_paged(
            seq, 0, prompt(32), paged_cache(dtype=torch.float16), [0, 1])),
        (kvtier.InvalidArgument, lambda: space.gather_to(r, 0, 32, paged_cache(3), [0, 1])),
        (kvtier.InvalidArgument, lambda: space.scatter_to(w, 0, 32, paged_cache(3), [0, 1])),
        # Bad block tables, streams, handles.
        (kvtier.InvalidArgument, lambda: space.put_paged(seq, 0, prompt(32), cache, [-1, 0])),
        (TypeError, lambda: space.put_paged(
            seq, 0, prompt(32), cache, "01")),  # type: ignore[arg-type]
        (TypeError, lambda: space.gather_to(r, 0, 32, cache, [0.5, 1])),  # type: ignore[list-item]
        (TypeError, lambda: space.gather_to(
            r, 0, 32, cache, [0, 1], stream="default")),  # type: ignore[arg-type]
        (OverflowError, lambda: space.gather_to(r, 0, 32, cache, [0, 1], stream=-1)),
        (kvtier.InvalidArgument, lambda: other.gather_to(r, 0, 32, cache, [0, 1])),
        (TypeError, lambda: space.gather_to(w, 0, 32, cache, [0, 1])),  # type: ignore[arg-type]
        (TypeError, lambda: space.scatter_to(r, 0, 32, cache, [0, 1])),  # type: ignore[arg-type]
        # A table naming an engine block the cache does not have.
        (kvtier.InvalidArgument, lambda: space.put_paged(seq, 0, prompt(32), cache, [0, 4])),
    ]
    for exception, call in bad:
        with pytest.raises(exception):
            call()
    w.abort()
    r.release()
    for call in (
        lambda: space.gather_to(r, 0, 32, cache, [0, 1]),
        lambda: space.scatter_to(w, 0, 32, cache, [0, 1]),
    ):
        with pytest.raises(kvtier.Released):
            call()
    after = client.stats()  # no bytes moved, no sequence made
    assert (after["bytes"]["put"], after["bytes"]["got"], after["sequences"]) == (
        before["bytes"]["put"], before["bytes"]["got"], before["sequences"])
    assert leases(client) == (0, 0, 0) and space.length(seq + "-p") is None
    with space.get(seq) as h:
        np.testing.assert_array_equal(h.copy_to(), kv)


def engine_rows(keys: list[torch.Tensor], values: list[torch.Tensor], table: list[int],
                n: int) -> npt.NDArray[Any]:
    """Positions [0, n) of an engine's paged cache (per-layer K and V tensors of 16-token blocks)
    under `table`, packed as kvtier packs KV: [layer][K|V][token][kv head][head dim]."""
    planes = []
    for k, v in zip(keys, values):
        for t in (k, v):
            planes.append(np.stack([t[table[p // 16], p % 16].numpy() for p in range(n)]))
    return np.stack(planes).reshape(len(keys), 2, n, *planes[0].shape[1:])


@needs_torch
def test_paged_copies_move_bytes_between_a_cpu_paged_cache_and_the_pool(
    client: kvtier.Client, layout: kvtier.Layout, seq: str
) -> None:
    space = client.open(layout)
    torch.manual_seed(7)
    shape = (4, 16, 2, 8)  # 4 engine blocks of 16 tokens
    keys = [torch.randn(shape) for _ in range(2)]
    values = [torch.randn(shape) for _ in range(2)]
    engine = kvtier.PagedKvCache(keys, values)
    tokens = prompt(40)  # two whole pool blocks and part of a third
    table = [2, 0, 3]
    info = space.put_paged(seq, 0, tokens, engine, np.array(table, np.int32))
    assert (info.length, info.sealed_blocks) == (40, 2)
    with space.get(seq) as h:
        np.testing.assert_array_equal(h.copy_to(), engine_rows(keys, values, table, 40))
    # Back into another engine's cache under another table: exactly the rows the first held.
    back_keys = [torch.zeros(shape) for _ in range(2)]
    back_values = [torch.zeros(shape) for _ in range(2)]
    with space.lookup(tokens[:32]) as hit:
        assert hit.matched_tokens == 32
        space.gather_to(hit, 0, 32, kvtier.PagedKvCache(back_keys, back_values), [1, 3])
    np.testing.assert_array_equal(engine_rows(back_keys, back_values, [1, 3], 32),
                                  engine_rows(keys, values, table, 32))
    assert not back_keys[0][0].any() and not back_keys[0][2].any()  # other blocks untouched
    # The steps: a write handle, a scatter of part of its grant, a plain write of the rest.
    w = space.begin_put(seq + "-steps", 0, tokens[:32])
    space.scatter_to(w, 0, 16, engine, table)
    w.write(16, 32, np.ascontiguousarray(engine_rows(keys, values, table, 32)[:, :, 16:32]))
    w.commit()
    with space.get(seq + "-steps") as h:
        np.testing.assert_array_equal(h.copy_to(), engine_rows(keys, values, table, 32))
    assert leases(client) == (0, 0, 0)


def test_cluster_calls_outside_a_cluster(client: kvtier.Client) -> None:
    assert client.cluster() == ("", [])
    with pytest.raises(kvtier.InvalidArgument):  # not a cluster member
        client.drain(1, 1)


def test_cluster_calls_move_blocks_and_snapshots_between_nodes(
    two_nodes: list[Daemon], layout: kvtier.Layout, seq: str
) -> None:
    a, b = two_nodes
    with kvtier.Client(a.socket) as ca, kvtier.Client(b.socket) as cb:
        deadline = time.monotonic() + 15
        while ca.stats()["cluster"]["members_up"] < 2 or cb.stats()["cluster"]["members_up"] < 2:
            assert time.monotonic() < deadline, "the two nodes did not meet"
            time.sleep(0.02)
        me, members = ca.cluster()
        assert me == "n0"
        assert sorted((m.node_id, m.up, m.self) for m in members) == [
            ("n0", True, True), ("n1", True, False)]
        sa, sb = ca.open(layout), cb.open(layout)
        tokens, kv = prompt(48), packed(layout, 48, seed=11)
        sa.put(seq, 0, tokens, kv)
        # A prompt's blocks copied to n1: n1 then hits them without asking the cluster.
        moved = sa.copy_prompt("n1", tokens)
        assert (moved.blocks, moved.held, moved.dropped) == (3, 3, 0)
        with sb.lookup(tokens, remote="local") as hit:
            assert hit.matched_tokens == 48
            np.testing.assert_array_equal(hit.copy_to(), kv)
        ranged = sa.copy_range("n1", seq, 0, 32)
        assert (ranged.blocks, ranged.held) == (2, 2)
        # A snapshot of n0 restored on n1 (pulled by node name), and copied there as its own.
        snap = sa.snapshot(seq)
        assert snap.node == "n0"
        sb.restore(seq + "-b", snap.id, 48, node="n0")
        with sb.get(seq + "-b") as h:
            np.testing.assert_array_equal(h.copy_to(), kv)
        copied = sb.copy_snapshot("n0", snap.id)
        assert (copied.start, copied.end, copied.node) == (0, 48, "n1")
        sb.drop_snapshot(copied.id)
        # Bad targets are typed errors and change nothing.
        with pytest.raises(kvtier.Error):
            sa.copy_prompt("no-such-node", tokens)
        with pytest.raises(kvtier.InvalidArgument):
            sa.copy_keys("n1", [b"short"])
        assert sa.snapshot_info(snap.id).end == 48
        # Draining n0 hands its snapshot to n1 and drops it here.
        step = ca.drain(8, 64)
        for _ in range(20):
            if step.snapshots_left == 0 and step.blocks_left == 0:
                break
            step = ca.drain(8, 64)
        assert (step.snapshots_left, step.blocks_left) == (0, 0)
        with pytest.raises(kvtier.NotFound):
            sa.snapshot_info(snap.id)


# --- Lifetimes ----------------------------------------------------------------------------------


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


# --- Errors and bad input ---------------------------------------------------------------------


def test_sdk_errors_are_typed_exceptions(
    daemon: Daemon, client: kvtier.Client, layout: kvtier.Layout, seq: str
) -> None:
    space = client.open(layout)
    with pytest.raises(kvtier.NotFound) as not_found:
        space.get("no-such-sequence")
    e: kvtier.Error = not_found.value
    assert isinstance(e, LookupError) and e.code == 2 and not e.retryable
    with pytest.raises(kvtier.InvalidArgument) as invalid:
        space.put(seq, 5, prompt(16), packed(layout, 16))  # begin past the end
    assert isinstance(invalid.value, ValueError) and invalid.value.code == 1
    w = space.begin_put(seq, 0, prompt(16))
    with pytest.raises(kvtier.Conflict) as conflict:
        space.begin_put(seq, 0, prompt(16))
    assert conflict.value.retryable and conflict.value.code == 9
    w.abort()
    with tempfile.TemporaryDirectory() as d:
        with pytest.raises(kvtier.Unavailable) as unavailable:
            kvtier.Client(os.path.join(d, "nobody.sock"))
    assert unavailable.value.retryable and isinstance(unavailable.value, kvtier.Error)
    assert kvtier.errors.error_class(999) is kvtier.Error


def test_a_full_pool_raises_full(small_daemon: Daemon) -> None:
    big = kvtier.Layout("py/big", num_layers=4, num_kv_heads=4, head_dim=64, dtype="float32")
    with kvtier.Client(small_daemon.socket) as c:
        space = c.open(big)
        held = []
        with pytest.raises(kvtier.Full) as e:
            for i in range(64):  # 128 KiB blocks into a 1 MiB pool, each kept pinned
                space.put(f"s{i}", 0, prompt(16), packed(big, 16))
                held.append(space.get(f"s{i}"))
        assert e.value.retryable and e.value.code == 3
        for h in held:
            h.release()


def space_stats(client: kvtier.Client, layout: kvtier.Layout) -> _SpaceStats:
    (stats,) = [
        s for s in client.stats()["spaces"] if s["fingerprint"] == format(layout.fingerprint, "x")
    ]
    return stats


def test_bad_input_raises_and_changes_nothing(client: kvtier.Client, seq: str) -> None:
    # A layout of its own: its space's counters move only with this test.
    layout = kvtier.Layout("py/bad-input", num_layers=2, num_kv_heads=2, head_dim=8, dtype="f32")
    space = client.open(layout)
    kv = packed(layout, 20)
    space.put(seq, 0, prompt(20), kv)
    before, space_before = client.stats(), space_stats(client, layout)
    r = space.get(seq)
    w = space.begin_put(seq + "-w", 0, prompt(16))
    bad: list[tuple[type[Exception], Callable[[], object]]] = [
        # (exception, call)
        (kvtier.InvalidArgument, lambda: space.put(seq, 0, prompt(20), kv.astype(np.float64))),
        (kvtier.InvalidArgument, lambda: space.put(seq, 0, prompt(20), kv.astype(np.float16))),
        (kvtier.InvalidArgument, lambda: space.put(seq, 0, prompt(19), kv)),
        (kvtier.InvalidArgument, lambda: space.put(seq, 0, prompt(20), kv.reshape(2, 2, 20, 16))),
        (kvtier.InvalidArgument, lambda: space.put(seq, 0, prompt(10), kv[:, :, ::2])),
        (TypeError, lambda: space.put(seq, 0, prompt(20), kv.tolist())),
        (TypeError, lambda: space.put(seq, 0, prompt(20), None)),  # type: ignore[arg-type]
        (TypeError, lambda: space.put(seq, 0, "hello", kv)),  # type: ignore[arg-type]
        (TypeError, lambda: space.put(seq, 0, [1.5] * 20, kv)),  # type: ignore[list-item]
        (TypeError, lambda: space.put(seq, 0, np.zeros(20, np.float32), kv)),
        (kvtier.InvalidArgument, lambda: space.put(seq, 0, [-1] + prompt(19), kv)),
        (kvtier.InvalidArgument, lambda: space.put(seq, 0, [2**32] + prompt(19), kv)),
        (kvtier.InvalidArgument, lambda: space.put(seq, 0, np.array([[1, 2]]), kv)),
        (kvtier.InvalidArgument, lambda: space.put(seq, 0, np.full(20, -3, np.int64), kv)),
        (TypeError, lambda: space.put(7, 0, prompt(20), kv)),  # type: ignore[arg-type]
        (TypeError, lambda: space.put(seq, -1, prompt(20), kv)),
        (kvtier.InvalidArgument, lambda: space.put("x" * 10000, 0, prompt(20), kv)),
        # A NUL in a name: refused, never the name cut at the NUL (the put went to `seq`).
        (kvtier.InvalidArgument, lambda: space.put(seq + "\0b", 0, prompt(20), kv)),
        (kvtier.InvalidArgument, lambda: space.remove(seq + "\0b", 0)),
        (kvtier.InvalidArgument, lambda: space.truncate(seq + "\0b", 0)),
        (kvtier.InvalidArgument, lambda: space.copy_prefix(seq + "\0b", seq + "-copy", 16)),
        (kvtier.InvalidArgument, lambda: space.put(seq, 21, prompt(20), kv)),
        (kvtier.InvalidArgument, lambda: r.copy_to(0, 20, np.zeros(kv.shape, np.float64))),
        (kvtier.InvalidArgument, lambda: r.copy_to(0, 20, np.zeros((20,), np.float32))),
        (kvtier.InvalidArgument, lambda: r.copy_to(0, 30)),
        (kvtier.InvalidArgument, lambda: r.copy_to(10, 5)),
        (IndexError, lambda: r.block(2)),
        (TypeError, lambda: r.block("0")),  # type: ignore[arg-type]
        (kvtier.InvalidArgument, lambda: w.write(0, 16, kv)),
        (kvtier.InvalidArgument, lambda: w.write(0, 20, kv)),
        (kvtier.InvalidArgument, lambda: w.write(8, 4, kv)),
        (kvtier.InvalidArgument, lambda: space.lookup(
            prompt(20), remote="nowhere")),  # type: ignore[arg-type]
        (kvtier.InvalidArgument, lambda: kvtier.Layout("m", 2, 2, 8, block_tokens=7)),
        (kvtier.InvalidArgument, lambda: kvtier.Layout("m", 2, 2, 8, dtype="float64")),
        (kvtier.InvalidArgument, lambda: kvtier.Layout("m", 0, 2, 8)),
        (TypeError, lambda: kvtier.Layout("m", 2, 2, 8, dtype=3.5)),  # type: ignore[arg-type]
        (TypeError, lambda: kvtier.Layout("m", -2, 2, 8)),
        (kvtier.InvalidArgument, lambda: kvtier.Rope("yarn", 8)),  # type: ignore[arg-type]
    ]
    if torch is not None:
        tensor = torch.from_numpy(kv)
        bad.append((TypeError, lambda: space.put(
            seq, 0, prompt(20), tensor)))  # type: ignore[arg-type]
    for exception, call in bad:
        with pytest.raises(exception):
            call()
    # The read-only out: a block of the read handle itself.
    with pytest.raises(kvtier.InvalidArgument):
        r.copy_to(0, 16, r.block(0).numpy())
    r.release()
    w.abort()
    after = client.stats()
    assert after["bytes"]["put"] == before["bytes"]["put"]
    assert space_stats(client, layout) == space_before
    assert after["leases"] == {"read": 0, "write": 0} and after["blocks"]["pinned"] == 0
    with space.get(seq) as h:
        np.testing.assert_array_equal(h.copy_to(), kv)
    assert space.length(seq + "-w") is None
    assert space.length(seq + "-copy") is None


def test_error_messages_say_what_is_wrong(
    client: kvtier.Client, layout: kvtier.Layout, seq: str
) -> None:
    space = client.open(layout)
    kv = packed(layout, 20)
    with pytest.raises(kvtier.InvalidArgument, match=r"dtype float64, expected float32"):
        space.put(seq, 0, prompt(20), kv.astype(np.float64))
    shapes = r"shape \(2, 2, 20, 2, 8\), expected \(2, 2, 19, 2, 8\)"
    with pytest.raises(kvtier.InvalidArgument, match=shapes):
        space.put(seq, 0, prompt(19), kv)
    with pytest.raises(TypeError, match=r"tensor.numpy\(\)"):
        space.put(seq, 0, prompt(20), [0.0])  # type: ignore[arg-type]
    with pytest.raises(kvtier.InvalidArgument, match=r"token 0 is -1"):
        space.put(seq, 0, [-1] * 20, kv)


def test_layout_properties(layout: kvtier.Layout) -> None:
    assert layout.block_shape == (2, 2, 16, 2, 8) == layout.packed_shape(16)
    assert layout.token_kv_bytes == 256 and layout.block_bytes == 4096
    assert layout.numpy_dtype == np.float32 and layout.dtype == "float32"
    same = kvtier.Layout("py/tiny", 2, 2, 8, dtype=np.float32)
    assert same == layout and same.fingerprint == layout.fingerprint
    rope = kvtier.Layout("py/tiny", 2, 2, 8, dtype="float32", rope=kvtier.Rope("neox", 8))
    assert rope.rope == kvtier.Rope("neox", 8, 10000.0) and rope.fingerprint != layout.fingerprint
    assert kvtier.Layout("m", 1, 1, 8, dtype="bfloat16").numpy_dtype == np.uint16
    assert layout.state_bytes == 0 and layout.has_kv and not layout.has_state
    assert "state_bytes" not in repr(layout)
    hybrid = kvtier.Layout("py/tiny", 2, 2, 8, dtype="float32", state_bytes=1000)
    assert hybrid.has_state and hybrid.block_bytes == layout.block_bytes
    assert hybrid != layout and hybrid.fingerprint != layout.fingerprint
    with pytest.raises(TypeError):
        kvtier.Layout("m", 1, 1, 8, "float16", 16, None, 1000)  # type: ignore[misc]
    if torch is not None:
        assert kvtier.Layout("m", 1, 1, 8, dtype=torch.float16).dtype == "float16"


# --- Processes and threads ----------------------------------------------------------------------


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


# --- Installed package -------------------------------------------------------------------------


def test_importable_from_an_installed_prefix(
    daemon: Daemon, layout: kvtier.Layout, tmp_path: pathlib.Path
) -> None:
    build = os.environ.get("KVTIER_BUILD_DIR")
    if not build:
        pytest.skip("KVTIER_BUILD_DIR is not set (run through ctest)")
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


def test_a_block_whose_pool_bytes_changed_is_refused_and_dropped(
    daemon: Daemon, client: kvtier.Client, layout: kvtier.Layout, seq: str
) -> None:
    space = client.open(layout)
    tokens = prompt(48)
    kv = packed(layout, 48, seed=31)
    space.put(seq, 0, tokens, kv)
    space.remove(seq)  # the prefix index alone holds the blocks
    with space.lookup(tokens) as hit:
        ref = hit.refs[1]
        segment = os.path.join("/dev/shm", (daemon.segment_prefix or "") + str(ref.extent))
        if not os.path.exists(segment):
            pytest.skip("the pool is on huge pages: its memory has no name to write through")
        # A fault in the pool (here: another process writing its memory) changes a byte of the
        # second block.
        with open(segment, "r+b") as f:
            f.seek(ref.offset + 100)
            good = f.read(1)[0]
            f.seek(ref.offset + 100)
            f.write(bytes([good ^ 0x10]))
        hit.verify(0)  # intact: returns
        with pytest.raises(kvtier.ChecksumMismatch, match="differs from what its writer"):
            hit.verify(1)
        with pytest.raises(kvtier.ChecksumMismatch, match="positions from 16"):
            hit.copy_to()
    # The daemon checked the block itself and dropped it: the next lookup stops before it.
    assert client.stats()["blocks"]["corrupt"] == 1
    with space.lookup(tokens) as shorter:
        assert shorter.matched_tokens == 16
        np.testing.assert_array_equal(shorter.copy_to(), kv[:, :, :16])


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
