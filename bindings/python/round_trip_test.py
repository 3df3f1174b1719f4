"""Round trips through the kvtier Python package against real kvtierd processes: put, get and
lookup through NumPy views of the pool and torch tensors over them, write handles, put_many,
inline clients, the sequence and snapshot calls, recurrent-state checkpoints.

Fixtures: conftest.py; helpers shared with the other *_test.py: testlib/kvtier_test_helpers.py.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

import kvtier
from kvtier.testing import Daemon

from kvtier_test_helpers import (
    expected_block,
    leases,
    needs_torch,
    packed,
    prompt,
    torch,
    wait_for_stats,
)


def committed(results: list[kvtier.CommitInfo | kvtier.Error]) -> list[tuple[int, int]]:
    """(length, sealed_blocks) of each result of put_many, every one a CommitInfo."""
    assert all(isinstance(r, kvtier.CommitInfo) for r in results), results
    return [(r.length, r.sealed_blocks) for r in results if isinstance(r, kvtier.CommitInfo)]


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


def test_stats_say_which_eviction_policy_orders_the_blocks(client: kvtier.Client) -> None:
    eviction = client.stats()["eviction"]
    assert eviction["policy"] == "adaptive"  # the daemon's default
    # The expert the adaptive policy follows now: 2Q until it has measured the workload.
    assert eviction["following"] in {"lru", "arc", "2q", "s3fifo", "sieve"}
    assert eviction["switches"] >= 0
