"""Chaos for kvtierd: clients and daemons killed with SIGKILL at random points (scripts/chaos.sh).

Run through scripts/chaos.sh, which sets PYTHONPATH to the build tree's package and makes the work
directory. Three parts, seeded (--seed), each checked against content the checker can recompute:

1. Client kills. One daemon (cold tier on); worker processes put (in one call, or begin_put +
   in-place writes + commit), append and replace, look up and get while holding the read lease,
   copy prefixes, take and restore snapshots, truncate and remove; the parent SIGKILLs them at
   random moments. Each worker logs an intent before every mutation and its outcome after it
   returned, so after a batch the parent knows, for every sequence, the one state it must be in
   (or the two, when the worker died inside the call: mutations are atomic). After each batch,
   with no client left: the daemon's sessions, read and write leases and pinned blocks drop to
   0 (bounded wait); every sequence is in an allowed state and reads back its exact bytes; every
   snapshot restores to its exact bytes; then everything is removed and the pool must hold
   only evictable cached blocks (used == cached): anything else is a leaked block.
2. Daemon kills. Writers put prompts (cold tier on, a small pool so that blocks spill) while the
   daemon is SIGKILLed at random points and restarted on the same data directory; after each
   restart, a sample of every prompt ever put is looked up (each lookup misses or hits with
   exactly the bytes once written) and a sample of snapshots restored (each is gone or exact).
3. Full disk and read-only data directory (when tmpfs can be mounted, i.e. as root): cycles of
   the same loop with the data directory on a small tmpfs that fills up, and with the data
   directory remounted read-only under a stopped daemon.

KV content is a pure function of the token prefix (a chained hash of the tokens up to and
including a position), as block keys are: any hit, from any writer, must equal the recomputed
bytes. The last line of stdout is one JSON object (docs/reliability.md#chaos); the exit status is
1 when anything leaked, a byte was wrong, a start failed or an untyped error happened.
"""

import argparse
import collections
import ctypes
import json
import mmap
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import traceback

import numpy as np

import kvtier

# --- Content ------------------------------------------------------------------------------------

LAYERS, HEADS, DIM, BT = 2, 2, 8, 16
WORDS = LAYERS * 2 * HEADS * DIM  # 32-bit words of K and V per token
VOCAB = 1 << 24
MASK = (1 << 64) - 1


def layout():
    """4 KiB blocks of 16 tokens (256 B a token)."""
    return kvtier.Layout("chaos/tiny", num_layers=LAYERS, num_kv_heads=HEADS, head_dim=DIM,
                         dtype="float32", block_tokens=BT)


def _mix(x):
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


_WORD_SALT = np.arange(WORDS, dtype=np.uint64) * np.uint64(0xD1B54A32D192ED03)
_cache = collections.OrderedDict()


def expected_kv(tokens):
    """The packed KV (float32 bit patterns) every put of `tokens` writes: position p holds a hash
    of tokens[0..p], so a prefix's bytes are the same in every sequence that shares it."""
    key = tuple(tokens)
    hit = _cache.get(key)
    if hit is not None:
        _cache.move_to_end(key)
        return hit
    h = 0x243F6A8885A308D3
    chain = np.empty(len(tokens), np.uint64)
    for i, t in enumerate(tokens):
        h = _mix(h ^ (((t + 1) * 0x9E3779B97F4A7C15) & MASK))
        chain[i] = h
    with np.errstate(over="ignore"):
        x = chain[:, None] + _WORD_SALT[None, :]
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    words = (x & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    words = words.reshape(len(tokens), LAYERS, 2, HEADS, DIM).transpose(1, 2, 0, 3, 4)
    kv = np.ascontiguousarray(words).view(np.float32)
    _cache[key] = kv
    if len(_cache) > 256:
        _cache.popitem(last=False)
    return kv


def packed(tokens, lo, hi):
    """Positions [lo, hi) of expected_kv(tokens), C-contiguous (what put and write take)."""
    return np.ascontiguousarray(expected_kv(tokens)[:, :, lo:hi])


def wrong_bytes(got, want):
    """How many bytes of `got` differ from `want` (all of them when the shapes differ)."""
    want = np.ascontiguousarray(want).view(np.uint8)
    got = np.ascontiguousarray(got).view(np.uint8)
    if got.shape != want.shape:
        return int(want.size)
    return int(np.count_nonzero(got != want))


def family_prefix(seed, family):
    r = random.Random(f"family/{seed}/{family}")
    return [r.randrange(VOCAB) for _ in range(r.randint(8, 56))]


FAMILIES = 24


def prompt_tokens(seed, i):
    """Prompt i of the daemon-kill part: a shared prefix (one of FAMILIES) plus its own tail."""
    r = random.Random(f"prompt/{seed}/{i}")
    tokens = family_prefix(seed, i % FAMILIES)
    return tokens + [r.randrange(VOCAB) for _ in range(r.randint(8, 120))]


# --- Processes ----------------------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid):
    """A child of ours dies with us (SIGKILL), even when we are killed outright."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(1)


def fork_child(stderr_path, fn, *args):
    """fn(*args) in a forked child whose stderr goes to stderr_path; returns its pid. A child
    that raises exits 3 (after printing the traceback), one that returns exits 0. The parent holds
    no kvtier client and runs no thread, so the fork copies nothing half-done."""
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    code = 3
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        die_with_parent(parent)
        fd = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, 2)
        os.close(fd)
        fn(*args)
        code = 0
    except BaseException:  # noqa: B036 - the child must end here whatever happened
        traceback.print_exc()
        sys.stderr.flush()
    os._exit(code)


def describe_status(status):
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"exit {os.WEXITSTATUS(status)}"


def tail(path, lines=20):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def read_records(path):
    """The complete JSON lines of a worker's log (a line cut by SIGKILL is dropped)."""
    out = []
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return out
    for line in data.split(b"\n")[:-1]:
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


class Recorder:
    """Appends one JSON line per event to a worker's log: a single write(2) each, so SIGKILL
    leaves whole lines only (plus at most one cut one, which the reader drops)."""

    def __init__(self, path):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def __call__(self, **record):
        os.write(self.fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())


# --- The daemon ---------------------------------------------------------------------------------


class Daemon:
    """One kvtierd process at a time on a data directory (restartable)."""

    def __init__(self, run, data_dir, pool_bytes, cold=True, disk_bytes="64M"):
        self.run = run
        self.data_dir = data_dir
        self.pool_bytes = pool_bytes
        self.cold = cold
        self.disk_bytes = disk_bytes
        self.proc = None
        self.starts = 0
        self.logs = []

    def start(self, deadline_s=30.0):
        """Starts kvtierd; returns (True, seconds) once it printed its ready line, or
        (False, reason) with its log's tail when it exited or was not ready in time."""
        assert self.proc is None or self.proc.poll() is not None
        log_path = self.log_path = self.run.path(f"daemon-{self.run.next_id()}.log")
        self.logs.append(log_path)
        args = [self.run.kvtierd, "--data-dir", self.data_dir, "--socket", self.run.socket,
                "--host-pool-bytes", str(self.pool_bytes), "--extent-bytes", str(self.pool_bytes),
                "--cold-tier", "on" if self.cold else "off", "--disk-bytes", str(self.disk_bytes),
                "--gpus", "none", "--busy-poll-us", "0",
                # 4 KiB pages: never the huge pages a test beside this run reserved for its own.
                "--huge-pages", "off"]
        parent = os.getpid()
        t0 = time.monotonic()
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT,
                                         preexec_fn=lambda: die_with_parent(parent))
        self.run.daemon_pids.add(self.proc.pid)
        self.starts += 1
        while True:
            text = tail(log_path, 200)
            for line in text.splitlines():
                if line.startswith("kvtierd ready"):
                    fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
                    self.run.segment_prefixes.add(fields.get("segments", ""))
                    return True, time.monotonic() - t0
            if self.proc.poll() is not None:
                self.run.daemon_pids.discard(self.proc.pid)
                return False, f"kvtierd exited ({self.proc.returncode}): " + tail(log_path, 8)
            if time.monotonic() - t0 > deadline_s:
                self.kill()
                return False, f"kvtierd not ready in {deadline_s:.0f} s: " + tail(log_path, 8)
            time.sleep(0.01)

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def warnings(self):
        """{event: count} of the warn and error lines in the logs of every start."""
        out = collections.Counter()
        for path in self.logs:
            try:
                with open(path, errors="replace") as f:
                    for line in f:
                        if "level=warn" in line or "level=error" in line:
                            for field in line.split():
                                if field.startswith("event="):
                                    out[field[6:]] += 1
                        elif "Assertion" in line:
                            out["assertion failed: " + line.split("Assertion", 1)[1].strip()] += 1
            except OSError:
                pass
        return dict(out)

    def kill(self):
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            self.run.daemon_pids.discard(self.proc.pid)

    def stop(self, timeout_s=30.0):
        """SIGTERM (flushes, removes its socket and segments), SIGKILL if it takes too long."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.run.note(f"kvtierd did not stop in {timeout_s:.0f} s after SIGTERM: killed")
                self.run.counts["errors"] += 1
        self.kill()


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
                if client is not None:
                    try:
                        client.close()
                    except kvtier.Error:
                        pass
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


# --- The run ------------------------------------------------------------------------------------


class Run:
    def __init__(self, args):
        self.args = args
        self.kvtierd = args.kvtierd
        self.workdir = args.workdir
        self.socket = os.path.join(self.workdir, "d.sock")
        self.rng = random.Random(args.seed)
        self.counts = collections.Counter()
        self.kill_points = collections.Counter()
        self.typed = collections.Counter()
        self.notes = []
        self.daemon_pids = set()
        self.child_pids = set()
        self.segment_prefixes = set()
        self.mounts = []
        self._id = 0
        self.start_times = []
        self.full_disk = "skipped"
        self.read_only = "skipped"
        self.epoch = mmap.mmap(-1, 4096)  # writer_main's epoch
        self.epoch[0] = 1
        self.snaps_seen = set()  # (epoch, id) of snapshots a check restored
        self.crashed = set()  # pids of daemons found dead by themselves
        self.current = None  # the daemon started last

    def path(self, name):
        return os.path.join(self.workdir, name)

    def next_id(self):
        self._id += 1
        return self._id

    def note(self, text):
        print(f"chaos: {text}", flush=True)
        if len(self.notes) < 200:
            self.notes.append(text[:2000])

    # Children.
    def spawn(self, fn, *args):
        err = self.path(f"child-{self.next_id()}.err")
        pid = fork_child(err, fn, *args)
        self.child_pids.add(pid)
        return pid, err

    def reap(self, pid, block=True):
        """The child's wait status, or None while it runs (block=False)."""
        try:
            got, status = os.waitpid(pid, 0 if block else os.WNOHANG)
        except ChildProcessError:
            self.child_pids.discard(pid)
            return 0
        if got == 0:
            return None
        self.child_pids.discard(pid)
        return status

    def kill_child(self, pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return self.reap(pid)

    def run_checker(self, fn, *args, timeout_s=120.0):
        """fn(*args, result_path) in a child, bounded; its JSON result or None."""
        result = self.path(f"check-{self.next_id()}.json")
        pid, err = self.spawn(fn, *args, result)
        deadline = time.monotonic() + timeout_s
        status = None
        while status is None:
            status = self.reap(pid, block=False)
            if status is None:
                if time.monotonic() > deadline:
                    self.kill_child(pid)
                    self.counts["errors"] += 1
                    self.note(f"a check did not finish in {timeout_s:.0f} s (a hung daemon?): "
                              + tail(err))
                    return None
                time.sleep(0.01)
        if status != 0:
            self.counts["errors"] += 1
            self.note(f"a check failed ({describe_status(status)}): " + tail(err))
            return None
        with open(result) as f:
            got = json.load(f)
        for n in got["notes"]:
            self.note(n)
        return got["counts"]

    # Mounts.
    def can_mount(self):
        probe = self.path("mount-probe")
        os.makedirs(probe, exist_ok=True)
        ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", probe],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
        if ok:
            subprocess.run(["umount", probe])
        os.rmdir(probe)
        return ok

    def mount_tmpfs(self, path, size):
        os.makedirs(path, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", path],
                       check=True)
        self.mounts.append(path)

    def remount(self, path, mode):
        r = subprocess.run(["mount", "-o", f"remount,{mode}", path], capture_output=True,
                           text=True)
        return r.returncode == 0, ((r.stderr or r.stdout).strip().splitlines() or [""])[0]

    def umount(self, path):
        if path in self.mounts:
            r = subprocess.run(["umount", path], capture_output=True, text=True)
            if r.returncode != 0:
                subprocess.run(["umount", "-l", path], capture_output=True)
            self.mounts.remove(path)

    def cleanup(self):
        for pid in list(self.child_pids):
            self.kill_child(pid)
        for pid in list(self.daemon_pids):
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        self.daemon_pids.clear()
        for path in reversed(list(self.mounts)):
            self.umount(path)
        for prefix in self.segment_prefixes:
            if not prefix.startswith("kvtier-"):
                continue
            for name in os.listdir("/dev/shm"):
                if name.startswith(prefix):
                    try:
                        os.unlink(os.path.join("/dev/shm", name))
                    except OSError:
                        pass

    # Part 1.
    def client_kills(self, total):
        a = self.args
        if total <= 0:
            return
        t0 = time.monotonic()
        daemon = Daemon(self, self.path("cdata"), a.client_pool, cold=True, disk_bytes="256M")
        ok, why = daemon.start()
        if not ok:
            self.counts["failed_starts"] += 1
            self.note("the client-kill daemon did not start: " + why)
            return
        phases = mmap.mmap(-1, 4096)
        sweep_lo = 1
        batch = 0
        try:
            while self.counts["client_kills"] < total:
                batch += 1
                want = min(a.batch_kills, total - self.counts["client_kills"])
                logs = []
                live = {}  # slot -> (pid, kill_at)
                kills = 0
                while kills < want:
                    now = time.monotonic()
                    for slot in range(a.workers):
                        if slot not in live and kills + len(live) < want:
                            log = self.path(f"w{batch}.{len(logs)}.log")
                            seed = self.rng.randrange(1 << 30)
                            phases[slot] = 0
                            pid, err = self.spawn(lambda *x: ClientWorker(*x).run(),
                                                  self.socket, f"{batch}.{len(logs)}", seed,
                                                  log, phases, slot)
                            logs.append((log, err))
                            # Mostly early (connect, the first operations), often later.
                            r = self.rng.random()
                            delay = (self.rng.uniform(0, 0.15) if r < 0.3
                                     else self.rng.uniform(0.15, 1.2))
                            live[slot] = (pid, err, now + delay)
                    slot = min(live, key=lambda s: live[s][2])
                    pid, err, at = live[slot]
                    while time.monotonic() < at:
                        status = self.reap(pid, block=False)
                        if status is not None:
                            break
                        time.sleep(min(0.005, max(0.0, at - time.monotonic())))
                    else:
                        status = None
                    if status is None:
                        point = PHASES[phases[slot]]
                        os.kill(pid, signal.SIGKILL)
                        status = self.reap(pid)
                        kills += 1
                        self.kill_points[point] += 1
                    else:
                        self.counts["errors"] += 1
                        self.note(f"client worker ended by itself ({describe_status(status)}): "
                                  + tail(err))
                    del live[slot]
                self.counts["client_kills"] += kills
                if not daemon.alive():
                    self.counts["errors"] += 1
                    self.note("kvtierd died during the client-kill batch: "
                              + tail(daemon.log_path))
                    return
                # Every worker of the batch is dead: what must the daemon hold now?
                allowed, snaps, snap_ids = {}, {}, set()
                snap_intents = 0
                for log, err in logs:
                    al, sn, maybe, si, found, bad = expectations(read_records(log))
                    allowed.update(al)
                    snaps.update(sn)
                    snap_ids |= set(sn) | maybe
                    snap_intents += si
                    self.counts["wrong_bytes"] += found["wrong_bytes"]
                    self.counts["bytes_checked"] += found["bytes_checked"]
                    self.counts["errors"] += found["bad"]
                    for m in bad:
                        self.note(f"worker {log}: {m}")
                    for key, v in found.items():
                        if key.startswith("typed:"):
                            self.typed[key[6:]] += v
                    if os.path.exists(err) and os.path.getsize(err):
                        if "Traceback" in tail(err, 200):
                            self.counts["errors"] += 1
                            self.note(f"worker {log} raised: " + tail(err))
                hi = max(list(snap_ids) + [sweep_lo]) + snap_intents + 4
                got = self.run_checker(batch_check, self.socket, allowed, snaps, (sweep_lo, hi),
                                       a.settle)
                if got is None:
                    return
                # Ids are handed out in order: the next batch's are above every id seen here.
                sweep_lo = max(list(snap_ids) + [sweep_lo - 1]) + 1
                for key in ("leaked_pins", "leaked_blocks", "wrong_bytes", "bytes_checked",
                            "leaked_sessions", "leaked_leases", "leaked_sequences",
                            "leaked_snapshots", "state_errors", "lost_snapshots",
                            "sequences_checked", "snapshots_checked"):
                    self.counts[key] += got.get(key, 0)
                self.note(f"client batch {batch}: {self.counts['client_kills']} kills, "
                          f"{got.get('sequences_checked', 0)} sequences and "
                          f"{got.get('snapshots_checked', 0)} snapshots checked, "
                          f"pins {got.get('leaked_pins', 0)}, leaked blocks "
                          f"{got.get('leaked_blocks', 0)}, wrong bytes "
                          f"{got.get('wrong_bytes', 0)}, pool used {got.get('pool_used')}, "
                          f"spilled {got.get('cold_spilled')}")
                if not any(got.get(k) for k in ("leaked_pins", "leaked_blocks", "wrong_bytes",
                                                 "state_errors", "leaked_sessions",
                                                 "leaked_snapshots", "lost_snapshots")):
                    for log, err in logs:  # kept when something was found
                        for p in (log, err):
                            if os.path.exists(p):
                                os.unlink(p)
        finally:
            daemon.stop()
            phases.close()
            self.counts["client_seconds"] = round(time.monotonic() - t0, 1)

    # Part 2 and 3.
    def writer_records(self, logs):
        """(indices put or being put, snapshots (id, prompt, end), findings) from the writers'
        logs so far."""
        indices, snaps = set(), []
        found = collections.Counter()
        for log in logs:
            for r in read_records(log):
                if r["ev"] == "i":
                    indices.add(r["i"])
                elif r["ev"] == "sd" and r["epoch"] == self.epoch[0]:
                    snaps.append((r["id"], r["i"], r["end"]))
                elif r["ev"] == "wrong":
                    found["wrong_bytes"] += r["n"]
                elif r["ev"] == "ok":
                    found["bytes_checked"] += r["bytes"]
                elif r["ev"] == "f":
                    found["typed:" + r["err"]] += 1
                elif r["ev"] == "bad":
                    found["bad"] += 1
                    self.note("writer: " + r["msg"])
        return indices, snaps, found

    def check_after_start(self, writer_logs, phase):
        indices, snaps, _ = self.writer_records(writer_logs)
        if not indices:
            return {}
        recent = sorted(indices)[-12:]
        sample = sorted(set(self.rng.sample(sorted(indices), min(36, len(indices))) + recent))
        # Snapshots: some at random, and some that an earlier check restored (so they were on
        # disk): those must not go missing later.
        seen = [x for x in snaps if (self.epoch[0], x[0]) in self.snaps_seen]
        snap_sample = set(self.rng.sample(snaps, min(5, len(snaps))))
        snap_sample |= set(self.rng.sample(seen, min(3, len(seen))))
        got = self.run_checker(restart_check, self.socket, self.args.seed, sample,
                               sorted(snap_sample))
        if self.current is not None:
            self.check_alive(self.current, phase)
        if got is None:
            return {}
        for sid in got.pop("restored"):
            self.snaps_seen.add((self.epoch[0], sid))
        for sid in got.pop("missing"):
            if (self.epoch[0], sid) in self.snaps_seen:
                self.counts["lost_snapshots"] += 1
                self.note(f"snapshot {sid} restored after an earlier restart is gone now "
                          f"(cold tier snapshots dropped for capacity: "
                          f"{got.get('snapshots_dropped')})")
        self.counts["wrong_bytes"] += got.get("wrong_bytes", 0)
        self.counts["bytes_checked"] += got.get("bytes_checked", 0)
        for key in ("lookups", "lookup_hits", "snapshots_restored", "snapshots_missing"):
            self.counts[key] += got.get(key, 0)
        for key, v in got.items():
            if key.startswith("checker_typed:"):
                self.typed["checker:" + key[14:]] += v
        return got

    def start_daemon(self, daemon, expect_ok=True, what="restart", refusal_ok=None):
        """Starts `daemon`; a start that fails counts in failed_starts unless `refusal_ok`
        (a predicate on the failure's text) accepts it as a clear refusal, counted apart."""
        ok, info = daemon.start(self.args.start_deadline)
        self.current = daemon
        if ok:
            self.start_times.append(info)
            return True
        # Counted here (a refusal or a failed start): check_alive must not count the same exit
        # again as a daemon that died by itself.
        if daemon.proc is not None:
            self.crashed.add(daemon.proc.pid)
        if refusal_ok is not None and refusal_ok(info):
            self.counts["clear_refusals"] += 1
            self.note(f"{what} refused, as expected, on {daemon.data_dir}: {info.splitlines()[0]}")
            return False
        if expect_ok:
            self.counts["failed_starts"] += 1
            self.note(f"{what} failed on {daemon.data_dir}: {info}")
        return False

    def check_alive(self, daemon, phase):
        """A daemon that died by itself (a crash, an abort) is an error."""
        proc = daemon.proc
        if proc is not None and proc.poll() is not None and proc.pid not in self.crashed:
            self.crashed.add(proc.pid)
            self.counts["errors"] += 1
            self.counts["daemon_crashes"] += 1
            self.note(f"kvtierd died by itself ({phase}, status {daemon.proc.returncode}): "
                      + tail(daemon.log_path, 6))
            return False
        return True

    def kill_cycle(self, daemon, writer_logs, phase, on_fail=None, refusal_ok=None):
        """Let the writers run a random while, SIGKILL the daemon, restart it, check."""
        r = self.rng.random()
        time.sleep(self.rng.uniform(0.0, 0.08) if r < 0.2 else self.rng.uniform(0.1, 1.2))
        self.check_alive(daemon, phase)
        daemon.kill()
        if not self.start_daemon(daemon, refusal_ok=refusal_ok):
            # Once more, so that one failure does not end the part (it is counted).
            if not (on_fail or (lambda: self.start_daemon(daemon, what="second restart")))():
                return False
        self.counts["daemon_restarts"] += 1
        self.check_after_start(writer_logs, phase)
        return True

    def daemon_kills(self, total):
        a = self.args
        if total <= 0:
            return
        t0 = time.monotonic()
        mount_ok = a.mounts and self.can_mount()
        data = self.path("ddata")
        if mount_ok:
            # The data directory on a tmpfs of its own, so that it can be made read-only.
            self.mount_tmpfs(data, "2g")
        else:
            os.makedirs(data, exist_ok=True)
            why = ("--no-mounts" if not a.mounts
                   else "mounting a tmpfs is not permitted (needs root / CAP_SYS_ADMIN)")
            self.note(f"full disk and read-only data directory skipped: {why}")
        daemon = Daemon(self, data, a.daemon_pool, cold=True, disk_bytes=a.disk_bytes)
        if not self.start_daemon(daemon, what="first start"):
            return
        writer_logs, writers = [], {}
        for wid in range(a.writers):
            log = self.path(f"writer{wid}.log")
            writer_logs.append(log)
            writers[wid] = self.spawn(writer_main, self.socket, wid, a.writers, a.seed, log,
                                      self.epoch)
        fd_cycles = ro_cycles = 0
        if mount_ok:
            fd_cycles = max(1, total // 10) if a.full_disk_cycles < 0 else a.full_disk_cycles
            ro_cycles = max(1, total // 25) if a.read_only_cycles < 0 else a.read_only_cycles
        # Plain cycles until `total` restarts succeeded, with the full-disk and read-only cycles
        # in the middle (their successful restarts count too).
        special = ["full_disk"] * (1 if fd_cycles else 0) + ["read_only"] * ro_cycles
        try:
            while self.counts["daemon_restarts"] < total:
                step = "main"
                if special and self.counts["daemon_restarts"] >= total // 2:
                    step = special.pop(0)
                for wid, (pid, err) in list(writers.items()):
                    status = self.reap(pid, block=False)
                    if status is not None:
                        self.counts["errors"] += 1
                        self.note(f"writer {wid} ended ({describe_status(status)}): " + tail(err))
                        writers[wid] = self.spawn(writer_main, self.socket, wid, a.writers,
                                                  a.seed, writer_logs[wid], self.epoch)
                if step == "main":
                    if not self.kill_cycle(daemon, writer_logs, "main"):
                        return
                elif step == "full_disk":
                    daemon = self.full_disk_part(daemon, fd_cycles, writer_logs)
                    if daemon is None:
                        return
                else:
                    if not self.read_only_cycle(daemon, writer_logs):
                        return
                if self.counts["daemon_restarts"] % 10 == 0 and step == "main":
                    self.note(f"daemon restarts: {self.counts['daemon_restarts']}, lookups "
                              f"{self.counts['lookups']} ({self.counts['lookup_hits']} hits), "
                              f"snapshots restored {self.counts['snapshots_restored']} "
                              f"(missing {self.counts['snapshots_missing']}), wrong bytes "
                              f"{self.counts['wrong_bytes']}, failed starts "
                              f"{self.counts['failed_starts']}")
        finally:
            for wid, (pid, err) in writers.items():
                self.kill_child(pid)
            indices, snaps, found = self.writer_records(writer_logs)
            self.counts["prompts_put"] = len(indices)
            self.counts["wrong_bytes"] += found["wrong_bytes"]
            self.counts["bytes_checked"] += found["bytes_checked"]
            self.counts["errors"] += found["bad"]
            for key, v in found.items():
                if key.startswith("typed:"):
                    self.typed["writer:" + key[6:]] += v
            daemon.stop()
            self.umount(data)
            self.counts["daemon_seconds"] = round(time.monotonic() - t0, 1)

    def full_disk_part(self, main_daemon, cycles, writer_logs):
        """`cycles` kill/restart cycles with the data directory on a small tmpfs that the cold
        tier fills; the daemon must keep serving from memory, with typed errors only, and
        restart. The tmpfs also holds a 1 MiB ballast file: when a start fails on the full disk
        (counted), the ballast goes and the daemon must then start and serve. Returns the main
        daemon, restarted, or None to stop."""
        a = self.args
        mnt = self.path("fdisk")
        self.mount_tmpfs(mnt, a.full_disk_size)
        ballast = os.path.join(mnt, "ballast")
        main_daemon.kill()
        self.epoch[0] = 2
        daemon = Daemon(self, os.path.join(mnt, "data"), a.daemon_pool, cold=True,
                        disk_bytes="1G")
        report = {"cycles": 0, "tmpfs": a.full_disk_size, "disk_full_seen": False,
                  "restarts": 0, "failed_starts": 0, "clear_refusals": 0,
                  "started_after_freeing_space": 0, "daemon_crashes": 0}
        failed_before = self.counts["failed_starts"]
        refusals_before = self.counts["clear_refusals"]
        crashes_before = self.counts["daemon_crashes"]

        def full():
            st = os.statvfs(mnt)
            return st.f_bavail * st.f_frsize < 64 << 10

        def refused_for_space(info):
            # kvtierd exits 1 with startup_failed naming the full disk: an operator must free
            # space (it does not start without the cold tier it was told to keep).
            return ("kvtierd exited (1)" in info and "startup_failed" in info
                    and "No space left on device" in info)

        def make_room():
            if not os.path.exists(ballast):
                return False
            os.unlink(ballast)
            ok = self.start_daemon(daemon, what="start after freeing 1 MiB")
            report["started_after_freeing_space"] += ok
            return ok

        try:
            with open(ballast, "wb") as f:
                f.write(bytes(1 << 20))
            if (self.start_daemon(daemon, what="start on the small tmpfs",
                                  refusal_ok=refused_for_space) or make_room()):
                deadline = time.monotonic() + 60  # the writers fill it
                while time.monotonic() < deadline and daemon.alive() and not full():
                    time.sleep(0.05)
                for _ in range(cycles):
                    report["cycles"] += 1
                    report["disk_full_seen"] |= full()
                    if not self.kill_cycle(daemon, writer_logs, "full_disk", on_fail=make_room,
                                           refusal_ok=refused_for_space):
                        break
                    report["restarts"] += 1
                if daemon.alive():
                    self.check_after_start(writer_logs, "full_disk")
        finally:
            self.check_alive(daemon, "full_disk")
            report["failed_starts"] = self.counts["failed_starts"] - failed_before
            report["clear_refusals"] = self.counts["clear_refusals"] - refusals_before
            report["daemon_crashes"] = self.counts["daemon_crashes"] - crashes_before
            daemon.stop()
            self.umount(mnt)
            shutil.rmtree(mnt, ignore_errors=True)
            report["daemon_warnings"] = daemon.warnings()
            self.full_disk = report
            self.note(f"full disk: {json.dumps(report)}")
        self.epoch[0] = 1
        if not self.start_daemon(main_daemon, what="restart after the full-disk cycles"):
            return None
        self.counts["daemon_restarts"] += 1
        self.check_after_start(writer_logs, "main")
        return main_daemon

    def read_only_cycle(self, daemon, writer_logs):
        """The data directory read-only: first under the running daemon (Linux refuses to
        remount a file system read-only while files on it are open for writing, which is
        recorded), then under a killed one, which must refuse to start with a clear error or
        start and serve; made writable again, the daemon must start and hold what it held."""
        if self.read_only == "skipped":
            self.read_only = {"cycles": 0, "remount_while_running": None, "start_outcomes": {}}
        report = self.read_only
        report["cycles"] += 1
        time.sleep(self.rng.uniform(0.1, 0.8))
        self.check_alive(daemon, "read_only")
        ok, why = self.remount(daemon.data_dir, "ro")
        if ok:
            report["remount_while_running"] = "remounted: the daemon kept running"
            time.sleep(self.rng.uniform(0.2, 1.0))
            alive = daemon.alive()
            got = self.check_after_start(writer_logs, "read_only") if alive else {}
            report["while_running_alive"] = alive
            report.setdefault("spill_errors_while_ro", 0)
            report["spill_errors_while_ro"] = got.get("spill_errors", 0)
            daemon.kill()
        else:
            report["remount_while_running"] = f"refused: {why}"
            daemon.kill()
            ok, why = self.remount(daemon.data_dir, "ro")
            if not ok:
                self.counts["errors"] += 1
                self.note(f"cannot remount {daemon.data_dir} read-only after the kill: {why}")
                self.remount(daemon.data_dir, "rw")
                return self.start_daemon(daemon, what="restart after the read-only attempt")
        started, info = daemon.start(self.args.start_deadline)
        if started:
            outcome = "started"
            self.check_after_start(writer_logs, "read_only")
            time.sleep(0.3)
            daemon.kill()
        else:
            reason = info.split("reason=", 1)[-1].split("\n")[0].strip('"')
            outcome = "refused: " + reason
        report["start_outcomes"][outcome] = report["start_outcomes"].get(outcome, 0) + 1
        ok, why = self.remount(daemon.data_dir, "rw")
        if not ok:
            self.counts["errors"] += 1
            self.note(f"cannot remount {daemon.data_dir} read-write: {why}")
            return False
        if not self.start_daemon(daemon, what="restart after the read-only data directory"):
            return False
        self.counts["daemon_restarts"] += 1
        self.check_after_start(writer_logs, "main")
        return True


PROFILES = {
    # client kills, daemon restarts, full-disk cycles, read-only cycles
    "full": (1000, 100, 10, 4),
    "quick": (500, 50, 5, 2),
    "ctest": (150, 20, 2, 1),
}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kvtierd", required=True)
    p.add_argument("--workdir", required=True, help="an empty directory of this run's own")
    p.add_argument("--profile", choices=sorted(PROFILES), default="full")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--client-kills", type=int)
    p.add_argument("--daemon-restarts", type=int)
    p.add_argument("--full-disk-cycles", type=int, default=-1)
    p.add_argument("--read-only-cycles", type=int, default=-1)
    p.add_argument("--batch-kills", type=int, default=50, help="client kills between checks")
    p.add_argument("--workers", type=int, default=3, help="client workers alive at a time")
    p.add_argument("--writers", type=int, default=2, help="writers during daemon kills")
    p.add_argument("--client-pool", default="32M")
    p.add_argument("--daemon-pool", default="2M")
    p.add_argument("--disk-bytes", default="1G", help="cold tier bound in the daemon loop")
    p.add_argument("--full-disk-size", default="6m")
    p.add_argument("--start-deadline", type=float, default=30.0)
    p.add_argument("--settle", type=float, default=15.0,
                   help="seconds the daemon gets to notice dead clients")
    p.add_argument("--no-mounts", dest="mounts", action="store_false")
    args = p.parse_args()
    kills, restarts, fd, ro = PROFILES[args.profile]
    if args.client_kills is None:
        args.client_kills = kills
    if args.daemon_restarts is None:
        args.daemon_restarts = restarts
    if args.full_disk_cycles < 0 and args.daemon_restarts == restarts:
        args.full_disk_cycles = fd
    if args.read_only_cycles < 0 and args.daemon_restarts == restarts:
        args.read_only_cycles = ro
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 31)

    run = Run(args)
    stop = {"signal": None}

    def on_signal(signo, _):
        stop["signal"] = signo
        raise KeyboardInterrupt

    # SIGINT too: a background job of a script starts with SIGINT ignored, and Ctrl-C reaches
    # the whole process group.
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    t0 = time.monotonic()
    print(f"chaos: seed {args.seed}, profile {args.profile}: {args.client_kills} client kills, "
          f"{args.daemon_restarts} daemon restarts; work directory {args.workdir}", flush=True)
    interrupted = False
    try:
        run.client_kills(args.client_kills)
        run.daemon_kills(args.daemon_restarts)
    except KeyboardInterrupt:
        interrupted = True
        run.note("interrupted")
    except Exception:
        run.counts["errors"] += 1
        run.note("chaos.py failed: " + traceback.format_exc())
    finally:
        run.cleanup()
    c = run.counts
    summary = {
        "client_kills": c["client_kills"],
        "daemon_restarts": c["daemon_restarts"],
        "bytes_checked": c["bytes_checked"],
        "leaked_pins": c["leaked_pins"],
        "leaked_blocks": c["leaked_blocks"],
        "wrong_bytes": c["wrong_bytes"],
        "failed_starts": c["failed_starts"],
        "errors": c["errors"],
        "full_disk": run.full_disk,
        "read_only": run.read_only,
        "seconds": round(time.monotonic() - t0, 1),
        "seed": args.seed,
        "leaked_sessions": c["leaked_sessions"],
        "leaked_leases": c["leaked_leases"],
        "leaked_sequences": c["leaked_sequences"],
        "leaked_snapshots": c["leaked_snapshots"],
        "state_errors": c["state_errors"],
        "lost_snapshots": c["lost_snapshots"],
        "sequences_checked": c["sequences_checked"],
        "snapshots_checked": c["snapshots_checked"],
        "lookups_after_restart": c["lookups"],
        "lookup_hits_after_restart": c["lookup_hits"],
        "snapshots_restored_after_restart": c["snapshots_restored"],
        "snapshots_missing_after_restart": c["snapshots_missing"],
        "prompts_put": c["prompts_put"],
        "kill_points": dict(sorted(run.kill_points.items())),
        "typed_errors": dict(sorted(run.typed.items())),
        "start_seconds_max": round(max(run.start_times), 3) if run.start_times else None,
        "client_part_seconds": c["client_seconds"],
        "daemon_part_seconds": c["daemon_seconds"],
        "daemon_crashes": c["daemon_crashes"],
    }
    failed = any(summary[k] for k in ("leaked_pins", "leaked_blocks", "wrong_bytes",
                                      "failed_starts", "errors", "leaked_sessions",
                                      "leaked_leases", "leaked_sequences", "leaked_snapshots",
                                      "state_errors", "lost_snapshots"))
    if interrupted:
        summary["interrupted"] = True
    print(json.dumps(summary), flush=True)
    return 1 if failed or interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
