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

The parts run here (Run, main); the content and the client side (workers, writers, checks) are in
chaos_clients.py, the process helpers and the daemon in chaos_processes.py (both beside this file,
which Python puts first on sys.path).
"""

import argparse
import collections
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

from chaos_clients import (PHASES, ClientWorker, batch_check, expectations, restart_check,
                           writer_main)
from chaos_processes import Daemon, describe_status, fork_child, read_records, tail

# cluster_chaos.py imports this file as `base` for the content and process helpers it shares.
from chaos_clients import BT, VOCAB, layout, packed, wrong_bytes  # noqa: F401
from chaos_processes import Recorder, close_quietly  # noqa: F401


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
