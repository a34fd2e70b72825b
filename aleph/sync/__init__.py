"""Off-box persistence: a run directory synced to a hub repo or a directory, and back.

A preempted or deleted cloud VM takes its volume, and the run, with it. While training,
rank 0 hands sync requests to a background worker (`worker.Syncer`) after resume states
and at the end; `aleph runs push` / `pull` do the same by hand. What is synced: `select`;
how a killed push leaves the destination readable: `local` and `hub`.

This package sits below `train` (train and cli import it; it never imports train, eval,
report, campaign or cli).
"""

from pathlib import Path

from aleph.sync.dest import HUB_PREFIX, Destination, check_spec
from aleph.sync.index import SyncError
from aleph.sync.transfer import PullResult, PushResult, pull, push
from aleph.sync.worker import Syncer


def parse_destination(spec: str) -> Destination:
    """The Destination a string names; SyncError naming the string if it names none.
    (Here, not in dest: the hub and directory destinations build on dest's base class.)"""
    if problem := check_spec(spec):
        raise SyncError(f"sync destination {spec!r}: expected {problem}")
    if spec.startswith(HUB_PREFIX):
        from aleph.sync.hub import HubDestination

        return HubDestination(spec[len(HUB_PREFIX):])
    from aleph.sync.local import DirDestination

    return DirDestination(Path(spec))


__all__ = ["Destination", "parse_destination", "SyncError", "push", "pull", "PushResult",
           "PullResult", "Syncer"]
