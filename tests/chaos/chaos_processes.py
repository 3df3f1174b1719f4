"""Process helpers of the single-node chaos (tests/chaos/chaos.py; cluster_chaos.py uses them
through it, cluster_network.py and tests/soak/soak.py directly): children forked to die with their
parent, the JSON-lines logs they write and the parent reads, closing a client whose daemon may be
gone (close_quietly), and the kvtierd process (Daemon).
"""

import collections
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
import traceback

import kvtier

# --- Processes ----------------------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid, sig=signal.SIGKILL):
    """A child of ours gets `sig` when we die (SIGKILL: dies with us), even when we are killed
    outright."""
    _libc.prctl(PR_SET_PDEATHSIG, sig)
    if os.getppid() != parent_pid:
        os._exit(1)


def fork_child(stderr_path, fn, *args):
    """fn(*args) in a forked child whose stderr goes to stderr_path; returns its pid. The child
    exits with fn's int result (0 for None), or 3 after printing the traceback when it raises. The
    parent holds no kvtier client and runs no thread, so the fork copies nothing half-done."""
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    # The parent's SIGTERM/SIGINT handler must never run in the child (it would raise there): both
    # are blocked across the fork and until the child has its own dispositions.
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    pid = os.fork()
    if pid:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        return pid
    code = 3
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        die_with_parent(parent)
        fd = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, 2)
        os.close(fd)
        code = fn(*args) or 0
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


def close_quietly(client):
    """Closes `client` (None: nothing to do) after a typed error, when its daemon may be gone or
    restarting: the kvtier.Error closing may raise too is ignored. The caller then forgets it
    (client = space = None) and connects again when it next needs one."""
    if client is not None:
        try:
            client.close()
        except kvtier.Error:
            pass


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
