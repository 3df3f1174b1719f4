"""Soak and load for kvtierd: many client processes for a long while (scripts/soak.sh).

Run through scripts/soak.sh, which sets PYTHONPATH to the build tree's package and makes the work
directory. One daemon (cold tier on, a pool small enough that blocks are evicted and spilled) and
N client processes, each forked from this one, looping over random calls until it is told to stop
or its lifetime ends (then it exits, cleanly or by dropping its connection, and a new one takes its
slot: sessions come and go):

  put of a prompt (a shared family prefix + a tail: blocks are shared between clients and evicted),
  append (decode-like growth), begin_put + in-place or packed writes + commit, lookup of a popular
  prompt (+ reading the hit bytes, packed or block by block, sometimes bound to a sequence and read
  back with get), get of its own sequences, remove (whole or a tail), truncate, copy_prefix,
  snapshot + restore + drop_snapshot.

KV content is a pure function of the token prefix (as block keys are; tests/chaos/kv_content.py,
shared with the chaos runs), so any hit from any writer and any tier is checked byte for byte: a
difference is `wrong_bytes`, fatal. Typed errors (kvtier.Error subclasses) are allowed and counted
by call kind, except Internal; any other exception is an untyped error. Each client keeps a
latency histogram per call kind (log buckets, 16 a doubling: bounded memory) and writes it to a
file of its own; the parent merges them.

A sampler process reads the daemon's VmRSS, RssAnon, open descriptors, threads and stats every few
seconds. Bounded means: the largest RSS (and descriptor count) of the last third of the run is at
most the largest of the middle third plus a tolerance (RSS: max(10 %, 16 MiB), descriptors: 16).
At the end the clients stop, the daemon must reach 1 session (the checker's), 0 leases and 0 pinned
blocks within a bounded wait, still be alive, and exit 0 on SIGTERM.

The last line of stdout is one JSON object (docs/reliability.md#soak); the exit status is 1 on any
untyped error, wrong byte, unbounded growth, leak or daemon failure.
"""

import argparse
import collections
import json
import os
import random
import signal
import subprocess
import sys
import time
import traceback

# The content scheme and the process helpers live beside the chaos runs, which share them.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "chaos"))
import kvtier  # noqa: E402
from chaos_processes import describe_status, die_with_parent, fork_child, tail  # noqa: E402
from soak_clients import WRONG_EXIT, Kind, worker_main, write_json  # noqa: E402

# --- The sampler ---------------------------------------------------------------------------------


def proc_sample(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssShmem", "RssFile", "Threads"):
                out[key] = int(value.split()[0])
    # The cold tier's table and blob files come and go with RocksDB's flushes and compactions
    # (bounded by the tier's bound, not by the clients): counted apart from the descriptors a
    # leak would grow (sockets, pool segments, the lane's).
    fds = tables = 0
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if target.endswith((".sst", ".blob")):
            tables += 1
        else:
            fds += 1
    out["fds"] = fds
    out["fds_cold_files"] = tables
    return out


def sampler_main(socket, daemon_pid, path, interval_s, t0):
    """Appends one JSON line per sample: seconds since t0, /proc figures and the daemon's stats."""
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    client = None
    while not stop:
        rec = {"t": round(time.monotonic() - t0, 2)}
        try:
            rec.update(proc_sample(daemon_pid))
        except OSError as e:
            rec["proc_error"] = str(e)
        try:
            if client is None:
                client = kvtier.Client(socket, client_name="soak-sampler", map_pool=False)
            s = client.stats()
            rec.update(sessions=s["clients"], read_leases=s["leases"]["read"],
                       write_leases=s["leases"]["write"], pinned=s["blocks"]["pinned"],
                       used=s["blocks"]["used"], cached=s["blocks"]["cached"],
                       total=s["blocks"]["total"], sequences=s["sequences"],
                       snapshots=s["snapshots"], evictions=s["evictions"], hits=s["hits"],
                       misses=s["misses"], bytes_put=s["bytes"]["put"], bytes_got=s["bytes"]["got"],
                       cold_spilled=s["cold"]["spilled"], cold_promoted=s["cold"]["promoted"],
                       cold_records=s["cold"]["records"], cold_disk_bytes=s["cold"]["disk_bytes"],
                       spill_errors=s["cold"]["spill_errors"],
                       capacity_evicted=s["cold"]["capacity_evicted"])
        except kvtier.Error as e:
            rec["stats_error"] = type(e).__name__
            client = None
        os.write(fd, (json.dumps(rec, separators=(",", ":")) + "\n").encode())
        end = time.monotonic() + interval_s
        while not stop and time.monotonic() < end:
            time.sleep(min(0.1, max(0.0, end - time.monotonic())))
    if client is not None:
        client.close()
    return 0


def final_check(socket, settle_s, path):
    """With every client gone: sessions, leases and pins must drop (bounded wait)."""
    with kvtier.Client(socket, client_name="soak-checker", map_pool=False) as client:
        deadline = time.monotonic() + settle_s
        t0 = time.monotonic()
        while True:
            s = client.stats()
            ok = (s["clients"] == 1 and s["leases"]["read"] == 0 and s["leases"]["write"] == 0
                  and s["blocks"]["pinned"] == 0)
            if ok or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        write_json(path, {"sessions": s["clients"], "read_leases": s["leases"]["read"],
                          "write_leases": s["leases"]["write"], "pinned": s["blocks"]["pinned"],
                          "sequences": s["sequences"], "snapshots": s["snapshots"],
                          "used": s["blocks"]["used"], "cached": s["blocks"]["cached"],
                          "evictions": s["evictions"], "cold": s["cold"],
                          "settle_seconds": round(time.monotonic() - t0, 2)})
    return 0


# --- The run -------------------------------------------------------------------------------------


def slope_per_minute(points):
    """Least-squares slope of (seconds, value) points, per minute."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    den = sum((t - mt) ** 2 for t, _ in points)
    if den == 0:
        return 0.0
    return sum((t - mt) * (v - mv) for t, v in points) / den * 60.0


class Run:
    def __init__(self, args):
        self.a = args
        self.work = args.workdir
        self.socket = os.path.join(self.work, "d.sock")
        self.rng = random.Random(args.seed)
        self.children = {}  # pid -> (what, slot, gen, out, err)
        self.daemon = None
        self.segments = set()
        self.kinds = collections.defaultdict(Kind)
        self.counts = collections.Counter()
        self.ends = collections.Counter()
        self.notes = []
        self.fatal = None
        self._id = 0

    def path(self, name):
        return os.path.join(self.work, name)

    def note(self, text):
        print(f"soak: {text}", flush=True)
        if len(self.notes) < 40:
            self.notes.append(text[:2000])

    def next_id(self):
        self._id += 1
        return self._id

    # The daemon.
    def start_daemon(self):
        a = self.a
        self.daemon_log = self.path("daemon.log")
        args = [a.kvtierd, "--data-dir", self.path("data"), "--socket", self.socket,
                "--host-pool-bytes", a.pool, "--extent-bytes", a.pool, "--cold-tier", "on",
                "--disk-bytes", a.disk_bytes, "--gpus", "none", "--busy-poll-us", "0",
                # 4 KiB pages, as the tests' daemons: never the huge pages a test reserved.
                "--huge-pages", "off"]
        parent = os.getpid()
        with open(self.daemon_log, "wb") as log:
            # SIGTERM if we die: it still removes its socket and shared-memory segments.
            self.daemon = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                preexec_fn=lambda: die_with_parent(parent, signal.SIGTERM))
        t0 = time.monotonic()
        while time.monotonic() - t0 < 30:
            for line in tail(self.daemon_log, 200).splitlines():
                if line.startswith("kvtierd ready"):
                    fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
                    self.segments.add(fields.get("segments", ""))
                    return True
            if self.daemon.poll() is not None:
                break
            time.sleep(0.02)
        self.note("kvtierd did not start: " + tail(self.daemon_log, 10))
        return False

    def daemon_warnings(self):
        out = collections.Counter()
        for line in tail(self.daemon_log, 100000).splitlines():
            if "level=warn" in line or "level=error" in line:
                for field in line.split():
                    if field.startswith("event="):
                        out[field[6:]] += 1
            elif "Assertion" in line or "AddressSanitizer" in line:
                out["fatal: " + line.strip()[:200]] += 1
        return dict(out)

    # Children.
    def spawn(self, what, fn, *args, slot=None, gen=None, out=None):
        err = self.path(f"{what}-{self.next_id()}.err")
        pid = fork_child(err, fn, *args)
        self.children[pid] = (what, slot, gen, out, err)
        return pid

    def spawn_worker(self, slot, gen):
        a = self.a
        out = self.path(f"c{slot}.{gen}.json")
        lo, hi = a.lifetime
        lifetime = self.rng.uniform(lo, hi)
        seed = self.rng.randrange(1 << 40)
        return self.spawn("client", worker_main, self.socket, slot, gen, seed, a.seed, out,
                          lifetime, a.flush, slot=slot, gen=gen, out=out)

    def merge_worker(self, out, err, status):
        try:
            with open(out) as f:
                d = json.load(f)
        except (OSError, ValueError):
            d = None
        if d is not None:
            for name, k in d["kinds"].items():
                self.kinds[name].merge(k)
            self.counts.update(d["counts"])
            self.ends[d["end"]] += 1
            for n in d["notes"]:
                self.note(f"client {d['slot']}.{d['gen']}: {n}")
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == WRONG_EXIT:
            self.fatal = "wrong bytes"
        elif os.WIFSIGNALED(status) and self.stopping:
            # SIGTERM before its handler was installed (a client just forked), or SIGKILL of
            # one that did not stop in time (counted in killed_at_end).
            self.counts["signalled_at_end"] += 1
        elif not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
            self.counts["client_failures"] += 1
            self.note(f"a client ended with {describe_status(status)}: " + tail(err))
        elif os.path.exists(err) and "Traceback" in tail(err, 200):
            self.counts["client_failures"] += 1
            self.note("a client printed a traceback: " + tail(err))
        for p in (out, err):
            try:
                os.unlink(p)
            except OSError:
                pass

    def reap(self):
        """Reaps ended children (never the daemon: only our forked pids); returns
        [(pid, what, slot, gen)]."""
        ended = []
        for pid in list(self.children):
            try:
                got, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                got, status = pid, 0
            if got == 0:
                continue
            what, slot, gen, out, err = self.children.pop(pid)
            if what == "client":
                self.merge_worker(out, err, status)
            elif status != 0 and not (os.WIFSIGNALED(status) and self.stopping):
                self.counts["client_failures"] += 1
                self.note(f"the {what} ended with {describe_status(status)}: " + tail(err))
            ended.append((pid, what, slot, gen))
        return ended

    def signal_all(self, sig, what=None):
        for pid, info in list(self.children.items()):
            if what is None or info[0] == what:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass

    def wait_children(self, what, timeout_s):
        deadline = time.monotonic() + timeout_s
        while any(i[0] == what for i in self.children.values()):
            if time.monotonic() > deadline:
                return False
            if not self.reap():
                time.sleep(0.05)
        return True

    # The load.
    stopping = False

    def run(self):
        a = self.a
        if not self.start_daemon():
            self.fatal = "kvtierd did not start"
            return None
        t0 = time.monotonic()
        samples_path = self.path("samples.jsonl")
        self.spawn("sampler", sampler_main, self.socket, self.daemon.pid, samples_path,
                   a.interval, t0)
        gens = [0] * a.clients
        for slot in range(a.clients):
            self.spawn_worker(slot, 0)
        load_end = t0 + a.seconds
        last_progress = t0
        while time.monotonic() < load_end and self.fatal is None:
            for pid, what, slot, gen in self.reap():
                if what == "client" and self.fatal is None:
                    self.counts["client_sessions_ended"] += 1
                    gens[slot] += 1
                    self.spawn_worker(slot, gens[slot])
            if self.daemon.poll() is not None:
                self.fatal = f"kvtierd died (status {self.daemon.returncode})"
                self.note(self.fatal + ": " + tail(self.daemon_log, 10))
                break
            now = time.monotonic()
            if now - last_progress >= a.progress:
                last_progress = now
                self.note(f"{now - t0:.0f} s: {self.counts['client_sessions_ended']} client "
                          f"sessions ended and replaced; last sample "
                          f"{self.last_sample(samples_path)}")
            time.sleep(0.1)
        load_seconds = time.monotonic() - t0
        # Stop: clients finish their call, remove what they own and close.
        self.stopping = True
        self.signal_all(signal.SIGTERM, "client")
        if not self.wait_children("client", a.stop_wait):
            n = sum(1 for i in self.children.values() if i[0] == "client")
            self.counts["killed_at_end"] += n
            self.note(f"{n} clients had not stopped {a.stop_wait:.0f} s after SIGTERM: killed")
            self.signal_all(signal.SIGKILL, "client")
            self.wait_children("client", 30)
        self.signal_all(signal.SIGTERM, "sampler")
        self.wait_children("sampler", 30)
        return load_seconds, samples_path

    @staticmethod
    def last_sample(path):
        line = tail(path, 1).strip()
        try:
            s = json.loads(line)
        except ValueError:
            return "none"
        return (f"rss {s.get('VmRSS', 0) / 1024:.1f} MiB (anon {s.get('RssAnon', 0) / 1024:.1f}),"
                f" fds {s.get('fds')}, threads {s.get('Threads')}, sessions {s.get('sessions')},"
                f" leases {s.get('read_leases')}+{s.get('write_leases')}, pinned {s.get('pinned')},"
                f" evictions {s.get('evictions')}, spilled {s.get('cold_spilled')}")

    def finish(self):
        """Final check in a child, then SIGTERM the daemon: must exit 0."""
        out = {"leaked_sessions": None, "leaked_leases": None, "leaked_pins": None}
        if self.daemon is None or self.daemon.poll() is not None:
            return out, None
        result = self.path("final.json")
        self.spawn("checker", final_check, self.socket, self.a.settle, result)
        ok = self.wait_children("checker", self.a.settle + 60)
        if not ok:
            self.signal_all(signal.SIGKILL, "checker")
            self.wait_children("checker", 10)
            self.note("the final check did not finish (a hung daemon?)")
            self.fatal = self.fatal or "final check hung"
        try:
            with open(result) as f:
                got = json.load(f)
            out = {"leaked_sessions": got["sessions"] - 1,
                   "leaked_leases": got["read_leases"] + got["write_leases"],
                   "leaked_pins": got["pinned"], "final_stats": got}
        except (OSError, ValueError):
            self.fatal = self.fatal or "final check failed"
        alive = self.daemon.poll() is None
        if not alive:
            self.fatal = self.fatal or f"kvtierd died (status {self.daemon.returncode})"
            return out, None
        t = time.monotonic()
        self.daemon.terminate()
        try:
            code = self.daemon.wait(self.a.term_wait)
        except subprocess.TimeoutExpired:
            self.note(f"kvtierd did not exit {self.a.term_wait:.0f} s after SIGTERM: killed")
            self.daemon.kill()
            self.daemon.wait()
            code = "timeout"
        out["term_seconds"] = round(time.monotonic() - t, 2)
        return out, code

    def cleanup(self):
        self.signal_all(signal.SIGKILL)
        for pid in list(self.children):
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        self.children.clear()
        if self.daemon is not None and self.daemon.poll() is None:
            self.daemon.terminate()
            try:
                self.daemon.wait(20)
            except subprocess.TimeoutExpired:
                self.daemon.kill()
                self.daemon.wait()
        for prefix in self.segments:
            if not prefix.startswith("kvtier-"):
                continue
            for name in os.listdir("/dev/shm"):
                if name.startswith(prefix):
                    try:
                        os.unlink(os.path.join("/dev/shm", name))
                    except OSError:
                        pass


def summarize_samples(path, seconds):
    samples = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    s = json.loads(line)
                except ValueError:
                    continue
                if "VmRSS" in s and s["t"] <= seconds:
                    samples.append(s)
    except OSError:
        pass
    if not samples:
        return {"samples": 0}, False

    def mib(kb):
        return round(kb / 1024.0, 1)

    warm_t = seconds * 0.2
    post = [s for s in samples if s["t"] >= warm_t] or samples
    middle = [s for s in samples if seconds / 3 <= s["t"] < 2 * seconds / 3]
    last = [s for s in samples if s["t"] >= 2 * seconds / 3]
    out = {
        "samples": len(samples),
        "rss_start_mib": mib(samples[0]["VmRSS"]),
        "rss_warm_mib": mib(post[0]["VmRSS"]),
        "rss_max_mib": mib(max(s["VmRSS"] for s in samples)),
        "rss_end_mib": mib(samples[-1]["VmRSS"]),
        "rss_anon_start_mib": mib(samples[0].get("RssAnon", 0)),
        "rss_anon_warm_mib": mib(post[0].get("RssAnon", 0)),
        "rss_anon_max_mib": mib(max(s.get("RssAnon", 0) for s in samples)),
        "rss_anon_end_mib": mib(samples[-1].get("RssAnon", 0)),
        "rss_shmem_max_mib": mib(max(s.get("RssShmem", 0) for s in samples)),
        "rss_slope_mib_per_min": round(slope_per_minute(
            [(s["t"], s["VmRSS"] / 1024.0) for s in post]), 3),
        "rss_anon_slope_mib_per_min": round(slope_per_minute(
            [(s["t"], s.get("RssAnon", 0) / 1024.0) for s in post]), 3),
        "fds_start": samples[0]["fds"],
        "fds_warm": post[0]["fds"],
        "fds_max": max(s["fds"] for s in samples),
        "fds_end": samples[-1]["fds"],
        "fds_slope_per_min": round(slope_per_minute([(s["t"], s["fds"]) for s in post]), 3),
        "fds_cold_files_max": max(s.get("fds_cold_files", 0) for s in samples),
        "threads_max": max(s.get("Threads", 0) for s in samples),
        "threads_end": samples[-1].get("Threads", 0),
        "sessions_max": max(s.get("sessions", 0) for s in samples),
    }
    bounded = True
    if middle and last:
        rss_mid = max(s["VmRSS"] for s in middle)
        rss_last = max(s["VmRSS"] for s in last)
        anon_mid = max(s.get("RssAnon", 0) for s in middle)
        anon_last = max(s.get("RssAnon", 0) for s in last)
        fd_mid = max(s["fds"] for s in middle)
        fd_last = max(s["fds"] for s in last)
        rss_tol = max(0.10 * rss_mid, 16 * 1024)
        anon_tol = max(0.10 * anon_mid, 16 * 1024)
        out.update(rss_max_middle_mib=mib(rss_mid), rss_max_last_mib=mib(rss_last),
                   rss_anon_max_middle_mib=mib(anon_mid), rss_anon_max_last_mib=mib(anon_last),
                   fds_max_middle=fd_mid, fds_max_last=fd_last)
        bounded = (rss_last <= rss_mid + rss_tol and anon_last <= anon_mid + anon_tol
                   and fd_last <= fd_mid + 16)
    else:
        out["note"] = "too few samples for the slope check"
    last_stats = [s for s in samples if "evictions" in s]
    if last_stats:
        s = last_stats[-1]
        for key in ("evictions", "cold_spilled", "cold_promoted", "cold_records",
                    "cold_disk_bytes", "spill_errors", "capacity_evicted", "hits", "misses",
                    "bytes_put", "bytes_got"):
            out[key] = s.get(key)
        out["pool_blocks"] = s.get("total")
        out["max_read_leases"] = max(x.get("read_leases", 0) for x in last_stats)
        out["max_pinned"] = max(x.get("pinned", 0) for x in last_stats)
        out["max_sequences"] = max(x.get("sequences", 0) for x in last_stats)
    stats_errors = collections.Counter(s["stats_error"] for s in samples if "stats_error" in s)
    if stats_errors:
        out["stats_errors"] = dict(stats_errors)
    return out, bounded


PROFILES = {
    # clients, seconds, sample interval, client lifetime range (s), progress interval, pool,
    # cold tier bound (reached early in the run: a steady state)
    "full": (64, 600, 3.0, (20.0, 120.0), 60.0, "64M", "256M"),
    "ctest": (16, 30, 1.0, (4.0, 15.0), 10.0, "32M", "32M"),
}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kvtierd", required=True)
    p.add_argument("--workdir", required=True, help="an empty directory of this run's own")
    p.add_argument("--profile", choices=sorted(PROFILES), default="full")
    p.add_argument("--clients", type=int)
    p.add_argument("--seconds", type=float, help="seconds of load (--minutes M: 60 M)")
    p.add_argument("--seed", type=int)
    p.add_argument("--interval", type=float, help="seconds between daemon samples")
    p.add_argument("--pool", help="host pool (small: eviction and spill; 64M, --ctest 32M)")
    p.add_argument("--disk-bytes", help="cold tier bound (256M, --ctest 32M)")
    p.add_argument("--flush", type=float, default=3.0, help="seconds between client reports")
    p.add_argument("--stop-wait", type=float, default=60.0)
    p.add_argument("--settle", type=float, default=30.0,
                   help="seconds the daemon gets to drop sessions, leases and pins at the end")
    p.add_argument("--term-wait", type=float, default=60.0)
    args = p.parse_args()
    clients, seconds, interval, lifetime, progress, pool, disk = PROFILES[args.profile]
    args.pool = args.pool or pool
    args.disk_bytes = args.disk_bytes or disk
    args.clients = args.clients or clients
    args.seconds = args.seconds or seconds
    args.interval = args.interval or interval
    args.lifetime = lifetime
    args.progress = progress
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 31)

    run = Run(args)
    stop = {"signal": None}

    def on_signal(signo, _):
        stop["signal"] = signo
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    t0 = time.monotonic()
    print(f"soak: seed {args.seed}, {args.clients} clients for {args.seconds:.0f} s, pool "
          f"{args.pool}, cold tier bound {args.disk_bytes}; work directory {args.workdir}",
          flush=True)
    interrupted = False
    load_seconds, samples_path = 0.0, run.path("samples.jsonl")
    end, term_code = {"leaked_sessions": None, "leaked_leases": None, "leaked_pins": None}, None
    try:
        got = run.run()
        if got is not None:
            load_seconds, samples_path = got
        end, term_code = run.finish()
    except KeyboardInterrupt:
        interrupted = True
        run.note("interrupted")
    except Exception:
        run.counts["harness_errors"] += 1
        run.note("soak.py failed: " + traceback.format_exc())
    finally:
        run.cleanup()
    resources, bounded = summarize_samples(samples_path, load_seconds or args.seconds)
    calls = {"total": sum(k.n for n, k in run.kinds.items() if not n.startswith("other:"))}
    typed_total = collections.Counter()
    for name in sorted(run.kinds):
        k = run.kinds[name]
        typed_total.update(k.typed)
        entry = {"typed_errors": dict(sorted(k.typed.items()))}
        if k.n:
            entry = {"count": k.n, "p50_us": round(k.quantile(0.5)),
                     "p99_us": round(k.quantile(0.99)), "max_us": round(k.max), **entry}
        calls[name] = entry
    c = run.counts
    untyped = c["untyped_errors"] + c["client_failures"] + c["harness_errors"]
    summary = {
        "clients": args.clients,
        "seconds": round(load_seconds, 1),
        "wall_seconds": round(time.monotonic() - t0, 1),
        "seed": args.seed,
        "calls": calls,
        "calls_per_second": round(calls["total"] / load_seconds, 1) if load_seconds else None,
        "typed_errors": dict(sorted(typed_total.items())),
        "untyped_errors": untyped,
        "internal_errors": c["internal_errors"],
        "contract_errors": c["contract_errors"],
        "wrong_bytes": c["wrong_bytes"],
        "bytes_checked": c["bytes_checked"],
        "lookups": c["lookups"],
        "lookup_hits": c["lookup_hits"],
        "client_sessions": sum(run.ends.values()),
        "client_ends": dict(sorted(run.ends.items())),
        "clients_killed_at_end": c["killed_at_end"],
        "resources": resources,
        "bounded": bounded,
        "leaked_sessions": end.get("leaked_sessions"),
        "leaked_leases": end.get("leaked_leases"),
        "leaked_pins": end.get("leaked_pins"),
        "final_stats": end.get("final_stats"),
        "daemon_exit": term_code,
        "daemon_term_seconds": end.get("term_seconds"),
        "daemon_warnings": run.daemon_warnings() if run.daemon is not None else {},
        "fatal": run.fatal,
    }
    failed = bool(untyped or c["internal_errors"] or c["contract_errors"] or c["wrong_bytes"]
                  or not bounded or end.get("leaked_sessions") != 0
                  or end.get("leaked_leases") != 0 or end.get("leaked_pins") != 0
                  or term_code != 0 or run.fatal or c["killed_at_end"])
    if interrupted:
        summary["interrupted"] = True
    if run.notes:
        summary["notes"] = run.notes[:10]
    summary["ok"] = not (failed or interrupted)
    print(json.dumps(summary), flush=True)
    return 1 if failed or interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
