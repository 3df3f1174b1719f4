"""A throwaway kvtierd for tests and examples.

    with kvtier.testing.Daemon("build/daemon/kvtierd") as daemon:
        client = kvtier.Client(daemon.socket)

The daemon runs in a fresh temporary data directory with the cold tier off, no GPU pools and its
pool on 4 KiB pages (unless extra_args name --huge-pages), so that what a test sees does not
depend on the machine's huge pages.
Leaving the block stops it (SIGTERM, then SIGKILL if it does not exit within 20 s) and removes
its data directory, its socket and any shared-memory segment it left behind, also when the body
raised.
"""

import glob
import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from types import TracebackType

_READY_TIMEOUT_S = 20.0
_STOP_TIMEOUT_S = 20.0


class Daemon:
    """A kvtierd process in a temporary data directory (a context manager)."""

    def __init__(
        self,
        kvtierd: str | None = None,
        host_pool_bytes: int = 64 << 20,
        extra_args: Sequence[str] = (),
    ) -> None:
        """kvtierd: the daemon's path (default: $KVTIER_DAEMON)."""
        path = kvtierd or os.environ.get("KVTIER_DAEMON")
        if not path:
            raise ValueError("no kvtierd: pass its path or set KVTIER_DAEMON")
        self.kvtierd = path
        self.host_pool_bytes = host_pool_bytes
        self.extra_args = list(extra_args)
        self.data_dir: str | None = None
        self.socket = ""  # the daemon's Unix socket, once started
        self.segment_prefix: str | None = None
        self.exit_status: int | None = None
        self.output: list[str] = []  # the daemon's stdout lines
        # Segments stop() found (and removed) after the daemon exited.
        self.leftover_segments: list[str] = []
        self._process: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None

    def __enter__(self) -> "Daemon":
        self.data_dir = tempfile.mkdtemp(prefix="kvtier-py-")
        self.socket = os.path.join(self.data_dir, "kvtierd.sock")
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def _start(self) -> None:
        assert self.data_dir is not None
        args = [
            self.kvtierd,
            "--data-dir",
            self.data_dir,
            "--host-pool-bytes",
            str(self.host_pool_bytes),
            "--cold-tier",
            "off",
            "--gpus",
            "none",
        ]
        if "--huge-pages" not in self.extra_args:
            args += ["--huge-pages", "off"]
        args += self.extra_args
        self._process = subprocess.Popen(args, stdout=subprocess.PIPE)
        ready = self._read_until_ready()
        if ready is None:
            raise RuntimeError(
                "kvtierd did not become ready; its output: " + "".join(self.output)
            )
        fields = dict(f.split("=", 1) for f in ready.split() if "=" in f)
        self.segment_prefix = fields.get("segments")
        # Keep draining stdout so the daemon never blocks on a full pipe.
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _read_until_ready(self) -> str | None:
        assert self._process is not None and self._process.stdout is not None
        deadline = time.monotonic() + _READY_TIMEOUT_S
        stream = self._process.stdout
        with selectors.DefaultSelector() as selector:
            selector.register(stream, selectors.EVENT_READ)
            buffer = b""
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    return None
                chunk = os.read(stream.fileno(), 4096)
                if not chunk:
                    return None
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    text = line.decode(errors="replace")
                    self.output.append(text + "\n")
                    if text.startswith("kvtierd ready"):
                        return text

    def _drain(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        stream = self._process.stdout
        for line in iter(stream.readline, b""):
            self.output.append(line.decode(errors="replace"))

    def segments(self) -> list[str]:
        """The daemon's shared-memory segments that exist now."""
        if not self.segment_prefix:
            return []
        return glob.glob(os.path.join("/dev/shm", glob.escape(self.segment_prefix) + "*"))

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        """Stops the daemon (if running) and removes everything it left. Idempotent."""
        self._end(sig)
        if self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def restart(self, sig: signal.Signals = signal.SIGKILL) -> None:
        """Ends the daemon with `sig` (a crash by default), removes the shared memory it left, and
        starts a new one on the same data directory and socket: a restart as its clients see it."""
        self._end(sig)
        self.exit_status = None
        self._process = None
        self._reader = None
        self._start()

    def _end(self, sig: signal.Signals) -> None:
        if self._process is not None and self.exit_status is None:
            if self._process.poll() is None:
                self._process.send_signal(sig)
                try:
                    self._process.wait(_STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    self._process.kill()
                    self._process.wait()
            self.exit_status = self._process.returncode
            if self._reader is not None:
                self._reader.join(_STOP_TIMEOUT_S)
            assert self._process.stdout is not None
            self._process.stdout.close()
        self.leftover_segments = self.segments()
        for path in self.leftover_segments:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
