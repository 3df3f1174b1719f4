#!/usr/bin/env python3
"""Offline bounds for eviction policies on a Mooncake-format trace (docs/cache-policy.md).

The request model of `kvtier replay`: a request hits the longest cached prefix of its hash ids,
then all its ids are touched, last first (a prefix is released tail first), and the cache
evicts down to its capacity, never one of the current request's ids. Policies here know more
than any online policy may (every past use, or the future), to bound what one can reach:

  lru            least recently used first (the model's anchor)
  lru-2          the oldest second-to-last use first (O'Neil's LRU-K, K=2), every past use known
  second-use     content seen once so far goes first, then least recently used: a cache that
                 admits for good only what it has seen reused, with an unbounded history
  lfu            the fewest uses so far first (every past use known), then least recently used
  lrfu           LRFU (Lee et al.): the smallest sum of 2^-(age of each use / 10,000 accesses)
                 first, every past use known (10,000: the best half-life at 6,000 blocks)
  dead-oracle    content never used again goes first (the future known), then LRU
  static-top-k   the k most used blocks over the whole trace kept from their first use (the
                 future known; nothing else cached): hits = uses - 1 of each
  static-top-k-from-third
                 the same, kept only from their third use on: a policy that must see a block
                 twice before it keeps it, and then knows which to keep

  scripts/policy-bounds.py [TRACE] [--capacity 1000,6000,20000]
"""
import argparse
import collections
import heapq
import json
import math


def load(path):
    with open(path) as f:
        return [json.loads(line)["hash_ids"] for line in f if line.strip()]


def simulate(reqs, cap, key):
    """Hit rate of a cache that evicts the smallest key(uses, t, dead) first."""
    uses = collections.defaultdict(list)
    dead_at = set()
    last = {}
    for ri, r in enumerate(reqs):
        for j, i in enumerate(r):
            last[i] = (ri, j)
    cached, heap, t, hits, total = {}, [], 0, 0, 0
    for ri, r in enumerate(reqs):
        h = 0
        while h < len(r) and r[h] in cached:
            h += 1
        hits += h
        total += len(r)
        current = set(r)
        for j in reversed(range(len(r))):
            i = r[j]
            t += 1
            uses[i].append(t)
            k = (key(uses[i], t, last[i] == (ri, j)), t)
            cached[i] = k
            heapq.heappush(heap, (k, i))
        held = []
        while len(cached) > cap:
            k, i = heapq.heappop(heap)
            if cached.get(i) != k:
                continue
            if i in current:
                held.append((k, i))
                continue
            del cached[i]
        for entry in held:
            heapq.heappush(heap, entry)
    return hits / total


def lrfu_key(uses, t, half_life=10000.0):
    # log2 of the decayed use count, plus t / half-life: the order of the decayed counts at any
    # later time, fixed when the block is touched.
    return t / half_life + math.log2(sum(2.0 ** (-(t - u) / half_life) for u in uses))


POLICIES = {
    "lru": lambda u, t, dead: t,
    "lfu": lambda u, t, dead: len(u) * 10**12 + t,
    "lrfu": lambda u, t, dead: lrfu_key(u, t),
    "lru-2": lambda u, t, dead: u[-2] if len(u) >= 2 else -(10**12) + t,
    "second-use": lambda u, t, dead: t if len(u) >= 2 else -(10**12) + t,
    "dead-oracle": lambda u, t, dead: -(10**12) + t if dead else t,
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("trace", nargs="?", default="../shared/traces/mooncake_synthetic_trace.jsonl")
    p.add_argument("--capacity", default="1000,6000,20000")
    a = p.parse_args()
    reqs = load(a.trace)
    caps = [int(c) for c in a.capacity.split(",")]
    total = sum(map(len, reqs))
    counts = sorted(collections.Counter(i for r in reqs for i in r).values(), reverse=True)
    print("policy\t" + "\t".join(str(c) for c in caps))
    for name, key in POLICIES.items():
        print(name + "\t" + "\t".join("%.2f" % (100 * simulate(reqs, c, key)) for c in caps),
              flush=True)
    print("static-top-k\t" + "\t".join(
        "%.2f" % (100 * sum(x - 1 for x in counts[:c]) / total) for c in caps))
    print("static-top-k-from-third\t" + "\t".join(
        "%.2f" % (100 * sum(max(0, x - 2) for x in counts[:c]) / total) for c in caps))


if __name__ == "__main__":
    main()
