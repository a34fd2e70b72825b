"""Exception types for conditions a user can cause.

Every user-facing failure raises an `AlephError` subclass whose message names the file,
field or value at fault and what was expected. The CLI prints the message (no
traceback) and exits with the class's `exit_code`, so scripts can tell the cases apart.
"""


class AlephError(Exception):
    """Base of all expected, user-facing errors."""

    exit_code = 2


class ConfigError(AlephError):
    """A configuration field or override is invalid (message names the field)."""


class DataError(AlephError):
    """Captions, tokenizer or other training data is missing or malformed."""


class StoreError(AlephError):
    """A target or token store is missing, malformed, or does not match its manifest."""


class EnvironmentDrift(AlephError):
    """The live environment differs from the pinned one (strict check)."""

    exit_code = 3


class RunLocked(AlephError):
    """Another launch holds this run directory's lock (duplicate orchestrator)."""

    exit_code = 75  # EX_TEMPFAIL: distinct so orchestrators can tell it apart


class QuotaError(AlephError):
    """A plan does not fit the memory or disk quota."""


class NonFiniteError(AlephError):
    """Training produced a NaN/Inf loss or gradient norm; the optimiser step was not taken.

    The run directory is left at its last complete resume state (nothing of the bad step is
    saved), so a relaunch resumes from there; lower the learning rate or check the targets
    for non-finite rows first, or it will diverge again.
    """

    exit_code = 65  # EX_DATAERR: the numbers went bad, distinct from config (2) and lock (75)


class PeerLost(RuntimeError):
    """A rank of a distributed launch stopped answering (its heartbeat in the c10d store
    stalled, or the store itself went away). Not a refusal: the launch failed (exit 1)."""


EXIT_STOPPED = 76
"""Exit status of a command stopped by SIGTERM/SIGINT (any number of them) that recorded the
stop and can be resumed by running it again: `aleph train`, `aleph campaign`, `aleph targets
extract` and `consensus`. Distinct from complete (0), refused (2), drift (3), non-finite (65)
and locked (75, EX_TEMPFAIL: try again later, as here), so a scheduler's script can tell a
stop to requeue from a failure."""
