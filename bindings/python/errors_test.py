"""Errors and bad input in the kvtier Python package against real kvtierd processes: typed
exceptions for each code family, Full from a filled pool, bad input (types, shapes, dtypes, token
values, names, ranges, layouts) raising and leaving the daemon's counters and bytes unchanged,
messages that say what is wrong, the layout's properties, and a block whose pool bytes changed
refused and dropped.

Fixtures: conftest.py; helpers shared with the other *_test.py: testlib/kvtier_test_helpers.py.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import pytest

import kvtier
from kvtier.testing import Daemon

from kvtier_test_helpers import packed, prompt, torch

if TYPE_CHECKING:
    from kvtier._kvtier import _SpaceStats


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
