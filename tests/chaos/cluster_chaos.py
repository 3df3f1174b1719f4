"""Cluster chaos: etcd and 3-5 kvtierd, each in a network namespace of its own, under a client
load while faults come at random (scripts/cluster-chaos.sh, docs/reliability.md#cluster-chaos).

Run through scripts/cluster-chaos.sh, which sets PYTHONPATH to the build tree's package, makes the
work directory and removes the namespaces of the run whatever happens to this process.

The twin of a multi-host cluster on one machine: a bridge in a namespace of the run's own ("hub"),
and one namespace per daemon and one for etcd, each joined to the bridge by a veth pair and given
its own address (10.77.0.0/24, seen nowhere else). The daemons listen on those addresses (Cap'n
Proto and UCX), so they require the cluster token; membership is etcd's. Nothing is created in the
machine's own network namespace, and everything created is removed at the end, also on error and
on SIGINT/SIGTERM.

Load: several client processes per node (each inside its node's namespace, talking to its daemon
over the Unix socket) look up prompts drawn from one shared set — shared prefixes, so a prompt put
on one node is a remote hit on the others — at a bounded rate, check every hit's bytes against
content the checker recomputes (KV is a pure function of the token prefix), and put what missed.

Faults, at random moments, several at once on different nodes:
  kill       SIGKILL of a daemon, restarted on the same data directory (cold tier on)
  stop       SIGSTOP, SIGCONT a few seconds later (alive, connected, silent)
  partition  the node's link taken down on the bridge and up again (a real partition)
  etcd       etcd SIGKILLed and restarted on its data directory
  flip       one byte flipped, through the pool's shared mapping, in a sealed block of a prompt
             put on that node for the purpose; a client on another node then looks the prompt up:
             the block must be a miss (its writer's checksum no longer matches), never served

Checked: every hit's bytes (wrong_bytes); no daemon exits unless killed (daemon_crashes); no
lookup takes longer than its deadline — one peer deadline plus a local allowance — unless its own
daemon was stopped or killed meanwhile (lookups_over_deadline); at the end, with the clients gone,
no pinned block, lease or unsealed block left on any daemon (leaked_pins, leaked_blocks). The last
line of stdout is one JSON object; the exit status is 1 when any of those is not zero.

The clients and the run are here; the network and the processes in its namespaces (Network, Proc,
enter_netns) are in cluster_network.py, beside this file.
"""

import argparse
import collections
import ctypes
import heapq
import json
import os
import random
import signal
import subprocess
import sys
import time

import chaos as base  # content and process helpers of the single-node chaos (same directory)
import kvtier
from cluster_network import Network, Proc, enter_netns

BT = base.BT
NET = "10.77.0."
ETCD_IP = NET + "2"
PEER_PORT = 7000

PROFILES = {
    # faults, nodes, clients per node, lookups per second per client, seconds between faults
    "full": (320, 4, 2, 8, (0.3, 1.2)),
    "quick": (36, 3, 2, 8, (0.4, 1.0)),
}
FAULT_WEIGHTS = {"kill": 3, "stop": 3, "partition": 3, "etcd": 1, "flip": 3}


def node_ip(i):
    return NET + str(10 + i)


# --- Clients ------------------------------------------------------------------------------------

FAMILIES = 40


def prompt_tokens(seed, i):
    """Prompt i of the shared set: one of FAMILIES prefixes of 8-48 blocks plus a tail of its own
    of 1-12 blocks (whole blocks: every token of a hit is in a sealed block)."""
    r = random.Random(f"cluster-prompt/{seed}/{i}")
    f = random.Random(f"cluster-family/{seed}/{i % FAMILIES}")
    prefix = [f.randrange(base.VOCAB) for _ in range(BT * f.randint(8, 48))]
    return prefix + [r.randrange(base.VOCAB) for _ in range(BT * r.randint(1, 12))]


def flip_tokens(seed, k):
    """The prompt of flip k: nobody else ever puts or looks it up."""
    r = random.Random(f"cluster-flip/{seed}/{k}")
    return [base.VOCAB + k] + [r.randrange(base.VOCAB) for _ in range(BT * 8 - 1)]


def connect(sock, name):
    client = kvtier.Client(sock, client_name=name)
    return client, client.open(base.layout())


def client_main(ns, sock, cid, seed, prompts, rate, log_path):
    """Looks up prompts at `rate` a second until killed, checking every hit; puts what missed.
    Logs {"ev": "L", "t0", "t1", "m": matched, "w": wrong bytes} per lookup and {"ev": "E", "t",
    "err"} per typed error (its daemon killed or restarting: it reconnects)."""
    enter_netns(ns)
    rec = base.Recorder(log_path)
    rng = random.Random(seed)
    client = space = None
    k = 0
    next_at = time.monotonic()
    while True:
        next_at += rng.expovariate(rate)
        delay = next_at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        else:
            next_at = time.monotonic()
        try:
            if client is None:
                client, space = connect(sock, f"chaos-{cid}")
            tokens = prompt_tokens(seed >> 8, rng.randrange(prompts))
            t0 = time.monotonic()
            with space.lookup(tokens, remote="fetch") as h:
                t1 = time.monotonic()
                m = h.end
                wrong = base.wrong_bytes(h.copy_to(), base.packed(tokens, 0, m)) if m else 0
            rec(ev="L", t0=round(t0, 4), t1=round(t1, 4), m=m, w=wrong)
            if m < len(tokens):
                k += 1
                seq = f"c{cid}-{k}"
                space.put(seq, 0, tokens, base.packed(tokens, 0, len(tokens)))
                space.remove(seq)
        except kvtier.Error as e:
            rec(ev="E", t=round(time.monotonic(), 4), err=type(e).__name__)
            base.close_quietly(client)
            client = space = None
            time.sleep(0.1)


def flip_main(ns, sock, seed, k, result_path):
    """Puts flip prompt k, then flips one byte of one of its sealed blocks in the pool."""
    enter_netns(ns)
    rng = random.Random(f"flip-byte/{seed}/{k}")
    client, space = connect(sock, f"chaos-flip-{k}")
    tokens = flip_tokens(seed, k)
    space.put(f"flip-{k}", 0, tokens, base.packed(tokens, 0, len(tokens)))
    with space.lookup(tokens, remote="local") as h:
        if h.end != len(tokens):
            raise RuntimeError(f"flip {k}: the prompt just put matched {h.end} tokens")
        j = rng.randrange(1, h.block_count)  # block 0 stays good: the check sees a partial hit
        a = h.block(j).numpy()
        addr = a.__array_interface__["data"][0] + rng.randrange(a.nbytes)
        del a
        byte = ctypes.c_uint8.from_address(addr)
        byte.value ^= 1 << rng.randrange(8)
    space.remove(f"flip-{k}")
    client.close()
    with open(result_path, "w") as f:
        json.dump({"k": k, "block": j}, f)


def check_flip_main(ns, sock, seed, k, block, result_path):
    """Looks flip prompt k up from another node: a hit may end before block `block`, never
    include it (its bytes are not its writer's)."""
    enter_netns(ns)
    client, space = connect(sock, f"chaos-check-{k}")
    tokens = flip_tokens(seed, k)
    with space.lookup(tokens, remote="fetch") as h:
        m = h.end
        wrong = base.wrong_bytes(h.copy_to(), base.packed(tokens, 0, m)) if m else 0
    client.close()
    with open(result_path, "w") as f:
        json.dump({"k": k, "matched": m, "wrong": wrong, "cut_at": block * BT}, f)


# --- The run ------------------------------------------------------------------------------------


class Run:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.counts = collections.Counter()
        self.faults = collections.Counter()
        self.notes = []
        self.ids = 0
        self.kvtierd, self.kvtier_cli, self.etcd_bin = args.kvtierd, args.kvtier, args.etcd
        self.nodes = [f"n{i}" for i in range(args.nodes)]
        members = {"etcd": ETCD_IP}
        members.update({n: node_ip(i) for i, n in enumerate(self.nodes)})
        self.net = Network(args.netns_prefix, members)
        self.daemons = {}
        self.etcd = None
        self.clients = []  # (pid, node, log path)
        self.children = {}  # pid -> (kind, payload): flippers and checkers
        self.busy = {}  # node -> time its fault ends
        self.etcd_down = False
        self.windows = collections.defaultdict(list)  # node -> [(t0, t1)] stopped or killed
        self.open_window = {}
        self.totals = collections.defaultdict(dict)  # node -> {incarnation: last stats}
        self.incarnation = collections.Counter()
        self.pending = []  # heap of (time, seq, action, arg)
        self.seq = 0
        self.flips = {}  # k -> {"node", "block"}
        self.flip_results = []
        self.segment_prefixes = set()

    def path(self, name):
        return os.path.join(self.args.workdir, name)

    def note(self, text):
        self.notes.append(text)
        print(f"cluster-chaos: {text}", file=sys.stderr, flush=True)

    def later(self, delay, action, arg=None):
        self.seq += 1
        heapq.heappush(self.pending, (time.monotonic() + delay, self.seq, action, arg))

    # Set-up.
    def start(self):
        a = self.args
        self.net.setup()
        with open(self.path("token"), "w") as f:
            f.write(random.SystemRandom().randbytes(24).hex())
        os.chmod(self.path("token"), 0o600)
        etcd_url = f"http://{ETCD_IP}:2379"
        self.etcd = Proc(self, "etcd", self.net.ns("etcd"), [
            self.etcd_bin, "--name=chaos", f"--data-dir={self.path('etcd')}",
            f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
            "--listen-peer-urls=http://127.0.0.1:2380",
            "--initial-advertise-peer-urls=http://127.0.0.1:2380",
            "--initial-cluster=chaos=http://127.0.0.1:2380", "--initial-cluster-state=new"],
            "ready to serve client requests")
        self.etcd.start()
        env = dict(os.environ)
        if a.ucx_tls:
            env["UCX_TLS"] = a.ucx_tls
        for i, n in enumerate(self.nodes):
            d = self.path(n)
            os.makedirs(d, exist_ok=True)
            self.daemons[n] = Proc(self, n, self.net.ns(n), [
                self.kvtierd, "--data-dir", d, "--socket", self.sock(n),
                "--listen", f"{node_ip(i)}:{PEER_PORT}", "--node-id", n,
                "--cluster-token-file", self.path("token"), "--etcd", etcd_url,
                "--cluster", "chaos", "--etcd-lease-ttl", "3",
                "--peer-timeout-ms", str(a.peer_timeout_ms), "--pin-lease-ms", "3000",
                "--host-pool-bytes", a.pool, "--extent-bytes", a.pool, "--cold-tier", "on",
                "--disk-bytes", "256M", "--gpus", "none", "--busy-poll-us", "0",
                # 4 KiB pages: never the huge pages a test beside this run reserved for its own.
                "--huge-pages", "off"],
                "kvtierd ready", env)
            self.start_daemon(n)
        # Every daemon sees every other before the load starts.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ups = [self.stats(n) for n in self.nodes]
            if all(s and s["cluster"]["members_up"] == len(self.nodes) for s in ups):
                break
            time.sleep(0.2)
        else:
            raise RuntimeError("the cluster did not form in 30 s")

    def sock(self, n):
        return self.path(f"{n}.sock")

    def start_daemon(self, n):
        d = self.daemons[n]
        d.start()
        self.incarnation[n] += 1
        fields = dict(f.split("=", 1) for f in d.ready_line.split() if "=" in f)
        self.segment_prefixes.add(fields.get("segments", ""))

    def stats(self, n, timeout_s=3.0):
        """The daemon's counters (kvtier stats), or None when it does not answer in time."""
        try:
            r = subprocess.run([self.kvtier_cli, "--socket", self.sock(n), "stats"],
                               stdin=subprocess.DEVNULL, capture_output=True, text=True,
                               timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None
        if r.returncode != 0:
            return None
        try:
            s = json.loads(r.stdout)
        except ValueError:
            return None
        self.totals[n][self.incarnation[n]] = s
        return s

    def start_clients(self):
        a = self.args
        for n in self.nodes:
            for c in range(a.clients):
                cid = f"{n}-{c}"
                log = self.path(f"client-{cid}.log")
                seed = (a.seed << 8) + len(self.clients)
                pid = base.fork_child(self.path(f"client-{cid}.err"), client_main,
                                      self.net.ns(n), self.sock(n), cid, seed, a.prompts,
                                      a.rate, log)
                self.clients.append((pid, n, log))

    # Faults.
    def free_nodes(self):
        now = time.monotonic()
        return [n for n in self.nodes if self.busy.get(n, 0) <= now]

    def begin_window(self, n):
        self.open_window[n] = time.monotonic()

    def end_window(self, n):
        t0 = self.open_window.pop(n, None)
        if t0 is not None:
            self.windows[n].append((t0, time.monotonic()))

    def fault(self):
        kinds = self.args.kinds
        weights = [FAULT_WEIGHTS[k] for k in kinds]
        free = self.free_nodes()
        for _ in range(10):
            kind = self.rng.choices(kinds, weights)[0]
            if kind == "etcd":
                if not self.etcd_down:
                    break
            elif kind == "flip":
                if len(free) >= 2:
                    break
            elif free and len(free) > 1:  # never every node at once
                break
        else:
            return False
        r = self.rng
        if kind == "etcd":
            self.etcd.kill()
            self.etcd_down = True
            self.later(r.uniform(0.5, 3.0), "etcd_up")
        elif kind == "flip":
            n = r.choice(free)
            k = len(self.flips)
            self.flips[k] = {"node": n, "at": time.monotonic()}
            self.busy[n] = time.monotonic() + 3.0
            pid = base.fork_child(self.path(f"flip-{k}.err"), flip_main, self.net.ns(n),
                                  self.sock(n), self.args.seed, k, self.path(f"flip-{k}.json"))
            self.children[pid] = ("flip", k, time.monotonic() + 20)
        else:
            n = r.choice(free)
            if kind == "kill":
                self.stats(n, timeout_s=1.0)  # its counters up to now
                self.begin_window(n)
                self.daemons[n].kill()
                self.busy[n] = float("inf")
                self.later(r.uniform(0.2, 2.0), "restart", n)
            elif kind == "stop":
                self.begin_window(n)
                self.daemons[n].signal(signal.SIGSTOP)
                self.busy[n] = float("inf")
                self.later(r.uniform(0.5, 3.0), "cont", n)
            else:
                self.net.link(n, up=False)
                self.busy[n] = float("inf")
                self.later(r.uniform(1.0, 4.0), "link_up", n)
        self.faults[kind] += 1
        return True

    def act(self, action, arg):
        now = time.monotonic()
        if action == "restart":
            self.start_daemon(arg)
            self.end_window(arg)
            self.busy[arg] = now + 0.5
        elif action == "cont":
            self.daemons[arg].signal(signal.SIGCONT)
            self.end_window(arg)
            self.busy[arg] = now + 0.5
        elif action == "link_up":
            self.net.link(arg, up=True)
            self.busy[arg] = now + 0.5
        elif action == "etcd_up":
            self.etcd.start()
            self.etcd_down = False
        elif action == "check_flip":
            # Checked from another node while the flipped one is up and reachable (else the
            # check would only show the fault); postponed up to 15 s for that.
            k = arg
            holder = self.flips[k]["node"]
            free = self.free_nodes()
            others = [n for n in free if n != holder]
            if (not others or holder not in free or self.etcd_down) and \
                    now < self.flips[k]["at"] + 15:
                self.later(0.5, "check_flip", k)
                return
            if not others:
                others = [n for n in self.nodes if n != holder]
            n = self.rng.choice(others)
            for m in (n, holder):
                self.busy[m] = max(self.busy.get(m, 0), now + 2.0)
            self.flips[k]["checker"] = n
            pid = base.fork_child(self.path(f"check-{k}.err"), check_flip_main, self.net.ns(n),
                                  self.sock(n), self.args.seed, k, self.flips[k]["block"],
                                  self.path(f"check-{k}.json"))
            self.children[pid] = ("check", k, now + 20)

    def reap(self):
        """Children that ended: a flipper's block goes to a checker; a checker's result is kept.
        A daemon that exited without being killed is a crash: counted, and started again."""
        now = time.monotonic()
        for pid, (kind, k, deadline) in list(self.children.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            if not done:
                if now > deadline:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    self.note(f"{kind} {k} did not finish in 20 s: killed")
                    self.counts[f"{kind}_timeouts"] += 1
                    del self.children[pid]
                continue
            del self.children[pid]
            path = self.path(f"{kind}-{k}.json")
            if status != 0 or not os.path.exists(path):
                err = base.tail(self.path(f"{kind}-{k}.err"), 3).strip().splitlines()
                self.counts[f"{kind}_failed"] += 1
                # A typed error (its daemon killed meanwhile, say) leaves that flip unchecked.
                if not (err and err[-1].split(":")[0].startswith("kvtier.")):
                    self.counts["errors"] += 1
                    self.note(f"{kind} {k}: {base.describe_status(status)}: {err[-1:]}")
                continue
            with open(path) as f:
                result = json.load(f)
            if kind == "flip":
                self.flips[k]["block"] = result["block"]
                self.later(2.0, "check_flip", k)  # published to the homes meanwhile
            else:
                self.flip_results.append(result)
        for n, d in self.daemons.items():
            if d.proc is not None and not d.killed and d.proc.poll() is not None:
                self.counts["daemon_crashes"] += 1
                self.note(f"{n} exited by itself ({d.proc.returncode}): "
                          + base.tail(d.logs[-1], 6))
                self.begin_window(n)
                self.start_daemon(n)
                self.end_window(n)
        if self.etcd.proc is not None and not self.etcd.killed and self.etcd.proc.poll() is not None:
            self.counts["etcd_crashes"] += 1
            self.note("etcd exited by itself: " + base.tail(self.etcd.logs[-1], 4))
            self.etcd.start()

    def loop(self):
        a = self.args
        started = 0
        next_fault = time.monotonic() + 1.0
        last_scrape = 0.0
        while started < a.faults or self.pending or self.children:
            now = time.monotonic()
            while self.pending and self.pending[0][0] <= now:
                _, _, action, arg = heapq.heappop(self.pending)
                self.act(action, arg)
            self.reap()
            if started < a.faults and now >= next_fault:
                if self.fault():
                    started += 1
                next_fault = now + self.rng.uniform(*a.gap)
            if now - last_scrape > 2.0:
                last_scrape = now
                for n in self.free_nodes():
                    self.stats(n, timeout_s=1.0)
            time.sleep(0.02)

    def finish(self):
        """Clients gone, every daemon must drop to no pins, leases or unsealed blocks."""
        time.sleep(self.args.settle_load)
        for pid, _, _ in self.clients:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for pid, _, _ in self.clients:
            os.waitpid(pid, 0)
        leaks = {"leaked_pins": 0, "leaked_blocks": 0, "leaked_leases": 0,
                 "leaked_sessions": 0}
        deadline = time.monotonic() + 3.0 + self.args.settle
        for n in self.nodes:
            while True:
                s = self.stats(n)
                clean = s is not None and (
                    s["blocks"]["pinned"] == 0 and s["blocks"]["used"] == s["blocks"]["cached"]
                    and s["leases"]["read"] == 0 and s["leases"]["write"] == 0
                    and s["clients"] <= 1 and s["sequences"] == 0)
                if clean or time.monotonic() > deadline:
                    break
                time.sleep(0.25)
            if s is None:
                self.note(f"{n} did not answer its stats at the end")
                self.counts["errors"] += 1
                continue
            if not clean:
                self.note(f"{n} at the end: blocks {s['blocks']}, leases {s['leases']}, "
                          f"clients {s['clients']}, sequences {s['sequences']}")
            leaks["leaked_pins"] += s["blocks"]["pinned"]
            leaks["leaked_blocks"] += max(0, s["blocks"]["used"] - s["blocks"]["cached"]
                                          - s["blocks"]["pinned"])
            leaks["leaked_leases"] += s["leases"]["read"] + s["leases"]["write"]
            leaks["leaked_sessions"] += max(0, s["clients"] - 1) + s["sequences"]
        return leaks

    def lookups(self):
        """The clients' lookups: counts, wrong bytes, and those over their deadline."""
        bound = self.args.peer_timeout_ms / 1000.0 + self.args.local_allowance
        out = collections.Counter()
        latencies = []
        over = []
        for _, n, log in self.clients:
            windows = self.windows[n]
            for r in base.read_records(log):
                if r["ev"] == "E":
                    out["client_errors"] += 1
                    continue
                out["lookups"] += 1
                out["wrong_bytes"] += r["w"]
                out["hit_tokens"] += r["m"]
                dt = r["t1"] - r["t0"]
                if any(r["t0"] < w1 + 0.5 and r["t1"] > w0 for w0, w1 in windows):
                    out["lookups_during_own_daemon_fault"] += 1
                    continue
                latencies.append(dt)
                if dt > bound:
                    over.append((round(dt, 3), n, r["t0"]))
        latencies.sort()
        out["lookups_over_deadline"] = len(over)
        pct = (lambda q: round(1000 * latencies[min(len(latencies) - 1,
                                                   int(q * len(latencies)))], 2)
               if latencies else None)
        return out, {"p50_ms": pct(0.5), "p99_ms": pct(0.99), "max_ms": pct(1.0),
                     "bound_ms": round(bound * 1000), "over": over[:10]}

    def counter_totals(self):
        out = collections.Counter()
        for n in self.nodes:
            for s in self.totals[n].values():
                c = s["cluster"]
                out["remote_hit_blocks"] += c["remote_hit_blocks"]
                out["served_blocks"] += c["served_blocks"]
                out["remote_lookups"] += c["remote_lookups"]
                out["remote_lookups_cut"] += c.get("remote_lookups_cut", 0)
                for kind, v in c["fetch_errors"].items():
                    out[f"fetch_errors_{kind}"] += v
                out["cold_corrupt_dropped"] += s["cold"]["corrupt_dropped"]
        return out

    def teardown(self):
        for pid in list(self.children):
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except OSError:
                pass
        for pid, _, _ in self.clients:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except OSError:
                pass
        for d in self.daemons.values():
            d.stop()
        if self.etcd is not None:
            self.etcd.kill()
        self.net.teardown()
        left = 0
        for name in os.listdir("/dev/shm"):
            if any(p and name.startswith(p) for p in self.segment_prefixes):
                left += 1
                os.unlink(os.path.join("/dev/shm", name))
        if left:
            self.note(f"{left} shared-memory segments left after the daemons stopped (removed)")
            self.counts["leaked_segments"] += left


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kvtierd", required=True)
    p.add_argument("--kvtier", required=True, help="the kvtier CLI (stats)")
    p.add_argument("--etcd", default="/usr/bin/etcd")
    p.add_argument("--workdir", required=True)
    p.add_argument("--netns-prefix", required=True, help="names of the run's namespaces")
    p.add_argument("--profile", choices=sorted(PROFILES), default="full")
    p.add_argument("--seed", type=int)
    p.add_argument("--faults", type=int)
    p.add_argument("--nodes", type=int)
    p.add_argument("--clients", type=int, help="client processes per node")
    p.add_argument("--rate", type=float, help="lookups a second per client")
    p.add_argument("--prompts", type=int, default=400, help="prompts in the shared set")
    p.add_argument("--kinds", default=",".join(FAULT_WEIGHTS),
                   help="the kinds of fault to use, comma-separated (default: all)")
    p.add_argument("--pool", default="12M", help="each daemon's host pool (spills to disk)")
    p.add_argument("--peer-timeout-ms", type=int, default=1000)
    p.add_argument("--local-allowance", type=float, default=1.0,
                   help="seconds a lookup may take beyond its peer deadline (local work)")
    p.add_argument("--ucx-tls", default="", help="UCX_TLS for the daemons (default: UCX's)")
    p.add_argument("--settle", type=float, default=10.0)
    p.add_argument("--settle-load", type=float, default=3.0,
                   help="seconds of load with no fault before the clients are stopped")
    args = p.parse_args()
    faults, nodes, clients, rate, gap = PROFILES[args.profile]
    args.faults = faults if args.faults is None else args.faults
    args.nodes = nodes if args.nodes is None else args.nodes
    args.clients = clients if args.clients is None else args.clients
    args.rate = rate if args.rate is None else args.rate
    args.gap = gap
    args.kinds = [k for k in args.kinds.split(",") if k]
    if not args.kinds or any(k not in FAULT_WEIGHTS for k in args.kinds):
        p.error(f"--kinds wants some of {','.join(FAULT_WEIGHTS)}")
    if not 2 <= args.nodes <= 8:
        p.error("--nodes wants 2 to 8")
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 31)

    run = Run(args)

    def on_signal(signo, _):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(f"cluster-chaos: seed {args.seed}, profile {args.profile}: {args.faults} faults, "
          f"{args.nodes} daemons, {args.clients} clients each; work directory {args.workdir}",
          flush=True)
    t0 = time.monotonic()
    interrupted = False
    leaks = {}
    try:
        run.start()
        run.start_clients()
        run.loop()
        leaks = run.finish()
    except KeyboardInterrupt:
        interrupted = True
    except Exception as e:  # noqa: BLE001 - reported in the JSON, then cleaned up
        run.note(f"run failed: {type(e).__name__}: {e}")
        run.counts["errors"] += 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        crash_lines = {n: d.crash_lines() for n, d in run.daemons.items()}
        run.teardown()
    looked, latency = run.lookups()
    totals = run.counter_totals()
    flips_checked = len(run.flip_results)
    flips_served = sum(1 for r in run.flip_results if r["matched"] > r["cut_at"])
    # The check's hit ended right at the flipped block: the blocks before it came from the
    # holder, and the flipped one was refused (elsewhere, the check met a fault first).
    flips_cut = sum(1 for r in run.flip_results if r["matched"] == r["cut_at"])
    summary = {
        "faults": dict(sorted(run.faults.items())),
        "lookups": looked["lookups"],
        "remote_hit_blocks": totals["remote_hit_blocks"],
        "wrong_bytes": looked["wrong_bytes"] + sum(r["wrong"] for r in run.flip_results),
        "checksum_misses": totals["fetch_errors_checksum"] + totals["cold_corrupt_dropped"],
        "daemon_crashes": run.counts["daemon_crashes"],
        "lookups_over_deadline": looked["lookups_over_deadline"],
        "leaked_pins": leaks.get("leaked_pins", 0),
        "leaked_blocks": leaks.get("leaked_blocks", 0),
        "seed": args.seed,
        "profile": args.profile,
        "nodes": args.nodes,
        "clients": args.nodes * args.clients,
        "seconds": round(time.monotonic() - t0, 1),
        "leaked_leases": leaks.get("leaked_leases", 0),
        "leaked_sessions": leaks.get("leaked_sessions", 0),
        "leaked_segments": run.counts["leaked_segments"],
        "flipped_blocks_served": flips_served,
        "flips_checked": flips_checked,
        "flips_cut_at_the_flipped_block": flips_cut,
        "flip_checks": [[r["matched"] // BT, r["cut_at"] // BT] for r in run.flip_results][:80],
        "lookup_latency": latency,
        "lookups_during_own_daemon_fault": looked["lookups_during_own_daemon_fault"],
        "hit_tokens": looked["hit_tokens"],
        "client_errors": looked["client_errors"],
        "cluster": dict(sorted(totals.items())),
        "etcd_crashes": run.counts["etcd_crashes"],
        "errors": run.counts["errors"],
        "crash_lines": {n: v[:5] for n, v in crash_lines.items() if v},
        "notes": run.notes[:20],
    }
    failed = any(summary[k] for k in (
        "wrong_bytes", "daemon_crashes", "lookups_over_deadline", "leaked_pins", "leaked_blocks",
        "leaked_leases", "leaked_sessions", "leaked_segments", "flipped_blocks_served",
        "etcd_crashes", "errors"))
    if run.flips and not flips_checked and not interrupted:
        summary["notes"].append("no flip was checked")
        failed = True
    if interrupted:
        summary["interrupted"] = True
    print(json.dumps(summary), flush=True)
    return 1 if failed or interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
