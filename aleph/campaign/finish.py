"""After the runs: evaluate each, the E1 table, the `runs diff` matrix, the summary.

Through the public functions of the layers below: aleph.eval.runner.run_eval (what `aleph
eval` calls), aleph.report.table.build + render.write_all + plot.write_png (`aleph report`) and
aleph.report.diff.diff_runs + diff_text (`aleph runs diff`). Everything is written under
the campaign directory; a restart re-evaluates only runs whose final weights or
evaluation options changed, and rewrites the report, the matrix and the summary.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from pathlib import Path

from aleph._io import atomic_write_json, atomic_write_text, read_json
from aleph.campaign import rundirs
from aleph.campaign.state import COMPLETE, FAILED
from aleph.errors import AlephError, DataError
from aleph.record.layout import RunLayout
from aleph.train.identity import utc_now

VERDICT_MARK = {"equivalent": "=", "equivalent with caveats": "~", "not equivalent": "X"}


@dataclass(frozen=True)
class EvalOptions:
    """The `aleph eval` options a campaign passes to every run (None: eval's own default)."""

    tasks: str | None = None
    tasks_dir: str | None = None
    probe_captions: str | None = None
    probe_targets: str | None = None
    probe_rows: int = 2048
    probe_batch: int = 256
    probes: bool = True
    device: str = "auto"


def check_eval_inputs(configs: dict, opts: EvalOptions) -> None:
    """Load the evaluation tasks (and probe files) the runs will be scored on, before any
    training: a missing STS task or offline bundle fails the campaign now, in one line,
    not after days of training."""
    from aleph.eval.probe_data import probe_for_run
    from aleph.eval.runner import default_tasks
    from aleph.eval.tasks import load_tasks, parse_task_names
    from aleph.train.config import to_dict

    cfg = next(iter(configs.values()))  # every run of a campaign shares the data and tasks
    config = to_dict(cfg)
    names = parse_task_names(opts.tasks) if opts.tasks else default_tasks(config)
    try:
        load_tasks(names, opts.tasks_dir)
        if opts.probes and (opts.probe_captions or opts.probe_targets):
            probe_for_run(config, opts.probe_captions, opts.probe_targets, opts.probe_rows)
    except (AlephError, OSError) as e:
        raise DataError(f"evaluation inputs of {cfg.arm}-s{cfg.seed} ({', '.join(names)}): "
                        f"{e}; the campaign evaluates every run at its end: fix this first "
                        "(aleph data fetch writes the offline bundle; or --tasks-dir, "
                        "--tasks)") from None


def evaluate(c, opts: EvalOptions) -> dict[str, str]:
    """Evaluate every complete run not yet evaluated with these weights and options;
    returns run id -> one-line error for runs whose evaluation failed."""
    from aleph.eval.runner import run_eval
    from aleph.eval.tasks import parse_task_names

    errors: dict[str, str] = {}
    wanted = asdict(opts)
    for rid in c.state.with_status(COMPLETE):
        if c.stopping:
            return errors
        run, rd = c.state.run(rid), rundirs.run_dir(c.configs[rid])
        sha = rundirs.weights_sha256(rd)
        done = run.get("eval") or {}
        if done.get("weights_sha256") == sha and done.get("options") == wanted and _eval_sha(rd) == sha:
            continue
        c.say(f"{rid}: evaluating (aleph eval {rd})")
        try:
            res = run_eval(rd, parse_task_names(opts.tasks) if opts.tasks else None,
                           tasks_dir=opts.tasks_dir, probe_captions=opts.probe_captions,
                           probe_targets=opts.probe_targets, probe_rows=opts.probe_rows,
                           probe_batch=opts.probe_batch, device=opts.device, probes=opts.probes)
        except (AlephError, OSError) as e:
            errors[rid] = f"{type(e).__name__}: {e}"
            run["eval"] = {"error": errors[rid], "at": utc_now(), "options": wanted}
            c.say(f"{rid}: evaluation FAILED: {errors[rid]}")
            c.state.save()
            continue
        run["eval"] = {"weights_sha256": res["weights"]["sha256"], "capability": res["capability"],
                       "eval_data_fingerprint": res["eval_data_fingerprint"], "at": utc_now(),
                       "options": wanted}
        c.say(f"{rid}: capability {res['capability']:.4f}")
        c.state.save()
    for rid in c.state.with_status(COMPLETE):
        if "error" in (c.state.run(rid).get("eval") or {}):
            errors.setdefault(rid, c.state.run(rid)["eval"]["error"])
    return errors


def _eval_sha(rd: Path) -> str | None:
    try:
        return (read_json(RunLayout(rd).eval).get("weights") or {}).get("sha256")
    except (OSError, ValueError, AttributeError):
        return None


def report(c, rids: list[str], published: bool) -> tuple[str, list[Path]]:
    """`aleph report` of the evaluated runs into <campaign>/report/: the tables and, as
    `aleph report` writes it, report.png (loss curves, capability, bank health)."""
    from aleph.report.plot import write_png
    from aleph.report.render import markdown, write_all
    from aleph.report.table import build

    run_dirs = [rundirs.run_dir(c.configs[r]) for r in rids]
    rep = build(run_dirs, with_published=published)
    out = c.dir / "report"
    return markdown(rep), [*write_all(rep, out), write_png(rep, run_dirs, out / "report.png")]


def diff_matrix(c, rids: list[str], repo: Path | None) -> tuple[str, Path, Path]:
    """`aleph runs diff` of every pair; the verdict matrix as Markdown and JSON, each pair's
    full diff in <campaign>/diffs/<A>__<B>.txt (+ .json)."""
    from aleph.report.diff import diff_runs
    from aleph.report.diff_text import as_json, format_diff

    pairs = []
    for a, b in itertools.combinations(rids, 2):
        stem = c.dir / "diffs" / f"{a}__{b}"
        try:
            d = diff_runs(rundirs.run_dir(c.configs[a]), rundirs.run_dir(c.configs[b]), repo=repo)
        except (AlephError, OSError) as e:
            pairs.append({"a": a, "b": b, "verdict": f"error: {e}", "blockers": [], "caveats": [],
                          "file": None})
            continue
        atomic_write_text(stem.with_suffix(".txt"), format_diff(d))
        atomic_write_json(stem.with_suffix(".json"), as_json(d))
        pairs.append({"a": a, "b": b, "verdict": d.verdict, "blockers": d.blockers,
                      "caveats": d.caveats, "file": str(stem.with_suffix(".txt").relative_to(c.dir))})
    md = matrix_markdown(rids, pairs)
    md_path, js_path = c.dir / "diff-matrix.md", c.dir / "diff-matrix.json"
    atomic_write_text(md_path, md)
    atomic_write_json(js_path, {"runs": rids, "pairs": pairs, "written": utc_now()})
    return md, md_path, js_path


def matrix_markdown(rids: list[str], pairs: list[dict]) -> str:
    verdict = {}
    for p in pairs:
        v = p["verdict"]
        verdict[(p["a"], p["b"])] = verdict[(p["b"], p["a"])] = VERDICT_MARK.get(
            v, "!" if v.startswith("error") else "?")
    lines = ["## runs diff matrix", "",
             "`=` equivalent, `~` equivalent with caveats, `X` not equivalent, `!` diff failed "
             "(arm and seed are the experiment's variables: never held against equivalence)", "",
             "| | " + " | ".join(rids) + " |", "|---|" + "---|" * len(rids)]
    for a in rids:
        cells = ["·" if a == b else verdict.get((a, b), "?") for b in rids]
        lines.append(f"| {a} | " + " | ".join(cells) + " |")
    lines += ["", "| A | B | verdict | blockers | caveats | full diff |", "|---|---|---|---|---|---|"]
    for p in pairs:
        first = f"{len(p['blockers'])}: {_cell(p['blockers'][0])}" if p["blockers"] else "0"
        lines.append(f"| {p['a']} | {p['b']} | {p['verdict']} | {first} | {len(p['caveats'])} | "
                     f"{p['file'] or '—'} |")
    return "\n".join(lines) + "\n"


def _cell(text: str, width: int = 90) -> str:
    text = text.replace("|", "/").replace("\n", " ")
    return text if len(text) <= width else text[:width - 1] + "…"


def summary(c, eval_errors: dict[str, str], outputs: dict[str, str]) -> str:
    """The closing summary (also <campaign>/summary.md): per run its launches, where they
    ran and how they ended, final weights and capability; then where everything is."""
    runs = [c.state.run(r) for r in c.state.queue]
    done = sum(r["status"] == COMPLETE for r in runs)
    failed = [rid for rid in c.state.queue if c.state.run(rid)["status"] == FAILED]
    state = "stopped (resumable: run the same command again)" if c.stopping else (
        "complete" if not failed and not eval_errors else "finished with failures")
    lines = [f"# campaign {c.spec.name}: {state}", "",
             f"{len(runs)} runs: {done} complete, {len(failed)} failed, "
             f"{len(runs) - done - len(failed)} not finished; evaluation failed for "
             f"{len(eval_errors)}; devices {', '.join(d.describe() for d in c.devices)}", "",
             "| run | status | launches (device: outcome, exit) | final weights sha256 | capability |",
             "|---|---|---|---|---|"]
    for rid in c.state.queue:
        r = c.state.run(rid)
        launches = "; ".join(f"{e['n']}. {e['device']}: {e['outcome']}, "
                             f"{'?' if e['exit_status'] is None else e['exit_status']}"
                             for e in r["launches"]) or "none by this campaign"
        sha = (r.get("weights_sha256") or "")[:16] or "—"
        ev = r.get("eval") or {}
        cap = f"{ev['capability']:.4f}" if "capability" in ev else ("eval failed" if "error" in ev else "—")
        lines.append(f"| {rid} | {r['status']} | {launches} | {sha} | {cap} |")
    notes = [f"- {rid}: {c.state.run(rid)['note']}" for rid in failed]
    notes += [f"- {rid}: evaluation failed: {e}" for rid, e in eval_errors.items()]
    if notes:
        lines += ["", *notes]
    lines += ["", "## where", ""]
    lines += [f"- {k}: {v}" for k, v in outputs.items()]
    return "\n".join(lines) + "\n"
