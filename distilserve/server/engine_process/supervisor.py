"""The engine process's supervisor, in ``distilserve serve``'s own process: starts it
before the front ends, starts another when it dies (the front ends answer 503 meanwhile),
passes SIGHUP on (it reads its repository again), and stops it after them (SIGTERM: it
answers what is queued, then exits)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

log = logging.getLogger("distilserve")

# how the engine process is started: this command and the socket's path
COMMAND = [sys.executable, "-m", "distilserve.server.engine_process"]
# the variable that tells a worker it is a front end, and where the engine process listens
ENGINE_SOCKET = "DISTILSERVE_ENGINE_SOCKET"
# between an engine process's death and its replacement: doubled after each that lived
# less than STEADY_S, up to the longest
RESTART_S, LONGEST_RESTART_S, STEADY_S = 1.0, 30.0, 30.0
STOP_S = 60  # how long a stopping engine process may take to answer what is queued
# the longest path a Unix socket takes, in bytes (sockaddr_un's sun_path, less its NUL)
SOCKET_PATH_MAX = 103 if sys.platform == "darwin" else 107


def socket_path(folder: str) -> str:
    """Where the engine process listens: ``engine.sock`` in ``folder``, or, where that path
    is too long for a Unix socket (a deep TMPDIR), in a folder of its own made in /tmp (as
    mkdtemp makes it, its owner's alone; the caller removes it). OSError (its message
    says why) where neither can be."""
    path = os.path.join(folder, "engine.sock")
    if len(os.fsencode(path)) <= SOCKET_PATH_MAX:
        return path
    try:
        return os.path.join(tempfile.mkdtemp(prefix="distilserve-engine-", dir="/tmp"),
                            "engine.sock")
    except OSError as e:
        raise OSError(f"the engine process's socket would be {path}, {len(os.fsencode(path))} "
                      f"bytes, past the {SOCKET_PATH_MAX} a Unix socket's path takes, and "
                      f"/tmp takes no folder ({e.strerror or e}): set TMPDIR to a shorter "
                      "folder's path") from None


class Supervisor:
    """The engine process on the socket ``path``, kept running until ``stop``."""

    def __init__(self, path: str):
        self.path = path
        self.process: subprocess.Popen | None = None
        self.stopping = threading.Event()
        self.lock = threading.Lock()  # no new process once stopping
        self.thread = threading.Thread(target=self._keep, name="engine-supervisor",
                                       daemon=True)

    def start(self) -> None:
        self.process = self._spawn()
        self.thread.start()

    def _spawn(self) -> subprocess.Popen:
        # its own process group: a Ctrl-C at the terminal reaches the supervisor, which
        # stops the front ends first (they need the engine to finish their requests)
        return subprocess.Popen([*COMMAND, self.path], start_new_session=True)

    def _keep(self) -> None:
        delay = RESTART_S
        while True:
            began = time.monotonic()
            code = self.process.wait()
            if self.stopping.is_set():
                return
            delay = RESTART_S if time.monotonic() - began > STEADY_S else delay
            log.error("the engine process %d exited (%s): starting another in %.0f s",
                      self.process.pid, code, delay)
            if self.stopping.wait(delay):
                return
            delay = min(2 * delay, LONGEST_RESTART_S)
            with self.lock:
                if self.stopping.is_set():
                    return
                self.process = self._spawn()

    def reread(self) -> None:
        """SIGHUP to the engine process: it reads its repository again."""
        with self.lock:
            if self.process is not None and self.process.poll() is None:
                self.process.send_signal(signal.SIGHUP)

    def stop(self) -> None:
        """SIGTERM, and its exit awaited (killed if it takes over STOP_S)."""
        with self.lock:
            self.stopping.set()
            process = self.process
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(STOP_S)
        except subprocess.TimeoutExpired:
            log.error("the engine process %d did not stop in %d s: killed", process.pid, STOP_S)
            process.kill()
            process.wait()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
