"""Blobs through the kvtier Python package against real kvtierd processes: entries and state
checkpoints read in place (one pool block however many handles and arrays read it), misses and
bad input changing nothing, a view that cannot outlive its handle, and lookups by the engine's
own block keys.

Fixtures: conftest.py; helpers shared with the other *_test.py: testlib/kvtier_test_helpers.py.
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import kvtier
from kvtier.testing import Daemon

from kvtier_test_helpers import leases, packed, prompt, torch


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
