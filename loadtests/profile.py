"""Where a running service's threads spend their time: py-spy samples every thread of the
process (and of its worker processes) from ``start()`` to ``stop()``, and ``summarise``
says, for each thread, how much of a core it used and in which functions.

``python -m loadtests.peer --profile`` records each phase this way, so that a shortfall
measured on another machine (a GPU's, where there is no time to look twice) comes back
with its cause: an event loop busy in HTTP, a model thread busy tokenising, or waiting.
Sampling without pausing the process (py-spy's ``--nonblocking``) costs the service a few
per cent; ``native`` also samples C/C++ frames (CUDA, TorchScript, uvloop), which needs
pausing each thread and costs more.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

THREAD = re.compile(r"(?:^|;)thread \(\d+\): ([^;]*)")
PROCESS = re.compile(r'(?:^|;)process (\d+):"')  # then its command line, ; and " in it too
WHERE = re.compile(r"\((?:[^()]*/)?([^()/]*?)(?::\d+)?\)$")  # "f (a/b.py:12)" -> "f (b.py)"


def py_spy() -> str:
    """The py-spy command (on PATH, or beside this Python: a virtual environment's), or a
    RuntimeError saying how to get it."""
    found = shutil.which("py-spy") or shutil.which("py-spy", path=Path(sys.executable).parent)
    if found is None:
        raise RuntimeError("profiling needs py-spy on PATH (pip install py-spy; it is in "
                           "the dev extra)")
    return found


class Profile:
    """py-spy recording process ``pid`` and its children into ``folder``, one file a
    ``start(name)``: samples as flamegraph lines (``--format raw``), each thread its own."""

    def __init__(self, pid: int, folder: Path, native: bool = False, rate: int = 100):
        self.pid, self.folder, self.native, self.rate = pid, folder, native, rate
        self.command = py_spy()
        self.recording: subprocess.Popen | None = None

    def start(self, name: str) -> None:
        self.path = self.folder / f"profile-{re.sub(r'[^a-z0-9]+', '-', name.lower())}.txt"
        self.log = self.path.with_suffix(".log")
        with self.log.open("w") as log:  # what py-spy says (why it failed, if it did)
            self.recording = subprocess.Popen(
                [self.command, "record", "--pid", str(self.pid), "--subprocesses", "--threads",
                 "--rate", str(self.rate), "--format", "raw", "--output", str(self.path),
                 "--native" if self.native else "--nonblocking"],
                stdout=log, stderr=subprocess.STDOUT)
        # a SIGINT before py-spy samples ends it without a file (a short phase on a slow
        # machine): the phase starts once it says it samples, or has failed
        deadline = time.monotonic() + 60  # a bound for a hung py-spy, not a slow one
        while (self.recording.poll() is None and time.monotonic() < deadline
               and "Sampling process" not in self.log.read_text()):
            time.sleep(0.02)
        self.started = time.perf_counter()

    def stop(self) -> dict:
        """Stops the recording (py-spy writes its file on SIGINT) and summarises it; a
        recording that failed (no permission to trace, say) says why instead."""
        seconds = time.perf_counter() - self.started
        self.recording.send_signal(signal.SIGINT)
        try:
            self.recording.wait(30)
        except subprocess.TimeoutExpired:
            self.recording.kill()
            self.recording.wait()
        if not self.path.exists():
            said = self.log.read_text().strip().splitlines()
            return {"file": None, "error": said[0] if said else "py-spy wrote nothing"}
        threads = summarise(self.path.read_text().splitlines(), seconds, self.rate)
        return {"file": self.path.name, "threads": threads}


def summarise(lines: list[str], seconds: float, rate: int, top: int = 5) -> list[dict]:
    """py-spy's raw lines (``[process P:"cmd";...]thread (T): NAME;frame;...;frame COUNT``)
    -> each thread, busiest first: its name (and process when there are several), the
    cores it used (samples / (rate x seconds)) and the ``top`` functions it was in when
    sampled (the innermost frame: its function and file name), as shares of its samples."""
    samples: dict[str, Counter] = defaultdict(Counter)
    processes = set()
    for line in lines:
        stack, _, count = line.rpartition(" ")
        thread = THREAD.search(stack)
        if thread is None or not count.isdigit():
            continue
        process = PROCESS.findall(stack[: thread.start()])[-1:]  # a worker's after its parents'
        processes.add(tuple(process))
        name = f"{thread.group(1)} (process {process[0]})" if process else thread.group(1)
        frames = stack[thread.end():].split(";")[1:]  # outermost first
        innermost = WHERE.sub(r"(\1)", frames[-1]) if frames else "(the thread itself)"
        samples[name][innermost] += int(count)
    if len(processes) < 2:  # one process: its name says nothing
        samples = {re.sub(r" \(process \d+\)$", "", k): v for k, v in samples.items()}
    threads = []
    for name, counts in samples.items():
        total = sum(counts.values())
        threads.append({"thread": name, "samples": total, "cores": total / (rate * seconds),
                        "top": [(function, n / total) for function, n in counts.most_common(top)]})
    return sorted(threads, key=lambda t: -t["samples"])
