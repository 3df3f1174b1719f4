"""The network of the cluster chaos (cluster_chaos.py) and the processes run inside it.

Network: a bridge in a namespace of the run's own ("hub"), and one network namespace per member
(etcd, each daemon), joined to the bridge by a veth pair and given its own address; a member's
link can be taken down and up (a real partition); teardown kills whatever still runs in the
namespaces and deletes them. Nothing is made in the machine's own network namespace.

Proc: etcd or one kvtierd, restartable, started inside its member's namespace (enter_netns, which
the client processes call too) and dying with this process.

Made and removed with `ip` (iproute2), as root; scripts/cluster-chaos.sh removes the namespaces
of a run whose driver was killed outright.
"""

import ctypes
import os
import signal
import subprocess
import time

from chaos_processes import _libc, die_with_parent, tail

CLONE_NEWNET = 0x40000000


def sh(*args, check=True):
    """Runs a command (ip), returning its stdout; raises with its stderr when it fails."""
    r = subprocess.run(args, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


def enter_netns(name):
    """Moves the calling (single-threaded) process into network namespace `name`."""
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {name}")
    finally:
        os.close(fd)


# --- The network --------------------------------------------------------------------------------


class Network:
    """A bridge in the run's hub namespace and one namespace per member, each with one address."""

    def __init__(self, prefix, members):
        self.prefix = prefix
        self.members = members  # name -> address
        self.hub = f"{prefix}-hub"
        self.made = []

    def ns(self, member):
        return f"{self.prefix}-{member}"

    def setup(self):
        sh("ip", "netns", "add", self.hub)
        self.made.append(self.hub)
        sh("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.hub, "link", "set", "br0", "up")
        for k, (member, addr) in enumerate(self.members.items()):
            ns = self.ns(member)
            sh("ip", "netns", "add", ns)
            self.made.append(ns)
            sh("ip", "-n", self.hub, "link", "add", f"v{k}", "type", "veth", "peer", "name",
               "eth0", "netns", ns)
            sh("ip", "-n", self.hub, "link", "set", f"v{k}", "master", "br0", "up")
            sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")

    def link(self, member, up):
        k = list(self.members).index(member)
        sh("ip", "-n", self.hub, "link", "set", f"v{k}", "up" if up else "down")

    def teardown(self):
        """Kills whatever still runs in the namespaces and deletes them (their veths go too)."""
        for ns in reversed(self.made):
            pids = sh("ip", "netns", "pids", ns, check=False).split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (OSError, ValueError):
                    pass
            sh("ip", "netns", "del", ns, check=False)
        self.made = []


# --- Processes in namespaces --------------------------------------------------------------------


class Proc:
    """etcd or one kvtierd, restartable, run inside its member's namespace."""

    def __init__(self, run, name, ns, args, ready_text, env=None):
        self.run, self.name, self.ns, self.args = run, name, ns, args
        self.ready_text = ready_text
        self.env = env
        self.proc = None
        self.logs = []
        self.killed = False  # by us: its exit is no crash
        self.ready_line = ""

    def start(self, deadline_s=30.0):
        assert not self.alive()
        log_path = self.run.path(f"{self.name}-{len(self.logs)}.log")
        self.logs.append(log_path)
        parent, ns = os.getpid(), self.ns

        def pre():
            die_with_parent(parent)
            enter_netns(ns)

        t0 = time.monotonic()
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, preexec_fn=pre, env=self.env)
        self.killed = False
        while True:
            for line in tail(log_path, 400).splitlines():
                if self.ready_text in line:
                    self.ready_line = line
                    return time.monotonic() - t0
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}) at start: "
                                   + tail(log_path, 8))
            if time.monotonic() - t0 > deadline_s:
                raise RuntimeError(f"{self.name} not ready in {deadline_s:.0f} s: "
                                   + tail(log_path, 8))
            time.sleep(0.01)

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def signal(self, signo):
        if self.alive():
            self.proc.send_signal(signo)

    def kill(self):
        if self.proc is not None:
            self.killed = True
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()

    def stop(self, timeout_s=20.0):
        if self.alive():
            self.killed = True
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.run.note(f"{self.name} did not stop in {timeout_s:.0f} s after SIGTERM")
                self.run.counts["errors"] += 1
        self.kill()

    def crash_lines(self):
        out = []
        for path in self.logs:
            try:
                with open(path, errors="replace") as f:
                    out += [ln.strip() for ln in f if "Assertion" in ln or "Fatal" in ln
                            or "Segmentation" in ln or "level=error" in ln]
            except OSError:
                pass
        return out
