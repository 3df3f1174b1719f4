"""The client side of the single-node chaos (tests/chaos/chaos.py, which runs the parts): the KV
content every put writes and every check recomputes, the worker processes of the client-kill part
(ClientWorker) and the check after each batch (expectations, batch_check), and the writers and
checks of the daemon-kill part (writer_main, restart_check).

Each of these runs in a child that chaos.py forks (fork_child), on a copy of the parent's memory
(this module's state included); what it shares with the parent is the mmap'd memory it is given:
the phases of the client-kill workers, the epoch of the writers.
"""

import collections
import json
import random
import time

import kv_content
import kvtier
from chaos_processes import Recorder, close_quietly

# --- Content (tests/chaos/kv_content.py) -------------------------------------------------------

LAYERS, HEADS, DIM, BT = 2, 2, 8, 16
VOCAB = 1 << 24
_CONTENT = kv_content.Content(LAYERS, HEADS, DIM, cache_entries=256)
WORDS = _CONTENT.words  # 32-bit words of K and V per token
expected_kv = _CONTENT.expected_kv
packed = _CONTENT.packed
wrong_bytes = kv_content.wrong_bytes


def layout():
    """4 KiB blocks of 16 tokens (256 B a token)."""
    return kvtier.Layout("chaos/tiny", num_layers=LAYERS, num_kv_heads=HEADS, head_dim=DIM,
                         dtype="float32", block_tokens=BT)


def family_prefix(seed, family):
    r = random.Random(f"family/{seed}/{family}")
    return [r.randrange(VOCAB) for _ in range(r.randint(8, 56))]


FAMILIES = 24


def prompt_tokens(seed, i):
    """Prompt i of the daemon-kill part: a shared prefix (one of FAMILIES) plus its own tail."""
    r = random.Random(f"prompt/{seed}/{i}")
    tokens = family_prefix(seed, i % FAMILIES)
    return tokens + [r.randrange(VOCAB) for _ in range(r.randint(8, 120))]


# --- Part 1: client workers ---------------------------------------------------------------------

PHASES = ["starting", "connect", "open", "idle", "put", "begin_put", "write", "commit", "abort",
          "lookup", "hold_lookup", "get", "hold_get", "copy_prefix", "snapshot", "restore",
          "truncate", "remove", "drop_snapshot"]
PHASE_CODE = {name: i for i, name in enumerate(PHASES)}


class ClientWorker:
    """Random operations on sequences of its own until it is killed (it never ends by itself).

    Log records: {"ev": "i", "k", "seq", "t": tokens, "n": length, "d": detached} before a
    mutation (n = 0: the sequence gone), {"ev": "d", "k", "n"} after it returned, {"ev": "f", "k",
    "err"} when it raised a typed error (nothing changed); snapshots: {"ev": "si", "k"} before,
    {"ev": "sd", "k", "id", "t", "from", "to"} after; drops: {"ev": "xi"/"xd", "k", "id"};
    {"ev": "wrong", "n": bytes} for a read that returned other bytes; {"ev": "bad", "msg"} for a
    call whose result contradicts the contract."""

    OPS = [("put", 22), ("append", 12), ("lookup", 18), ("get", 12), ("copy", 10),
           ("snapshot", 8), ("truncate", 5), ("remove", 5), ("remove_mid", 2),
           ("drop_snapshot", 3), ("idle", 3)]

    def __init__(self, socket, wid, seed, log_path, phases, slot):
        self.socket, self.wid = socket, wid
        self.rng = random.Random(seed)
        self.seed = seed
        self.rec = Recorder(log_path)
        self.phases, self.slot = phases, slot
        self.seqs = {}  # name -> {"t": tokens, "n": length, "d": detached}; only existing ones
        self.snaps = {}  # id -> (tokens, from, to)
        self.k = 0
        self.space = None

    def phase(self, name):
        self.phases[self.slot] = PHASE_CODE[name]

    def run(self):
        self.phase("connect")
        client = kvtier.Client(self.socket, client_name=f"chaos-{self.wid}")
        self.phase("open")
        self.space = client.open(layout())
        names = [n for n, _ in self.OPS]
        weights = [w for _, w in self.OPS]
        while True:
            op = self.rng.choices(names, weights)[0]
            self.k += 1
            try:
                getattr(self, "op_" + op)()
            except kvtier.Error as e:
                if isinstance(e, kvtier.Internal):
                    self.rec(ev="bad", k=self.k, msg=f"{op}: Internal: {e}"[:300])
                self.rec(ev="f", k=self.k, op=op, err=type(e).__name__,
                         unknown=isinstance(e, kvtier.Unavailable))
            self.phase("idle")

    # Helpers.
    def pause(self, most_s):
        if self.rng.random() < 0.5:
            time.sleep(self.rng.random() * most_s)

    def new_tokens(self):
        r = self.rng
        # Prefixes shared with the other workers: their blocks are shared in the index.
        tokens = family_prefix(-1, r.randrange(FAMILIES)) if r.random() < 0.7 else []
        return tokens + [r.randrange(VOCAB) for _ in range(r.randint(4, 140))]

    def own(self, need_length=True):
        names = [n for n, s in self.seqs.items() if s["n"] > 0 or not need_length]
        return self.rng.choice(names) if names else None

    def intent(self, seq, tokens, n, detached):
        self.rec(ev="i", k=self.k, seq=seq, t=tokens, n=n, d=detached)

    def done(self, seq, tokens, n, detached, got):
        self.rec(ev="d", k=self.k, n=got)
        if got != n:
            self.rec(ev="bad", k=self.k, msg=f"{seq}: length {got} after the call, expected {n}")
        if got:
            self.seqs[seq] = {"t": tokens, "n": got, "d": detached}
        else:
            self.seqs.pop(seq, None)

    def check_read(self, handle, tokens):
        """Compares what a read handle holds with the recomputed bytes: packed, and block by
        block in place (zero-copy views)."""
        b, e = handle.begin, handle.end
        if e <= b:
            return
        want = expected_kv(tokens)
        n = wrong_bytes(handle.copy_to(), want[:, :, b:e])
        for i in range(handle.block_count):
            block = handle.block(i)
            fp = block.first_position
            lo, hi = max(b, fp), min(e, fp + BT)
            if hi > lo:
                a = block.numpy()
                n += wrong_bytes(a[:, :, lo - fp:hi - fp], want[:, :, lo:hi])
                del a
        if n:
            self.rec(ev="wrong", k=self.k, n=n, b=b, e=e)
        else:
            self.rec(ev="ok", k=self.k, bytes=(e - b) * WORDS * 4)

    def write_and_commit(self, seq, tokens, begin, end, detached, up_to):
        self.phase("begin_put")
        w = self.space.begin_put(seq, begin, tokens[begin:end], detached=detached)
        try:
            self.phase("write")
            if self.rng.random() < 0.5:
                for block in w.blocks():
                    fp = block.first_position
                    lo, hi = max(begin, fp), min(end, fp + BT)
                    if hi > lo:
                        a = block.numpy()
                        a[:, :, lo - fp:hi - fp] = expected_kv(tokens)[:, :, lo:hi]
                        del a
            else:
                w.write(begin, end, packed(tokens, begin, end))
            self.pause(0.02)
            if self.rng.random() < 0.08:
                self.phase("abort")
                w.abort()
                return None
            self.phase("commit")
            return w.commit(up_to=up_to).length
        except BaseException:
            if not w.closed:
                try:
                    w.abort()
                except kvtier.Error:
                    pass
            raise

    def mutate_put(self, seq, tokens, begin, end, detached, old):
        """put or begin_put of positions [begin, end) of `tokens` into seq."""
        if self.rng.random() < 0.5:
            self.intent(seq, tokens, end, detached)
            self.phase("put")
            got = self.space.put(seq, begin, tokens[begin:end], packed(tokens, begin, end),
                                 detached=detached).length
        else:
            up_to = end
            if end - begin > BT and self.rng.random() < 0.3:
                up_to = begin + self.rng.randint(1, end - begin)
            self.intent(seq, tokens, up_to, detached)
            got = self.write_and_commit(seq, tokens, begin, end, detached, up_to)
            if got is None:  # aborted: nothing changed
                self.rec(ev="f", k=self.k, op="abort", err="aborted")
                return
            end = up_to
        self.done(seq, tokens, end, detached, got)

    # Operations.
    def op_idle(self):
        time.sleep(self.rng.random() * 0.01)

    def op_put(self):
        seq = f"s{self.wid}.{self.k}"
        tokens = self.new_tokens()
        n = self.rng.randint(1, len(tokens))
        self.mutate_put(seq, tokens, 0, n, self.rng.random() < 0.8, None)

    def op_append(self):
        seq = self.own()
        if seq is None:
            return self.op_put()
        s = self.seqs[seq]
        tokens, n = s["t"], s["n"]
        if n >= len(tokens):
            tokens = tokens + [self.rng.randrange(VOCAB) for _ in range(self.rng.randint(1, 40))]
        begin = self.rng.randint(max(0, n - 24), n)  # a replacement of the tail, or an append
        end = self.rng.randint(begin + 1, len(tokens))
        self.mutate_put(seq, tokens, begin, end, s["d"], s)

    def op_lookup(self):
        seq = self.own()
        if seq is not None and self.rng.random() < 0.7:
            tokens = self.seqs[seq]["t"][: self.rng.randint(1, len(self.seqs[seq]["t"]))]
        else:
            tokens = self.new_tokens()  # a family prefix, perhaps cached by someone else
        bind = ""
        if self.rng.random() < 0.2:
            bind = f"b{self.wid}.{self.k}"  # bound sequences are the session's: gone with it
            self.intent(bind, tokens, -1, False)
        self.phase("lookup")
        with self.space.lookup(tokens, bind_seq=bind) as h:
            self.phase("hold_lookup")
            if h.begin != 0 or h.end != h.matched_tokens or h.matched_tokens % BT:
                self.rec(ev="bad", k=self.k,
                         msg=f"lookup [{h.begin}, {h.end}) m={h.matched_tokens}")
            self.check_read(h, tokens)
            self.pause(0.03)
        if bind:
            self.done(bind, tokens, h.matched_tokens, False, h.matched_tokens)

    def op_get(self):
        seq = self.own()
        if seq is None:
            return self.op_put()
        s = self.seqs[seq]
        begin = 0 if self.rng.random() < 0.6 else self.rng.randrange(s["n"])
        self.phase("get")
        with self.space.get(seq, begin) as h:
            self.phase("hold_get")
            if (h.begin, h.end) != (begin, s["n"]):
                self.rec(ev="bad", k=self.k, msg=f"get {seq}: [{h.begin}, {h.end}), "
                         f"expected [{begin}, {s['n']})")
            self.check_read(h, s["t"])
            self.pause(0.03)

    def op_copy(self):
        src = self.own()
        if src is None:
            return self.op_put()
        s = self.seqs[src]
        length = self.rng.randint(0, s["n"] + 8)
        dst = self.own(need_length=False) if self.rng.random() < 0.2 else None
        dst = dst if dst and dst != src else f"c{self.wid}.{self.k}"
        detached = self.seqs[dst]["d"] if dst in self.seqs else True
        n = min(length, s["n"])
        self.intent(dst, s["t"], n, detached)
        self.phase("copy_prefix")
        self.space.copy_prefix(src, dst, length, detached=detached)
        self.done(dst, s["t"], n, detached, self.space.length(dst) or 0)

    def op_snapshot(self):
        seq = self.own()
        if seq is None:
            return self.op_put()
        s = self.seqs[seq]
        start = 0 if self.rng.random() < 0.5 else self.rng.randint(0, s["n"])
        self.rec(ev="si", k=self.k)
        self.phase("snapshot")
        snap = self.space.snapshot(seq, start)
        self.rec(ev="sd", k=self.k, id=snap.id, t=s["t"], start=snap.start, end=snap.end)
        if (snap.start, snap.end) != (min(start, s["n"]), s["n"]) and snap.start != snap.end:
            self.rec(ev="bad", k=self.k, msg=f"snapshot of {seq} from {start}: "
                     f"[{snap.start}, {snap.end}), length {s['n']}")
        self.snaps[snap.id] = (s["t"], snap.start, snap.end)
        if self.rng.random() < 0.5 and snap.end > snap.start:
            # Restore it into a new sequence that has [0, start): a copy of the source's prefix.
            dst = f"r{self.wid}.{self.k}"
            self.k += 1
            if snap.start:
                self.intent(dst, s["t"], snap.start, True)
                self.phase("copy_prefix")
                self.space.copy_prefix(seq, dst, snap.start, detached=True)
                self.done(dst, s["t"], snap.start, True, self.space.length(dst) or 0)
                self.k += 1
            target = self.rng.randint(snap.start, snap.end)
            self.intent(dst, s["t"], target, True)
            self.phase("restore")
            self.space.restore(dst, snap.id, target, detached=True)
            self.done(dst, s["t"], target, True, self.space.length(dst) or 0)

    def op_truncate(self):
        seq = self.own()
        if seq is None:
            return
        s = self.seqs[seq]
        n = self.rng.randint(0, s["n"])
        self.intent(seq, s["t"], n, s["d"])
        self.phase("truncate")
        self.space.truncate(seq, n)
        self.done(seq, s["t"], n, s["d"], self.space.length(seq) or 0)

    def op_remove(self):
        seq = self.own()
        if seq is None:
            return
        s = self.seqs[seq]
        begin = 0 if self.rng.random() < 0.6 else self.rng.randint(0, s["n"])
        self.intent(seq, s["t"], begin, s["d"])
        self.phase("remove")
        self.space.remove(seq, begin)
        self.done(seq, s["t"], begin, s["d"], self.space.length(seq) or 0)

    def op_remove_mid(self):
        # Without a RoPE scheme a middle removal is NOT_SUPPORTED and changes nothing.
        seq = self.own()
        if seq is None or self.seqs[seq]["n"] < 3:
            return
        s = self.seqs[seq]
        self.intent(seq, s["t"], s["n"], s["d"])
        self.phase("remove")
        try:
            self.space.remove(seq, 1, s["n"] - 1)
        except kvtier.NotSupported:
            self.done(seq, s["t"], s["n"], s["d"], self.space.length(seq) or 0)
            return
        self.rec(ev="bad", k=self.k, msg="a middle removal without RoPE succeeded")

    def op_drop_snapshot(self):
        if not self.snaps:
            return
        sid = self.rng.choice(list(self.snaps))
        self.rec(ev="xi", k=self.k, id=sid)
        self.phase("drop_snapshot")
        self.space.drop_snapshot(sid)
        self.rec(ev="xd", k=self.k, id=sid)
        del self.snaps[sid]


def expectations(records):
    """From a dead worker's log: {seq: [allowed states]} (a state: (tokens, length), length 0 =
    no sequence), the snapshots that must restore {id: (tokens, from, to)}, the ids that may
    exist, and the worker's own findings."""
    state = {}  # seq -> (tokens, n, detached)
    pending = None  # (seq, (tokens, n, detached)) of the mutation in flight
    snaps, maybe_snaps = {}, set()
    snap_intents = 0
    found = collections.Counter()
    for r in records:
        ev = r["ev"]
        if ev == "i":
            pending = (r["seq"], (r["t"], r["n"], r["d"]))
            state.setdefault(r["seq"], (r["t"], 0, r["d"]))
        elif ev == "d" and pending:
            seq, (tokens, _, detached) = pending
            state[seq] = (tokens, r["n"], detached)
            pending = None
        elif ev == "f":
            if not r.get("unknown"):
                pending = None
        elif ev == "si":
            snap_intents += 1
        elif ev == "sd":
            snaps[r["id"]] = (r["t"], r["start"], r["end"])
        elif ev == "xi":
            maybe_snaps.add(r["id"])
            snaps.pop(r["id"], None)
        elif ev == "xd":
            maybe_snaps.discard(r["id"])
        elif ev == "wrong":
            found["wrong_bytes"] += r["n"]
        elif ev == "ok":
            found["bytes_checked"] += r["bytes"]
        elif ev == "bad":
            found["bad"] += 1
        if ev == "f":
            found["aborts" if r["err"] == "aborted" else "typed:" + r["err"]] += 1
    allowed = {}
    for seq, (tokens, n, detached) in state.items():
        if not detached or n < 0:
            allowed[seq] = [(tokens, 0)]  # the session's own sequences end with it
        else:
            allowed[seq] = [(tokens, n)]
    if pending:
        seq, (tokens, n, detached) = pending
        if detached and n >= 0:
            allowed.setdefault(seq, [])
            allowed[seq] = allowed[seq] + [(tokens, n)]
    bad_msgs = [r["msg"] for r in records if r["ev"] == "bad"]
    return allowed, snaps, maybe_snaps, snap_intents, found, bad_msgs


def poll_stats(client, pred, timeout_s):
    """The daemon notices a dead connection asynchronously: stats() until pred holds or the
    deadline passes; returns the last ones."""
    deadline = time.monotonic() + timeout_s
    stats = client.stats()
    while not pred(stats) and time.monotonic() < deadline:
        time.sleep(0.01)
        stats = client.stats()
    return stats


def batch_check(socket, allowed, snaps, sweep, settle_s, result_path):
    """After a batch (every worker dead): leases and pins gone, every sequence in an allowed
    state with exact bytes, every snapshot exact; then removes everything and checks that the
    pool holds only cached blocks. Writes its findings as JSON to result_path."""
    out = collections.Counter()
    notes = []
    with kvtier.Client(socket, client_name="chaos-checker") as client:
        space = client.open(layout())
        s = poll_stats(client, lambda s: s["clients"] == 1 and s["leases"]["read"] == 0
                       and s["leases"]["write"] == 0 and s["blocks"]["pinned"] == 0, settle_s)
        out["leaked_sessions"] = s["clients"] - 1
        out["leaked_leases"] = s["leases"]["read"] + s["leases"]["write"]
        out["leaked_pins"] = s["blocks"]["pinned"]
        if s["clients"] != 1 or out["leaked_leases"] or out["leaked_pins"]:
            notes.append(f"after the batch: clients={s['clients']} leases={s['leases']} "
                         f"pinned={s['blocks']['pinned']}")
        for seq, states in sorted(allowed.items()):
            n = space.length(seq) or 0
            fits = [tokens for tokens, m in states if m == n]
            if not fits:
                out["state_errors"] += 1
                if not any(m for _, m in states):
                    out["leaked_sequences"] += 1
                notes.append(f"{seq}: length {n}, allowed {[m for _, m in states]}")
                fits = [states[0][0]] if n <= len(states[0][0]) else []
            if n and fits:
                with space.get(seq) as h:
                    got = h.copy_to()
                wrong = min(wrong_bytes(got, expected_kv(t)[:, :, :n]) for t in fits)
                out["bytes_checked"] += got.nbytes
                out["sequences_checked"] += 1
                if wrong:
                    out["wrong_bytes"] += wrong
                    notes.append(f"{seq}: {wrong} wrong bytes in [0, {n})")
        for sid, (tokens, start, end) in sorted(snaps.items()):
            chk = f"chk.{sid}"
            try:
                if start:
                    space.put(chk, 0, tokens[:start], packed(tokens, 0, start), detached=True)
                space.restore(chk, sid, end, detached=True)
                n = space.length(chk) or 0
                if n != end:
                    out["state_errors"] += 1
                    notes.append(f"snapshot {sid} restored to length {n}, expected {end}")
                if n:
                    with space.get(chk) as h:
                        got = h.copy_to()
                    wrong = wrong_bytes(got, expected_kv(tokens)[:, :, :n])
                    out["bytes_checked"] += got.nbytes - start * WORDS * 4
                    out["snapshots_checked"] += 1
                    if wrong:
                        out["wrong_bytes"] += wrong
                        notes.append(f"snapshot {sid}: {wrong} wrong bytes")
            except kvtier.NotFound as e:
                out["lost_snapshots"] += 1
                notes.append(f"snapshot {sid} [{start}, {end}) lost: {e}")
            finally:
                space.remove(chk)
        # Everything goes: the pool must then hold only evictable cached blocks.
        for seq in allowed:
            space.remove(seq)
        lo, hi = sweep
        for sid in range(lo, hi + 1):
            try:
                space.drop_snapshot(sid)
            except (kvtier.NotFound, kvtier.InvalidArgument):
                pass
        s = client.stats()
        extra = hi + 1
        while s["snapshots"] and extra < hi + 2000:  # ids of snapshots no log knows: keep going
            for sid in range(extra, extra + 50):
                try:
                    space.drop_snapshot(sid)
                except (kvtier.NotFound, kvtier.InvalidArgument):
                    pass
            extra += 50
            s = client.stats()
        s = poll_stats(client, lambda s: s["blocks"]["used"] == s["blocks"]["cached"]
                       and s["blocks"]["pinned"] == 0 and s["snapshots"] == 0
                       and s["sequences"] == 0, settle_s)
        out["leaked_snapshots"] = s["snapshots"]
        out["leaked_blocks"] = max(0, s["blocks"]["used"] - s["blocks"]["cached"])
        out["leaked_pins"] = max(out["leaked_pins"], s["blocks"]["pinned"])
        out["leftover_sequences"] = s["sequences"]
        if out["leaked_blocks"] or s["snapshots"] or s["sequences"]:
            notes.append(f"after removing everything: blocks={s['blocks']} "
                         f"snapshots={s['snapshots']} sequences={s['sequences']}")
        out["pool_used"] = s["blocks"]["used"]
        out["cold_spilled"] = s["cold"]["spilled"]
        out["cold_promoted"] = s["cold"]["promoted"]
    with open(result_path, "w") as f:
        json.dump({"counts": dict(out), "notes": notes}, f)


# --- Part 2: daemon-kill writers and checks ----------------------------------------------------


def writer_main(socket, wid, nwriters, seed, log_path, epoch):
    """Puts prompts wid, wid + nwriters, ... for ever, through daemon deaths: a lost daemon is
    kvtier.Unavailable (or another typed error), and the writer reconnects.

    epoch[0]: which data directory the daemon runs on now (the parent kills the daemon before it
    sets it, then starts one on the new directory). Snapshot ids are a data directory's own, so
    each snapshot is logged with the epoch of the daemon that took it. The client reconnects by
    itself when its daemon goes away, so the epoch is read just before each snapshot call, with
    the client's reconnection count: when the call made no new connection, the daemon that
    answered is the one the connection was made to, alive until the answer, so no switch came
    between the connection and that read. A snapshot taken across a reconnection is logged
    without an epoch (no check restores it): it may be a daemon's from either directory."""
    rng = random.Random(f"writer/{seed}/{wid}")
    rec = Recorder(log_path)
    client = space = None
    k = 0
    kept = collections.deque()
    while True:
        try:
            if client is None:
                client = kvtier.Client(socket, client_name=f"chaos-writer-{wid}")
                space = client.open(layout())
            i = wid + nwriters * k
            tokens = prompt_tokens(seed, i)
            rec(ev="i", i=i)
            seq = f"p{i}"
            if rng.random() < 0.6:
                space.put(seq, 0, tokens, packed(tokens, 0, len(tokens)))
            else:
                with space.begin_put(seq, 0, tokens) as w:
                    w.write(0, len(tokens), packed(tokens, 0, len(tokens)))
            rec(ev="d", i=i)
            k += 1
            time.sleep(rng.random() * 0.04)  # ~50 puts/s a writer: the cold tier stays < 1 GiB
            if rng.random() < 0.1:
                connections = client.reconnects
                on = epoch[0]
                snap = space.snapshot(seq, 0)
                if client.reconnects != connections:
                    on = None
                rec(ev="sd", id=snap.id, i=i, end=snap.end, epoch=on)
            kept.append(seq)
            while len(kept) > 4:
                space.remove(kept.popleft())
            if rng.random() < 0.3 and i > 0:
                j = rng.randrange(i)
                want = prompt_tokens(seed, j)
                with space.lookup(want) as h:
                    m = h.matched_tokens
                    if m:
                        n = wrong_bytes(h.copy_to(), expected_kv(want)[:, :, :m])
                        rec(ev="wrong" if n else "ok", n=n, bytes=m * WORDS * 4)
        except kvtier.Error as e:
            rec(ev="f", err=type(e).__name__)
            if isinstance(e, kvtier.Internal):
                rec(ev="bad", msg=f"Internal: {e}"[:300])
            if isinstance(e, (kvtier.Full, kvtier.Conflict)):
                time.sleep(0.005)  # retryable: the spill frees blocks
            else:
                close_quietly(client)
                client = space = None
                kept.clear()
                time.sleep(0.02)


def restart_check(socket, seed, indices, snaps, result_path):
    """After a restart: each sampled prompt misses or hits with exactly its bytes; each sampled
    snapshot is gone or restores to exactly its bytes."""
    out = collections.Counter()
    notes = []
    restored, missing = [], []
    try:
        with kvtier.Client(socket, client_name="chaos-checker") as client:
            space = client.open(layout())
            for i in indices:
                tokens = prompt_tokens(seed, i)
                with space.lookup(tokens) as h:
                    m = h.matched_tokens
                    out["lookups"] += 1
                    if m:
                        got = h.copy_to()
                        wrong = wrong_bytes(got, expected_kv(tokens)[:, :, :m])
                        out["lookup_hits"] += 1
                        out["bytes_checked"] += got.nbytes
                        if wrong:
                            out["wrong_bytes"] += wrong
                            notes.append(f"prompt {i}: {wrong} wrong bytes in [0, {m})")
            for sid, i, end in snaps:
                tokens = prompt_tokens(seed, i)
                chk = f"chk.{sid}"
                try:
                    space.restore(chk, sid, end, detached=True)
                except kvtier.NotFound:
                    out["snapshots_missing"] += 1
                    missing.append(sid)
                    continue
                out["snapshots_restored"] += 1
                restored.append(sid)
                with space.get(chk) as h:
                    got = h.copy_to()
                wrong = wrong_bytes(got, expected_kv(tokens)[:, :, : h.end])
                out["bytes_checked"] += got.nbytes
                if wrong or h.end != end:
                    out["wrong_bytes"] += wrong or got.nbytes
                    notes.append(f"snapshot {sid} of prompt {i}: {wrong} wrong bytes, "
                                 f"length {h.end} (expected {end})")
                space.remove(chk)
            s = client.stats()
            out["snapshots_dropped"] = s["cold"]["snapshots_dropped"]
            out["spill_errors"] = s["cold"]["spill_errors"]
            out["cold_records"] = s["cold"]["records"]
            out["cold_promoted"] = s["cold"]["promoted"]
    except kvtier.Error as e:
        out["checker_typed:" + type(e).__name__] += 1
        notes.append(f"checker: {type(e).__name__}: {e}")
    out["restored"], out["missing"] = restored, missing
    with open(result_path, "w") as f:
        json.dump({"counts": dict(out), "notes": notes}, f)
