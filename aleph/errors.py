"""Exception types for conditions a user can cause: each message names the file, field or
value at fault and what was expected; the CLI prints it (no traceback) and exits with the
class's `exit_code`, so scripts can tell the cases apart."""


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
    """Training produced a NaN/Inf loss or gradient norm; the step was not taken and the run
    directory is left at its last complete resume state."""

    exit_code = 65  # EX_DATAERR: the numbers went bad, distinct from config (2) and lock (75)


class PeerLost(RuntimeError):
    """A rank of a distributed launch stopped answering (its heartbeat in the c10d store
    stalled, or the store itself went away). Not a refusal: the launch failed (exit 1)."""


EXIT_STOPPED = 76
"""Exit status of a command stopped by SIGTERM/SIGINT that recorded the stop and resumes when
run again; distinct from 0, 2, 3, 65 and 75, so a scheduler can tell a stop to requeue."""
