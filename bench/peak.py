"""Run a command as a child process and measure its own peak RSS.

`ru_maxrss` of a child counts the RSS high-water mark of the image it replaced at exec:
spawned straight from a benchmark that holds 1 GB, a 100 MB command reports 1 GB (Linux
keeps the pre-exec maximum; subprocess's vfork shares the parent's memory map until the
exec). So the command is started through a minimal launcher (`python -S`, ~8 MB), whose
own child it is; the launcher reaps it with wait4 and reports that child's ru_maxrss:
anonymous + file-backed resident pages of the command, at their peak.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time

_LAUNCHER = (
    "import os, sys\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    os.execvpe(sys.argv[1], sys.argv[1:], os.environ)\n"
    "_, st, ru = os.wait4(pid, 0)\n"
    "sys.stderr.write('\\nBENCH_PEAK_RSS_KB=%d %.3f\\n' % (ru.ru_maxrss, ru.ru_utime + ru.ru_stime))\n"
    "sys.exit(os.waitstatus_to_exitcode(st))\n"
)


def run_peak(cmd: list[str], env: dict, cwd=None) -> dict:
    """{"wall": seconds, "rss": peak RSS bytes of `cmd` itself, "cpu": its user + system CPU
    seconds (all threads), "out": stdout+stderr}.

    Exits the benchmark with the command's output when it fails.
    """
    with tempfile.TemporaryFile("w+") as fo:
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-S", "-c", _LAUNCHER, *cmd], env=env, cwd=cwd,
                           stdout=fo, stderr=subprocess.STDOUT, text=True, check=False)
        wall = time.perf_counter() - t0
        fo.seek(0)
        out = fo.read()
    head, sep, tail = out.rpartition("\nBENCH_PEAK_RSS_KB=")
    if p.returncode != 0 or not sep:
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}\n{out[-6000:]}")
    kb, cpu = tail.split()[:2]
    return {"wall": wall, "rss": int(kb) * 1024, "cpu": float(cpu), "out": head}


if __name__ == "__main__":  # self-check: a parent holding 1 GB does not leak into the figure
    hold = bytearray(1 << 30)
    for i in range(0, len(hold), 4096):
        hold[i] = 1
    r = run_peak([sys.executable, "-S", "-c", "b = bytearray(200 << 20)"], dict(os.environ))
    print(f"peak RSS of a 200 MiB child under a 1 GiB parent: {r['rss'] / 2**20:.0f} MiB")


class DirtyWatch:
    """Samples the system-wide Dirty figure (/proc/meminfo) in a thread; `.peak` in bytes."""

    def __init__(self):
        self.peak, self._stop = 0, threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("Dirty:"):
                        self.peak = max(self.peak, int(line.split()[1]) * 1024)
            time.sleep(0.05)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
