"""Prefix states through the kvtier Python package against real kvtierd processes: a lookup
restoring at the deepest cached state (at a block boundary, or inside a block with its partial
KV), blocks without a state a miss, a layout without KV, bad states refused with nothing stored,
a changed pool byte refused; and block references read back until their block is reused.

Fixtures: conftest.py; helpers shared with the other *_test.py: testlib/kvtier_test_helpers.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import pytest

import kvtier
from kvtier.testing import Daemon

from kvtier_test_helpers import expected_block, leases, packed, prompt


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
