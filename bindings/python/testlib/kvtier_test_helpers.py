"""Helpers shared by the kvtier Python tests (*_test.py beside this folder; fixtures: conftest.py).

A module of its own folder, which pytest.ini (`pythonpath`) and mypy.ini (`mypy_path`) put on the
path: under --import-mode=importlib a test file cannot import a sibling, and the tests' own folder
must not go on sys.path (its kvtier/ lacks the compiled extension).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pytest

import kvtier

if TYPE_CHECKING:
    from kvtier._kvtier import _Stats

try:
    import torch
except ImportError:  # the torch tests skip
    torch = None  # type: ignore[assignment]

needs_torch = pytest.mark.skipif(torch is None, reason="python3-torch is not installed")


def packed(layout: kvtier.Layout, tokens: int, seed: int = 0) -> npt.NDArray[Any]:
    """Random packed KV for `tokens` tokens of `layout`."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal(layout.packed_shape(tokens)).astype(layout.numpy_dtype)


# One counter for the whole pytest process, whichever test files it runs.
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


def expected_block(
    kv: npt.NDArray[Any], block_index: int, layout: kvtier.Layout, first_position: int = 0
) -> npt.NDArray[Any]:
    """What block `block_index` must hold for packed `kv` starting at position first_position."""
    bt = layout.block_tokens
    begin = block_index * bt - first_position
    n = min(bt, kv.shape[2] - begin)
    return kv[:, :, begin : begin + n]
