"""`aleph eval RUN` (a run directory or name): capability, dispatch-off/toggle, mimicry probes -> eval.json + tb/."""

from __future__ import annotations

import argparse

from aleph.eval.evaluate import DEFAULT_PROBE_BATCH
from aleph.eval.probe_data import DEFAULT_ROWS
from aleph.eval.tasks import TASK_FILES


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "eval", help="evaluate a run's final weights (STS capability and probes)",
        description="Scores RUN/weights/final on STS tasks (Spearman of cosine vs gold) "
        "and the mimicry probes; writes RUN/eval.json and eval/ scalars to RUN/tb.",
    )
    p.add_argument("run_dir", metavar="RUN",
                   help="the run: its directory, or its name under <work root>/runs "
                   "(e.g. smoke/a2_dense-s0, a1_anchored-s1; `aleph runs list` shows them)")
    p.add_argument("--tasks", default=None,
                   help="e1 (the 8 STS tasks), smoke (offline, from the smoke grammar), or a "
                   "comma list of names (default: smoke for smoke-data runs, else e1)")
    p.add_argument("--tasks-dir", default=None,
                   help="directory of local task files <name>.tsv / <name>.jsonl, used before "
                   f"the bundle and hub copies (columns sentence1, sentence2, score); the E1 "
                   f"tasks' names: {TASK_FILES}. A file counts as the E1 task only with the "
                   "pinned split's pair count and, checked against the offline bundle, its pairs")
    p.add_argument("--weights", default=None, help="weights directory (default RUN/weights/final)")
    p.add_argument("--probe-captions", default=None,
                   help="caption file for the probes (default: smoke runs held-out smoke rows; "
                   "other runs the e1 probe set, a hash-chosen sample of their own rows, "
                   "seen in training, when the run's captions and targets are here)")
    p.add_argument("--probe-targets", default=None,
                   help="their targets: a target store directory, the chunk directory it was "
                   "built from, or a .pt (N, 768) file")
    p.add_argument("--probe-rows", type=int, default=DEFAULT_ROWS, help=f"probe rows (default {DEFAULT_ROWS})")
    p.add_argument("--probe-batch", type=int, default=DEFAULT_PROBE_BATCH,
                   help=f"R@1 batch: candidates per query (default {DEFAULT_PROBE_BATCH})")
    p.add_argument("--no-probes", action="store_true", help="skip R@1, cos->target and erank")
    p.add_argument("--batch-size", type=int, default=128, help="encoding batch (no effect on results)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where to encode (default auto: CUDA when available)")
    p.set_defaults(func=_eval)


def _eval(args: argparse.Namespace) -> int:
    from aleph.eval.rundir import require_run_dir
    from aleph.eval.runner import run_eval
    from aleph.eval.tasks import parse_task_names
    from aleph.report.render import markdown
    from aleph.report.table import SEEN, build

    args.run_dir = require_run_dir(args.run_dir)  # a directory or a run name
    result = run_eval(
        args.run_dir, parse_task_names(args.tasks) if args.tasks else None, tasks_dir=args.tasks_dir,
        weights_dir=args.weights, probe_captions=args.probe_captions,
        probe_targets=args.probe_targets, probe_rows=args.probe_rows,
        probe_batch=args.probe_batch, batch_size=args.batch_size, device=args.device,
        probes=not args.no_probes, say=lambda line: print(line, flush=True),
    )
    print(markdown(build([args.run_dir]), glossary=False), end="")
    if result["probes"] is None and not args.no_probes:
        print(f"- probes skipped: {result.get('probes_skipped')}; give --probe-captions and "
              "--probe-targets to probe other rows")
    elif result["probes"] is not None:
        p = result["probes"]
        print(f"- probes: {p['set']} ({SEEN[p['seen_in_training']]}): {p['source']}")
    print(f"- wrote {args.run_dir}/eval.json (weights sha256 {result['weights']['sha256'][:12]}, "
          f"evaluation data {result['eval_data_fingerprint'][:12]})")
    return 0
