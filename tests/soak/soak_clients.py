"""The client side of the soak (tests/soak/soak.py runs it): the KV content every put writes and
every read is checked against, the latency histograms, and the client processes (Worker), each
forked by soak.py and looping over random calls until it is told to stop or its lifetime ends.

The content scheme is tests/chaos/kv_content.py, shared with the chaos runs (soak.py puts that
directory on sys.path before importing this module).
"""

import collections
import json
import math
import os
import random
import signal
import time
import traceback

import numpy as np

import kv_content
import kvtier

# --- Content (tests/chaos/kv_content.py) -------------------------------------------------------

LAYERS, HEADS, DIM, BT = 4, 2, 16, 16
VOCAB = 1 << 24
FAMILIES = 32
PROMPTS = 20000
_CONTENT = kv_content.Content(LAYERS, HEADS, DIM, cache_entries=128)
WORDS = _CONTENT.words  # 32-bit words of K and V per token: 1 KiB a token, 16 KiB a block
expected_kv = _CONTENT.expected_kv
packed = _CONTENT.packed
count_wrong = kv_content.wrong_bytes


def layout():
    return kvtier.Layout("soak/tiny", num_layers=LAYERS, num_kv_heads=HEADS, head_dim=DIM,
                         dtype="float32", block_tokens=BT)


_family_cache = {}


def family_prefix(seed, family):
    hit = _family_cache.get(family)
    if hit is None:
        r = random.Random(f"soak-family/{seed}/{family}")
        hit = _family_cache[family] = [r.randrange(VOCAB) for _ in range(r.randint(16, 96))]
    return hit


def prompt_tokens(seed, i):
    """Popular prompt i: one of FAMILIES shared prefixes plus a tail of its own."""
    r = random.Random(f"soak-prompt/{seed}/{i}")
    return family_prefix(seed, i % FAMILIES) + [r.randrange(VOCAB) for _ in range(r.randint(4, 120))]


def popular(rng):
    """A prompt index: half from a skewed head (hot: repeated puts and lookups share blocks),
    half uniform over all PROMPTS (more than the pool holds: evicted, spilled, promoted)."""
    if rng.random() < 0.5:
        return min(PROMPTS - 1, int(rng.paretovariate(0.9)) - 1 + rng.randrange(8))
    return rng.randrange(PROMPTS)


# --- Files ---------------------------------------------------------------------------------------


def write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, separators=(",", ":"))
    os.replace(tmp, path)


# --- Latency histograms --------------------------------------------------------------------------

SUB = 16  # buckets per doubling: a bucket spans 4.4 %


def bucket(us):
    return int(math.log2(max(us, 1.0)) * SUB)


def bucket_value(b):
    return 2.0 ** ((b + 0.5) / SUB)


class Kind:
    __slots__ = ("n", "hist", "max", "typed")

    def __init__(self):
        self.n = 0
        self.hist = collections.Counter()
        self.max = 0.0
        self.typed = collections.Counter()

    def to_json(self):
        return {"n": self.n, "hist": dict(self.hist), "max": self.max, "typed": dict(self.typed)}

    def merge(self, d):
        self.n += d["n"]
        for b, c in d["hist"].items():
            self.hist[int(b)] += c
        self.max = max(self.max, d["max"])
        self.typed.update(d["typed"])

    def quantile(self, q):
        if not self.n:
            return None
        want = q * self.n
        seen = 0
        for b in sorted(self.hist):
            seen += self.hist[b]
            if seen >= want:
                return min(bucket_value(b), self.max)
        return self.max


# --- The client processes ------------------------------------------------------------------------

WRONG_EXIT = 4  # a client that read wrong bytes exits with this at once


class Worker:
    OPS = [("put", 18), ("append", 8), ("begin_put", 6), ("lookup", 26), ("get", 14),
           ("remove", 12), ("truncate", 3), ("copy_prefix", 5), ("snapshot", 4), ("idle", 4)]
    MAX_SEQS = 6

    def __init__(self, socket, slot, gen, seed, run_seed, out_path, lifetime_s, flush_s):
        self.socket, self.slot, self.gen = socket, slot, gen
        self.rng = random.Random(seed)
        self.run_seed = run_seed
        self.out_path = out_path
        self.deadline = time.monotonic() + lifetime_s
        self.flush_s = flush_s
        self.kinds = collections.defaultdict(Kind)
        self.counts = collections.Counter()
        self.notes = []
        self.seqs = collections.OrderedDict()  # name -> [tokens, length, detached]
        self.k = 0
        self.stop = False
        self.client = self.space = None
        self.last_counted = None
        self.next_flush = time.monotonic() + flush_s
        self.end = "running"

    # Bookkeeping.
    def timed(self, kind, fn, *args, **kw):
        k = self.kinds[kind]
        t0 = time.perf_counter_ns()
        try:
            return fn(*args, **kw)
        except kvtier.Error as e:
            k.typed[type(e).__name__] += 1
            self.last_counted = e
            raise
        finally:
            us = (time.perf_counter_ns() - t0) / 1000.0
            k.n += 1
            k.hist[bucket(us)] += 1
            if us > k.max:
                k.max = us

    def note(self, text):
        if len(self.notes) < 5:
            self.notes.append(text[:1500])

    def flush(self):
        write_json(self.out_path, {
            "kinds": {n: k.to_json() for n, k in self.kinds.items()},
            "counts": dict(self.counts), "notes": self.notes, "end": self.end,
            "slot": self.slot, "gen": self.gen})
        self.next_flush = time.monotonic() + self.flush_s

    def check(self, got, want, what):
        n = count_wrong(got, want)
        self.counts["bytes_checked"] += int(np.asarray(want).nbytes)
        if n:
            self.counts["wrong_bytes"] += n
            self.note(f"wrong bytes: {what}: {n} of {np.asarray(want).nbytes}")
            self.end = "wrong_bytes"
            self.flush()
            os._exit(WRONG_EXIT)

    def check_handle(self, h, tokens, what):
        """The bytes of a read handle against the recomputed ones: packed, or block by block."""
        b, e = h.begin, h.end
        if e <= b:
            return
        want = expected_kv(tokens)
        if self.rng.random() < 0.75:
            self.check(h.copy_to(), want[:, :, b:e], what)
        else:
            for i in range(h.block_count):
                block = h.block(i)
                fp = block.first_position
                lo, hi = max(b, fp), min(e, fp + BT)
                if hi > lo:
                    a = block.numpy()
                    self.check(a[:, :, lo - fp:hi - fp], want[:, :, lo:hi], what + " (block view)")
                    del a

    def seq_name(self, tag):
        self.k += 1
        return f"{tag}{self.slot}.{self.gen}.{self.k}"

    def own(self):
        names = [n for n, s in self.seqs.items() if s[1] > 0]
        return self.rng.choice(names) if names else None

    def forget(self, name):
        self.seqs.pop(name, None)

    def make_room(self):
        while len(self.seqs) >= self.MAX_SEQS:
            name = next(iter(self.seqs))
            self.forget(name)
            self.timed("remove", self.space.remove, name)

    def new_tokens(self):
        tokens = list(prompt_tokens(self.run_seed, popular(self.rng)))
        if self.rng.random() < 0.3:
            tokens += [self.rng.randrange(VOCAB) for _ in range(self.rng.randint(1, 48))]
        return tokens

    # Calls.
    def op_idle(self):
        time.sleep(self.rng.random() * 0.01)

    def op_put(self):
        self.make_room()
        name = self.seq_name("s")
        tokens = self.new_tokens()
        detached = self.rng.random() < 0.8
        self.seqs[name] = [tokens, 0, detached]
        info = self.timed("put", self.space.put, name, 0, tokens, packed(tokens, 0, len(tokens)),
                          detached=detached)
        self.seqs[name][1] = info.length
        if info.length != len(tokens):
            self.counts["contract_errors"] += 1
            self.note(f"put {name}: length {info.length}, expected {len(tokens)}")

    def op_append(self):
        name = self.own()
        if name is None:
            return self.op_put()
        s = self.seqs[name]
        tokens, n = s[0], s[1]
        add = [self.rng.randrange(VOCAB) for _ in range(self.rng.randint(1, 32))]
        tokens = tokens[:n] + add
        s[0] = tokens
        info = self.timed("put", self.space.put, name, n, add, packed(tokens, n, len(tokens)),
                          detached=s[2])
        s[1] = info.length

    def op_begin_put(self):
        self.make_room()
        name = self.seq_name("w")
        tokens = self.new_tokens()
        self.seqs[name] = [tokens, 0, True]
        w = self.timed("begin_put", self.space.begin_put, name, 0, tokens, detached=True)
        try:
            if self.rng.random() < 0.5:
                for block in w.blocks():
                    fp = block.first_position
                    lo, hi = fp, min(len(tokens), fp + BT)
                    if hi > lo:
                        a = block.numpy()
                        a[:, :, 0:hi - lo] = expected_kv(tokens)[:, :, lo:hi]
                        del a
            else:
                w.write(0, len(tokens), packed(tokens, 0, len(tokens)))
            if self.rng.random() < 0.05:
                self.timed("abort", w.abort)
                self.forget(name)
                return
            info = self.timed("commit", w.commit)
            self.seqs[name][1] = info.length
        except BaseException:
            if not w.closed:
                try:
                    w.abort()
                except kvtier.Error:
                    pass
            raise

    def op_lookup(self):
        if self.seqs and self.rng.random() < 0.2:
            s = self.seqs[self.rng.choice(list(self.seqs))]
            tokens = s[0][: max(1, s[1])]
        else:
            tokens = self.new_tokens()
        bind = self.seq_name("b") if self.rng.random() < 0.25 else ""
        if bind:
            self.make_room()
        h = self.timed("lookup", self.space.lookup, tokens, bind_seq=bind)
        try:
            m = h.matched_tokens
            self.counts["lookups"] += 1
            if m:
                self.counts["lookup_hits"] += 1
                self.counts["hit_tokens"] += m
            if h.begin != 0 or h.end != m or m % BT or m > len(tokens):
                self.counts["contract_errors"] += 1
                self.note(f"lookup: [{h.begin}, {h.end}) matched {m} of {len(tokens)}")
            self.check_handle(h, tokens, "lookup")
        finally:
            self.timed("release", h.release)
        if bind and m:
            self.seqs[bind] = [tokens, m, False]
            with self.timed("get", self.space.get, bind) as g:
                self.check_handle(g, tokens, "get of a bound lookup")

    def op_get(self):
        name = self.own()
        if name is None:
            return self.op_put()
        tokens, n, _ = self.seqs[name]
        begin = 0 if self.rng.random() < 0.7 else self.rng.randrange(n)
        h = self.timed("get", self.space.get, name, begin)
        try:
            if (h.begin, h.end) != (begin, n):
                self.counts["contract_errors"] += 1
                self.note(f"get {name} from {begin}: [{h.begin}, {h.end}), length {n}")
            self.check_handle(h, tokens, f"get {name}")
        finally:
            self.timed("release", h.release)

    def op_remove(self):
        name = self.own()
        if name is None:
            return
        s = self.seqs[name]
        if self.rng.random() < 0.75:
            self.forget(name)
            self.timed("remove", self.space.remove, name)
        elif s[1] > 1:
            begin = self.rng.randint(1, s[1] - 1)
            self.timed("remove", self.space.remove, name, begin)
            s[1] = begin

    def op_truncate(self):
        name = self.own()
        if name is None:
            return
        s = self.seqs[name]
        n = self.rng.randint(1, s[1])
        self.timed("truncate", self.space.truncate, name, n)
        s[1] = n

    def op_copy_prefix(self):
        src = self.own()
        if src is None:
            return self.op_put()
        self.make_room()
        if src not in self.seqs:
            return
        tokens, n, _ = self.seqs[src]
        length = self.rng.randint(1, n)
        dst = self.seq_name("c")
        self.seqs[dst] = [tokens, 0, True]
        self.timed("copy_prefix", self.space.copy_prefix, src, dst, length, detached=True)
        self.seqs[dst][1] = length
        if self.rng.random() < 0.5:
            with self.timed("get", self.space.get, dst) as h:
                self.check_handle(h, tokens, f"get of copy {dst}")

    def op_snapshot(self):
        src = self.own()
        if src is None:
            return self.op_put()
        tokens, n, _ = self.seqs[src]
        snap = self.timed("snapshot", self.space.snapshot, src, 0)
        try:
            if snap.end > snap.start:
                self.make_room()
                dst = self.seq_name("r")
                self.seqs[dst] = [tokens, 0, True]
                target = self.rng.randint(snap.start + 1, snap.end)
                self.timed("restore", self.space.restore, dst, snap.id, target, detached=True)
                self.seqs[dst][1] = target
                with self.timed("get", self.space.get, dst) as h:
                    self.check_handle(h, tokens, f"get of restored snapshot {snap.id}")
        finally:
            self.timed("drop_snapshot", self.space.drop_snapshot, snap.id)

    # The loop.
    def connect(self):
        self.client = self.timed("connect", kvtier.Client, self.socket,
                                 client_name=f"soak-{self.slot}.{self.gen}")
        self.space = self.timed("open", self.client.open, layout())

    def leave(self, abrupt):
        """Removes its detached sequences (what would outlive it), then closes, or drops the
        connection by exiting (sometimes while holding a read lease)."""
        for name, s in list(self.seqs.items()):
            if s[2]:
                try:
                    self.timed("remove", self.space.remove, name)
                except kvtier.Error:
                    pass
        self.seqs.clear()
        if abrupt:
            self.end = "dropped"
            held = None
            if self.rng.random() < 0.5:
                try:
                    held = self.space.lookup(self.new_tokens())  # a lease the daemon must drop
                    self.end = "dropped holding a lease"
                except kvtier.Error:
                    pass
            self.flush()
            os._exit(0)  # no close: the daemon sees the connection end
        self.timed("close", self.client.close)
        self.end = "closed"

    def run(self):
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "stop", True))
        names = [n for n, _ in self.OPS]
        weights = [w for _, w in self.OPS]
        try:
            self.connect()
        except kvtier.Error as e:
            self.end = f"connect failed: {type(e).__name__}"
            self.flush()
            return 0
        abrupt = self.rng.random() < 0.25
        while not self.stop and time.monotonic() < self.deadline:
            op = self.rng.choices(names, weights)[0]
            self.counts["ops"] += 1
            try:
                getattr(self, "op_" + op)()
            except kvtier.Error as e:
                if e is not self.last_counted:
                    self.kinds["other:" + op].typed[type(e).__name__] += 1
                if isinstance(e, kvtier.Internal):
                    self.counts["internal_errors"] += 1
                    self.note(f"{op}: Internal: {e}")
                if isinstance(e, kvtier.Unavailable):
                    self.counts["unavailable_exits"] += 1
                    self.note(f"{op}: Unavailable: {e}")
                    self.end = "unavailable"
                    self.flush()
                    return 0
                self.resync(op, e)
            except Exception as e:  # noqa: BLE001 - anything untyped is what we are counting
                self.counts["untyped_errors"] += 1
                self.note(f"{op}: untyped {type(e).__name__}: {traceback.format_exc()}")
                self.resync(op, e)
            if time.monotonic() >= self.next_flush:
                self.flush()
        self.leave(abrupt and not self.stop)
        self.flush()
        return 0

    def resync(self, op, e):
        """After a failed call the lengths it would have changed are re-read from the daemon."""
        for name in list(self.seqs):
            try:
                n = self.space.length(name)
            except kvtier.Error:
                self.forget(name)
                continue
            if not n:
                self.forget(name)
            else:
                self.seqs[name][1] = min(n, len(self.seqs[name][0]))
                if n > len(self.seqs[name][0]):
                    self.forget(name)


def worker_main(*args):
    return Worker(*args).run()
