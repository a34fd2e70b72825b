"""Which ranks are alive, through the c10d store: heartbeats, and a barrier that polls.

Collectives run under a short timeout (`collective_timeout_s`); what rank 0 does alone for
long (store builds, resume-state saves) the others wait for in `Peers.barrier`, which polls
the store and gives up when a rank it waits for has left (marked itself gone) or stopped
beating for the timeout. Each rank's thread adds 1 to `<prefix>hb/<rank>` every `beat_s`
and notes, on its own clock, when each other counter last moved; it judges others only
while its own view is current. Under torchrun the store is the elastic agent's, so it
answers while a worker is stopped. The prefix is chosen per launch, so keys of an earlier
attempt in the same store are never read.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from aleph.errors import PeerLost

STALE_BEATS = 3  # a peer silent for this many beats is named after a collective fails
CURRENT_BEATS = 2  # this rank's own round must be this fresh for it to judge others
LOG_FIRST_S, LOG_EVERY_S = 5.0, 60.0  # first "waiting" line, then one a minute


def _own_client(store: dist.Store, timeout_s: float) -> dist.Store | None:
    """A second connection to the TCP store (so the beat thread never queues behind the
    main thread's store calls); None where the store is not a TCPStore."""
    base = store
    while isinstance(base, dist.PrefixStore):
        base = base.underlying_store
    if not isinstance(base, dist.TCPStore):
        return None
    return dist.TCPStore(base.host, base.port, is_master=False,
                         timeout=timedelta(seconds=timeout_s))


def first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]


class Peers:
    """Heartbeats of every rank and the polling barrier; one per launch, from init_world."""

    def __init__(self, store: dist.Store, prefix: str, rank: int, size: int,
                 timeout_s: float, in_thread: Callable[[], Any] | None = None) -> None:
        self.rank, self.size, self.timeout_s = rank, size, timeout_s
        self.prefix = prefix
        self.beat_s = min(5.0, timeout_s / 4)
        self._store = store  # the main thread's calls (barrier keys)
        self._beat_store = _own_client(store, timeout_s)
        # one client shared by both threads needs a lock; the thread's own client does not
        self._lock = threading.Lock() if self._beat_store is None else contextlib.nullcontext()
        now = time.monotonic()
        self._seen = {r: (-1, now) for r in range(size) if r != rank}  # rank -> (count, when)
        self._round_at = now  # when this rank's thread last read every counter
        self._seq = 0  # barriers so far; every rank calls the same ones in the same order
        self._stop = threading.Event()
        self._error: str | None = None  # why the beat thread last failed to reach the store
        self._in_thread = in_thread  # a context: the executed-code tracer in the thread
        self._thread = threading.Thread(target=self._beat, name="aleph-peers", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        with self._in_thread() if self._in_thread is not None else contextlib.nullcontext():
            self._beat_until_closed()

    def _beat_until_closed(self) -> None:
        while not self._stop.is_set():
            try:
                self._round()
                self._error = None
            except (RuntimeError, OSError) as e:  # retried: a new connection next round
                self._error = first_line(e)
                with contextlib.suppress(RuntimeError, OSError):
                    self._beat_store = _own_client(self._store, self.timeout_s)
            self._stop.wait(self.beat_s)

    def _round(self) -> None:
        store = self._store if self._beat_store is None else self._beat_store
        with self._lock:
            store.add(f"{self.prefix}hb/{self.rank}", 1)
            now = time.monotonic()
            for r, (count, _) in list(self._seen.items()):
                got = store.add(f"{self.prefix}hb/{r}", 0)  # a read that never blocks
                if got != count:
                    self._seen[r] = (got, now)
        self._round_at = time.monotonic()

    def current(self) -> bool:
        """Whether this rank's own thread read the counters lately (else it judges nobody)."""
        return time.monotonic() - self._round_at <= CURRENT_BEATS * self.beat_s

    def silent(self, seconds: float | None = None) -> list[tuple[int, float]]:
        """(rank, seconds silent) of the peers silent longer than `seconds` (default: a few
        beats); none while this rank's own view is not current."""
        if not self.current():
            return []
        limit = STALE_BEATS * self.beat_s if seconds is None else seconds
        now = time.monotonic()
        quiet = [(r, now - when) for r, (_, when) in self._seen.items()]
        return [(r, s) for r, s in quiet if s > limit]

    def _check(self, key: str) -> bool:
        with self._lock:
            return self._store.check([key])

    def barrier(self, what: str, log: Callable[[str], None]) -> None:
        """Wait, polling, until every rank has reached this barrier.

        Logs which ranks it still waits for after LOG_FIRST_S, then every LOG_EVERY_S.
        PeerLost names a rank that left or has not beaten for `timeout_s` (or this rank's
        own loss of the store); leaving by any exception marks this rank gone.
        """
        self._seq += 1
        keys = [f"{self.prefix}at/{self._seq}/{r}" for r in range(self.size)]
        others = [r for r in range(self.size) if r != self.rank]
        t0 = time.monotonic()
        next_log, pause, cap = t0 + LOG_FIRST_S, 0.01, min(1.0, self.timeout_s / 20)
        try:
            self._store.set(keys[self.rank], "1")
            while True:
                missing = [r for r in others if not self._check(keys[r])]
                # also after all arrived: a rank may leave right after
                left = [r for r in others if self._check(f"{self.prefix}gone/{r}")]
                if left:
                    names = ", ".join(f"rank {r}" for r in left)
                    raise PeerLost(f"{names} left (stopped or failed) while rank {self.rank} "
                                   f"waited for {what}; this rank gives up")
                if not missing:
                    return
                self._give_up_on(missing, what)
                now = time.monotonic()
                if now >= next_log:
                    who = ", ".join(f"rank {r}" for r in missing)
                    log(f"waiting for {who} to finish {what} ({now - t0:.0f} s so far; "
                        "each is alive while its heartbeat moves)")
                    next_log = now + LOG_EVERY_S
                time.sleep(pause)
                pause = min(pause * 2, cap)
        except dist.DistError as e:  # the store itself timed out or went away
            self.mark_gone()
            raise PeerLost(f"the rendezvous store stopped answering while rank {self.rank} "
                           f"waited for {what}: {first_line(e)}") from e
        except BaseException:
            self.mark_gone()
            raise

    def _give_up_on(self, missing: list[int], what: str) -> None:
        """PeerLost when a missing rank has been silent for the timeout, or this rank's own
        thread has not reached the store for that long."""
        if self._error is not None and time.monotonic() - self._round_at > self.timeout_s:
            raise PeerLost(f"rank {self.rank} could not reach the rendezvous store for "
                           f"{self.timeout_s:g} s while it waited for {what} ({self._error})")
        lost = [(r, s) for r, s in self.silent(self.timeout_s) if r in missing]
        if lost:
            names = ", ".join(f"rank {r} (no heartbeat for {s:.0f} s)" for r, s in lost)
            raise PeerLost(f"{names} stopped answering while rank {self.rank} waited for it "
                           f"to finish {what} (collective_timeout_s={self.timeout_s:g}); this "
                           "rank gives up")

    def mark_gone(self) -> None:
        """Tell the others this rank waits in no further barrier (best effort)."""
        with contextlib.suppress(RuntimeError, OSError), self._lock:
            self._store.set(f"{self.prefix}gone/{self.rank}", "1")

    def close(self) -> None:
        self.mark_gone()
        self._stop.set()
        self._thread.join(timeout=self.beat_s + 1)
