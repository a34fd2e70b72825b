#!/bin/sh
# Container entrypoint, run by tini (PID 1). tini forwards SIGTERM from `docker compose
# stop` to its child; this script `exec`s the command, so that child *is* the trainer
# (or torchrun, which passes SIGTERM on to its ranks) and can checkpoint and exit cleanly.
set -eu

work="${ALEPH_WORK:-/workspace}"
# A bind-mounted work root owned by another uid fails later, deep inside a run; say so now.
# A service that only reads the runs (tensorboard mounts the volume :ro) sets
# ALEPH_WORK_READ_ONLY=1 and needs it readable, not writable.
if [ "${ALEPH_WORK_READ_ONLY:-0}" = 1 ]; then
    if [ ! -d "$work" ] || [ ! -r "$work" ] || [ ! -x "$work" ]; then
        echo "entrypoint: work root $work is not a directory readable by uid $(id -u)" >&2
        exit 73
    fi
elif ! mkdir -p "$work" 2>/dev/null || [ ! -w "$work" ]; then
    echo "entrypoint: work root $work is not writable by uid $(id -u);" \
        "chown it to $(id -u):$(id -g) on the host or use the named volume (docs/docker.md)" >&2
    exit 73
fi

if [ "$#" -eq 0 ]; then
    set -- aleph --help
fi
exec "$@"
