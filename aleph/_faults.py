"""Fault points: where the crash tests stop a real process at a known state.

`fault_point(name, index)` does nothing unless the environment holds ALEPH_FAULT="<name>:<index>";
reaching that point, the process writes its pid to the file ALEPH_FAULT_FILE names and waits
there for ever, holding what it holds (a build lock, half a resume state), so the test
SIGKILLs it at exactly that state. Used by the target store builds, `targets extract` /
`consensus` and the trainer's resume-state save.
"""

from __future__ import annotations

import os
import time

FAULT_ENV, FAULT_FILE_ENV = "ALEPH_FAULT", "ALEPH_FAULT_FILE"


def fault_point(name: str, index: int = 0) -> None:
    """Wait here for the test's SIGKILL when ALEPH_FAULT is "<name>:<index>"; else return."""
    if os.environ.get(FAULT_ENV) != f"{name}:{index}":
        return
    with open(os.environ[FAULT_FILE_ENV], "w") as f:  # nofollow-ok: a test hook's own marker
        f.write(str(os.getpid()))
    while True:
        time.sleep(60)
