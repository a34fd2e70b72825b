"""Off-box persistence: a run directory synced to a hub repo or a directory, and back.

A cloud VM that is preempted or deleted takes its volume, and the run, with it. While
training, rank 0 hands a sync request to a background worker (`worker.Syncer`) after a
complete resume state is saved and the cadence is due, and once more at the end or at a
stop; `aleph runs push` / `aleph runs pull` do the same by hand. What is synced, and how a
destination stays readable when a push is killed half way, is said in `select` and in
each destination (`local`: a directory, content-addressed; `hub`: one commit per push).

This package sits below `train` (train and cli import it; it never imports train, eval,
report, campaign or cli).
"""

from aleph.sync.dest import Destination, parse_destination
from aleph.sync.index import SyncError
from aleph.sync.transfer import PullResult, PushResult, pull, push
from aleph.sync.worker import Syncer

__all__ = ["Destination", "parse_destination", "SyncError", "push", "pull", "PushResult",
           "PullResult", "Syncer"]
