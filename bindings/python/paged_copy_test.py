"""Spaces on a device and paged copies in the kvtier Python package against real kvtierd
processes (run with --gpus none): host spaces only, the paged calls' argument checks, and their
CPU copies between an engine's paged cache of torch tensors and the pool.

Fixtures: conftest.py; helpers shared with the other *_test.py: testlib/kvtier_test_helpers.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import kvtier

from kvtier_test_helpers import leases, needs_torch, packed, prompt, torch


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
