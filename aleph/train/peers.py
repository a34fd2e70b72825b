"""Which ranks are alive, through the c10d store: heartbeats, and a barrier that polls.

The training collectives run under a short timeout (`collective_timeout_s`), so a rank that
stops answering is found in minutes, not hours. Work that one rank does alone for a long
time (rank 0's one-off store builds, a resume-state save) must not trip it: the others wait
in `Peers.barrier`, which polls the store instead of blocking in a collective, logs how
long it has waited, and gives up only when a rank it waits for has stopped beating.

Every rank's thread adds 1 to its counter `<prefix>hb/<rank>` every `beat_s` and notes
when each other rank's counter last moved (on its own clock, so clocks of different nodes
never meet). Under torchrun the store lives in the elastic agent, not in a worker, so it
answers while a worker is stopped. The prefix is chosen by rank 0 per launch, so keys of
an earlier attempt in the same agent store are never read.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta

import torch.distributed as dist

from aleph.errors import PeerLost

STALE_BEATS = 3  # a peer silent for this many beats is named after a collective fails
LOG_FIRST_S, LOG_EVERY_S = 5.0, 60.0  # first "waiting" line, then one a minute


def _own_client(store: dist.Store, timeout_s: float) -> dist.Store:
    """A second connection to the TCP store (so the beat thread never queues behind the
    main thread's store calls); the store itself where it is not a TCPStore."""
    base = store
    while isinstance(base, dist.PrefixStore):
        base = base.underlying_store
    if not isinstance(base, dist.TCPStore):
        return store
    return dist.TCPStore(base.host, base.port, is_master=False,
                         timeout=timedelta(seconds=timeout_s))


class Peers:
    """Heartbeats of every rank and the polling barrier; one per launch, from init_world."""

    def __init__(self, store: dist.Store, prefix: str, rank: int, size: int,
                 timeout_s: float) -> None:
        self.rank, self.size, self.timeout_s = rank, size, timeout_s
        self.prefix = prefix
        self.beat_s = min(5.0, timeout_s / 4)
        self._store = store  # the main thread's calls (barrier keys)
        self._beat_store = _own_client(store, timeout_s)
        now = time.monotonic()
        self._seen = {r: (-1, now) for r in range(size) if r != rank}  # rank -> (count, when)
        self._seq = 0  # barriers so far; every rank calls the same ones in the same order
        self._stop = threading.Event()
        self._error: str | None = None  # why the beat thread could not reach the store
        self._thread = threading.Thread(target=self._beat, name="aleph-peers", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.is_set():
            try:
                self._beat_store.add(f"{self.prefix}hb/{self.rank}", 1)
                now = time.monotonic()
                for r, (count, _) in list(self._seen.items()):
                    got = self._beat_store.add(f"{self.prefix}hb/{r}", 0)  # a read that never blocks
                    if got != count:
                        self._seen[r] = (got, now)
            except (RuntimeError, OSError) as e:  # the store is gone: the job is ending
                self._error = str(e).splitlines()[0] if str(e) else type(e).__name__
                return
            self._stop.wait(self.beat_s)

    def silent_for(self, rank: int) -> float:
        """Seconds since `rank`'s heartbeat last moved (as seen by this rank)."""
        return time.monotonic() - self._seen[rank][1]

    def silent(self, seconds: float | None = None) -> list[tuple[int, float]]:
        """(rank, seconds silent) of the peers silent longer than `seconds` (default: a few beats)."""
        limit = STALE_BEATS * self.beat_s if seconds is None else seconds
        return [(r, self.silent_for(r)) for r in self._seen if self.silent_for(r) > limit]

    def barrier(self, what: str, log: Callable[[str], None]) -> None:
        """Wait, polling, until every rank has reached this barrier.

        Logs after LOG_FIRST_S and then every LOG_EVERY_S which ranks it still waits for.
        Raises PeerLost naming the rank when one it waits for has not beaten for
        `timeout_s`, or when the store stops answering.
        """
        self._seq += 1
        keys = [f"{self.prefix}at/{self._seq}/{r}" for r in range(self.size)]
        t0 = time.monotonic()
        next_log, pause = t0 + LOG_FIRST_S, 0.01
        try:
            self._store.set(keys[self.rank], "1")
            while True:
                missing = [r for r, k in enumerate(keys) if r != self.rank and not self._store.check([k])]
                if not missing:
                    return
                lost = [(r, s) for r, s in self.silent(self.timeout_s) if r in missing]
                if lost:
                    names = ", ".join(f"rank {r} (no heartbeat for {s:.0f} s)" for r, s in lost)
                    raise PeerLost(f"{names} stopped answering while rank {self.rank} waited "
                                   f"for it to finish {what} (collective_timeout_s="
                                   f"{self.timeout_s:g}); this rank gives up")
                if self._error is not None:
                    raise PeerLost(f"the rendezvous store stopped answering ({self._error}) "
                                   f"while rank {self.rank} waited for {what}")
                now = time.monotonic()
                if now >= next_log:
                    who = ", ".join(f"rank {r}" for r in missing)
                    log(f"waiting for {who} to finish {what} ({now - t0:.0f} s so far; "
                        "each is alive while its heartbeat moves)")
                    next_log = now + LOG_EVERY_S
                time.sleep(pause)
                pause = min(pause * 2, 1.0)
        except dist.DistError as e:  # the store itself timed out or went away
            raise PeerLost(f"the rendezvous store stopped answering while rank {self.rank} "
                           f"waited for {what}: {str(e).splitlines()[0]}") from e

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.beat_s + 1)
