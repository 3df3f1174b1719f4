"""KV content that is a pure function of the token prefix, as block keys are: position p of every
put of `tokens` holds a hash of tokens[0..p], so a prefix's bytes are the same in every sequence,
from every writer and every tier that holds it, and any read is checked byte for byte.

Shared by the chaos runs (tests/chaos/chaos_clients.py, cluster_chaos.py) and the soak
(tests/soak/soak.py), each with its own layout's shapes.
"""

import collections

import numpy as np

MASK = (1 << 64) - 1


def _mix(x):
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


class Content:
    """The packed KV (float32 bit patterns, [layers, 2, tokens, heads, dim]) of a layout of
    `layers` x `heads` x `dim`, the last `cache_entries` token lists' kept (LRU)."""

    def __init__(self, layers, heads, dim, cache_entries):
        self.shape = (layers, heads, dim)
        self.words = layers * 2 * heads * dim  # 32-bit words of K and V per token
        self._salt = np.arange(self.words, dtype=np.uint64) * np.uint64(0xD1B54A32D192ED03)
        self._cache = collections.OrderedDict()
        self._cache_entries = cache_entries

    def expected_kv(self, tokens):
        """The packed KV every put of `tokens` writes."""
        key = tuple(tokens)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        h = 0x243F6A8885A308D3
        chain = np.empty(len(tokens), np.uint64)
        for i, t in enumerate(tokens):
            h = _mix(h ^ (((t + 1) * 0x9E3779B97F4A7C15) & MASK))
            chain[i] = h
        with np.errstate(over="ignore"):
            x = chain[:, None] + self._salt[None, :]
            x ^= x >> np.uint64(30)
            x *= np.uint64(0xBF58476D1CE4E5B9)
            x ^= x >> np.uint64(27)
            x *= np.uint64(0x94D049BB133111EB)
            x ^= x >> np.uint64(31)
        layers, heads, dim = self.shape
        words = (x & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        words = words.reshape(len(tokens), layers, 2, heads, dim).transpose(1, 2, 0, 3, 4)
        kv = np.ascontiguousarray(words).view(np.float32)
        self._cache[key] = kv
        if len(self._cache) > self._cache_entries:
            self._cache.popitem(last=False)
        return kv

    def packed(self, tokens, lo, hi):
        """Positions [lo, hi) of expected_kv(tokens), C-contiguous (what put and write take)."""
        return np.ascontiguousarray(self.expected_kv(tokens)[:, :, lo:hi])


def wrong_bytes(got, want):
    """How many bytes of `got` differ from `want` (all of them when the shapes differ)."""
    want = np.ascontiguousarray(want).view(np.uint8)
    got = np.ascontiguousarray(got).view(np.uint8)
    if got.shape != want.shape:
        return int(want.size)
    return int(np.count_nonzero(got != want))
