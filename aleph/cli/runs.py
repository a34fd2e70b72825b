"""`aleph runs diff A B`: equivalence report between two run directories;
`aleph runs list [WORK]`: every run of a work root, its status, steps, last launch, evaluation;
`aleph runs push RUN [--to DEST]` / `aleph runs pull DEST [--into WORK]`: a run to and from
off-box storage (a hub repo or a directory; aleph.sync)."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from aleph.record.layout import RunLayout

NOT_EQUIVALENT_EXIT = 1


def register(subparsers) -> None:
    p = subparsers.add_parser("runs", help="list and compare run directories")
    sub = p.add_subparsers(dest="runs_command", metavar="RUNS_COMMAND", required=True)
    d = sub.add_parser(
        "diff", help="environment, code, config, target store and launches of two runs, with a verdict",
        description="Ends with a verdict: equivalent / equivalent with caveats / not equivalent. "
        f"Exit status 0 unless not equivalent ({NOT_EQUIVALENT_EXIT}).",
    )
    d.add_argument("run_a", metavar="RUN_A", help="a run directory or a run name under <work root>/runs")
    d.add_argument("run_b", metavar="RUN_B", help="the run to compare it with (directory or name)")
    d.add_argument("--repo", type=Path, default=Path("."),
                   help="git checkout holding both code revisions, for changed files and hunks "
                   "(default: the current directory)")
    d.add_argument("--patch", action="store_true", help="print the full code diff")
    d.add_argument("--json", type=Path, default=None, help="also write the diff as JSON to this file")
    d.set_defaults(func=_diff)
    ls = sub.add_parser(
        "list", help="every run under WORK/runs: status, steps, last launch, evaluated or not",
        description="Status: complete (a launch finished it and weights/final exists), running "
        "(a live launch holds run.lock), stopped (SIGTERM/Ctrl-C, resumable), failed, lost (died "
        "without recording its end), not started. Read only.",
    )
    ls.add_argument("work", nargs="?", type=Path, default=None, metavar="WORK",
                    help="work root (default: $ALEPH_WORK, else ./work)")
    ls.set_defaults(func=_list)
    _register_sync(sub)


def _register_sync(sub) -> None:
    dest_help = ("hf:<namespace>/<repo> (a hub model repo; token from HF_TOKEN) or an existing "
                 "directory given as an absolute path (a mounted bucket, NFS share, second disk)")
    ps = sub.add_parser(
        "push", help="send a run to a hub repo or a directory (only changed files)",
        description="Sends the run's config, manifest, metrics, eval.json, launch logs, "
        "TensorBoard events, complete weights, tokenizer and newest complete resume state; "
        "only files changed since the destination's newest snapshot are sent, and the "
        "snapshot counts only once its index is written, last. Holds the run lock meanwhile "
        "(a run being trained syncs itself: config sync_to).")
    ps.add_argument("run", metavar="RUN", help="a run directory or a run name under <work root>/runs")
    ps.add_argument("--to", default=None, metavar="DEST",
                    help=f"{dest_help}; default: the run's config sync_to")
    ps.add_argument("--verify", action="store_true",
                    help="first re-hash every file stored at the destination (reads it all) "
                    "and send again those missing or damaged (a pull refused one)")
    ps.set_defaults(func=_push)
    pl = sub.add_parser(
        "pull", help="restore runs from a hub repo or a directory into a work root",
        description="Fetches the newest complete snapshot of each run at DEST (or of --run), "
        "checks every file's sha256 against the snapshot's index, and renames the run "
        "directory into place only when all are verified: a partial pull leaves no run "
        "directory. Never replaces an existing run directory. `aleph train` with the same "
        "arm/seed/preset then resumes from the restored resume state.")
    pl.add_argument("dest", metavar="DEST", help=dest_help)
    pl.add_argument("--into", type=Path, default=None, metavar="WORK",
                    help="work root to restore into (default: $ALEPH_WORK, else ./work)")
    pl.add_argument("--run", default=None, metavar="RUN",
                    help="only this run (e.g. smoke/a2_dense-s1); default: every run at DEST")
    pl.set_defaults(func=_pull)


def _diff(args: argparse.Namespace) -> int:
    from aleph._io import atomic_write_json
    from aleph.report.diff import diff_runs
    from aleph.report.diff_text import as_json, format_diff

    d = diff_runs(args.run_a, args.run_b, repo=args.repo)
    print(format_diff(d, patch=args.patch), end="")
    if args.json is not None:
        atomic_write_json(args.json, as_json(d))
    return NOT_EQUIVALENT_EXIT if d.verdict == "not equivalent" else 0


def _is_run(d: Path) -> bool:
    return RunLayout(d).manifest.is_file() or RunLayout(d).config.is_file()


def find_runs(runs_root: Path) -> list[Path]:
    """Run directories (holding manifest.json or config.json) under `runs_root`, two levels deep."""
    found = []
    for d in sorted(p for p in runs_root.iterdir() if p.is_dir()):
        if _is_run(d):
            found.append(d)
        else:
            found += sorted(s for s in d.iterdir() if s.is_dir() and _is_run(s))
    return found


def list_rows(runs_root: Path) -> tuple[list[list[str]], list[str]]:
    """(one row per run, one line per run whose records are damaged, saying what is wrong):
    one damaged run is listed as such, never hiding the others."""
    from aleph._io import work_root
    from aleph.errors import AlephError

    # Names resolve against $ALEPH_WORK: the hint names the run that way when it lies
    # there, else by its directory (a WORK given on the command line).
    by_name = runs_root.resolve() == (work_root() / "runs").resolve()
    rows, damaged = [], []
    for d in find_runs(runs_root):
        name = str(d.relative_to(runs_root))
        try:
            rows.append([name, *_row(runs_root, d, by_name)])
        # bad JSON or UTF-8, a field of the wrong type, nesting too deep, unreadable
        except (AlephError, OSError, ValueError, TypeError, AttributeError, KeyError,
                RecursionError) as e:
            what = str(e) if isinstance(e, AlephError) else f"{d}: {type(e).__name__}: {e}"
            rows.append([name, "damaged", "—", "—", "—"])
            what = what.replace("\n", " ")  # one line, bounded: the file's text may be echoed
            damaged.append(f"{name}: damaged: {what if len(what) <= 300 else what[:297] + '...'}")
    return rows, damaged


def _row(runs_root: Path, d: Path, by_name: bool) -> list[str]:
    """status, steps, last launch and evaluated of run directory `d`."""
    from aleph.eval.rundir import run_state

    st = run_state(d)
    steps = "—" if st["step"] is None else (
        f"{st['step']}/{st['total_steps']}" if st["total_steps"] else str(st["step"]))
    last = st["last_launch"]
    # a launch still marked running whose process is gone (no lock holder) reads as lost
    shown = "lost" if last and st["status"] == "lost" and last.get("status") == "running" \
        else (last or {}).get("status")
    launch = "—" if not last else (
        f"{last['launch_id']} ({last.get('action') or '?'}, {shown}, "
        f"{'ended ' + last['end'] if last.get('end') else 'started ' + str(last.get('start'))})")
    ev = st["evaluated"]
    if ev is None:
        ref = d.relative_to(runs_root).as_posix() if by_name else d
        evaluated = "no" + (f": `aleph eval {shlex.quote(str(ref))}`" if st["status"] == "complete" else "")
    else:
        path = str(ev.get("path") or "")
        evaluated = "yes (" + ("final weights" if "final" in path else f"step {ev.get('step')}") + ")"
    return [st["status"], steps, launch, evaluated]


def _list(args: argparse.Namespace) -> int:
    from aleph._io import work_root
    from aleph.errors import DataError

    root = args.work if args.work is not None else work_root()
    runs_root = root / "runs"
    if not runs_root.is_dir():
        raise DataError(f"{runs_root}: no runs directory (is {root} a work root? `aleph train` creates it)")
    rows, damaged = list_rows(runs_root)
    if not rows:
        print(f"no runs under {runs_root}")
        return 0
    header = ["run", "status", "steps", "last launch", "evaluated"]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    print(f"runs under {runs_root}:")
    for r in [header, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    for line in damaged:
        print(line)
    return 0


def _push(args: argparse.Namespace) -> int:
    from aleph._io import read_json
    from aleph.eval.rundir import require_run_dir
    from aleph.sync import SyncError, parse_destination, push
    from aleph.sync.transfer import check_run_dir, foreign_sync_to
    from aleph.train.identity import RunLock

    run_dir = require_run_dir(args.run)
    check_run_dir(run_dir)  # before the lock: the lock file is written into the directory
    spec = args.to
    if spec is None:
        config = RunLayout(run_dir).config
        try:
            saved = read_json(config) if config.is_file() else {}
        except ValueError as e:
            raise SyncError(f"{config}: not valid JSON ({e})") from None
        spec = (saved.get("sync_to") if isinstance(saved, dict) else None) or ""
        if not spec:
            raise SyncError(f"{run_dir}: no destination: pass --to DEST (its config.json has "
                            "no sync_to)")
        if src := foreign_sync_to(run_dir, spec):
            raise SyncError(f"{run_dir}: pulled from {src}; the sync_to its config.json came "
                            f"with ({spec}) was chosen there, not here: pass --to DEST (--to "
                            f"{spec} to push there after all)")
    dest = parse_destination(spec)
    lock = RunLock(run_dir)
    lock.acquire()  # RunLocked (exit 75) while a launch trains it: that launch syncs itself
    try:
        print(push(run_dir, dest, verify=args.verify).line())
    finally:
        lock.release()
    return 0


def _pull(args: argparse.Namespace) -> int:
    from aleph._io import work_root
    from aleph.sync import parse_destination, pull

    into = args.into if args.into is not None else work_root()
    run = args.run
    if run is not None and not run.startswith("runs/"):
        run = f"runs/{run}"
    for result in pull(parse_destination(args.dest), into, run):
        print(result.line())
        where = (f"continues from step {result.step}" if result.step is not None
                 else "starts at step 0 (no resume state had been synced)")
        print(f"  resume: the same `aleph train` command with ALEPH_WORK={shlex.quote(str(into.absolute()))} {where}")
    return 0
