#!/usr/bin/env python3
"""A ctest run leaves nothing behind (tests/clean_run/CMakeLists.txt registers this twice).

    check_clean_run.py setup ROOT   before every other test: ROOT is made empty (what an earlier,
                                    interrupted run left there is removed and listed)
    check_clean_run.py check ROOT   after every other test: fails, listing them, if the run left
                                    - a file or directory under ROOT (KVTIER_TEST_TMPDIR of every test),
                                    - a process carrying KVTIER_TEST_RUN=ROOT in its environment (every
                                      test's, inherited by the kvtierd, etcd and peers it starts),
                                    - a /dev/shm/kvtier* segment made during the run that no live
                                      process maps,
                                    - vm.nr_hugepages other than it was at setup (a test that
                                      reserved huge pages and did not give them back);
                                    then removes them (the leaked processes get SIGKILL) and ROOT.

Only what this run made is considered: ROOT is this build tree's own, processes are told apart by
the marker in their environment, and segments by the list taken at setup (a segment another
process still maps is in use, not leaked).
"""
import json
import os
import shutil
import signal
import sys
import time

STATE = ".clean_run_state.json"  # written by setup, under ROOT; not a leak
SHM = "/dev/shm"
NR_HUGEPAGES = "/proc/sys/vm/nr_hugepages"
# A process that a test's death signalled (SIGTERM by PR_SET_PDEATHSIG) gets this long to exit.
EXIT_GRACE_SECONDS = 10


def shm_segments():
    try:
        return {n for n in os.listdir(SHM) if n.startswith("kvtier")}
    except OSError:
        return set()


def marked_processes(root):
    """(pid, command line) of every live process whose environment holds KVTIER_TEST_RUN=ROOT."""
    marker = b"KVTIER_TEST_RUN=" + root.encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
            if marker not in env:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            with open(f"/proc/{entry}/stat", "rb") as f:
                if f.read().split(b") ")[-1][:1] == b"Z":
                    continue  # a zombie: gone, its parent has yet to reap it
        except OSError:
            continue  # gone meanwhile, or not ours to read
        found.append((int(entry), cmd))
    return found


def mapped_segments():
    names = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/maps") as f:
                for line in f:
                    at = line.find(SHM + "/")
                    if at >= 0:
                        names.add(line[at + len(SHM) + 1:].split()[0])
        except OSError:
            continue
    return names


def nr_hugepages():
    try:
        with open(NR_HUGEPAGES) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def setup(root):
    if os.path.isdir(root):
        left = sorted(os.listdir(root))
        left = [n for n in left if n != STATE]
        if left:
            print(f"removing what an earlier run left in {root}: {', '.join(left)}")
        shutil.rmtree(root)
    os.makedirs(root)
    # Like /tmp for the tests' own directories (each made 0700 by mkdtemp): tests that run a
    # client as another user open theirs to it, and that user must get through ROOT too.
    os.chmod(root, 0o755)
    with open(os.path.join(root, STATE), "w") as f:
        json.dump({"started": time.time(), "shm": sorted(shm_segments()),
                   "nr_hugepages": nr_hugepages()}, f)
    print(f"test scratch directory: {root}")
    return 0


def check(root):
    problems = []
    state = {"started": 0, "shm": []}
    try:
        with open(os.path.join(root, STATE)) as f:
            state = json.load(f)
    except OSError:
        problems.append(f"{root}/{STATE} is missing: did CleanRun.Setup run?")

    # Processes first: a dying one may still remove its own files and segments.
    deadline = time.monotonic() + EXIT_GRACE_SECONDS
    procs = marked_processes(root)
    while procs and time.monotonic() < deadline:
        time.sleep(0.1)
        procs = marked_processes(root)
    for pid, cmd in procs:
        problems.append(f"process {pid} still running: {cmd[:200]}")
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass

    if os.path.isdir(root):
        for name in sorted(os.listdir(root)):
            if name == STATE:
                continue
            path = os.path.join(root, name)
            inside = []
            for dirpath, _, files in os.walk(path):
                inside += [os.path.relpath(os.path.join(dirpath, f), root) for f in files]
            detail = f" ({len(inside)} files: {', '.join(inside[:5])}{', ...' if len(inside) > 5 else ''})" if inside else ""
            problems.append(f"left in the scratch directory: {name}{detail}")
        shutil.rmtree(root, ignore_errors=True)

    before = set(state["shm"])
    in_use = mapped_segments()
    for name in sorted(shm_segments() - before - in_use):
        path = os.path.join(SHM, name)
        try:
            if os.stat(path).st_mtime < state["started"]:
                continue  # older than the run: not ours
            os.unlink(path)
        except OSError:
            continue
        problems.append(f"shared-memory segment left: {path}")

    found = state.get("nr_hugepages")
    now = nr_hugepages()
    if found is not None and now is not None and now != found:
        problems.append(f"vm.nr_hugepages is {now}, was {found} at setup")
        try:
            with open(NR_HUGEPAGES, "w") as f:
                f.write(f"{found}\n")
        except OSError:
            pass

    if problems:
        print(f"the test run left {len(problems)} thing(s) behind (now removed):")
        for p in problems:
            print("  " + p)
        return 1
    print("the test run left no file, process or shared-memory segment behind")
    return 0


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("setup", "check"):
        print(__doc__, file=sys.stderr)
        return 2
    root = os.path.abspath(sys.argv[2])
    return setup(root) if sys.argv[1] == "setup" else check(root)


if __name__ == "__main__":
    sys.exit(main())
