"""Render a built report (aleph.report.table.build) as Markdown, CSV and JSON."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from aleph._io import atomic_write_json, atomic_write_text
from aleph.model.config import BANK_ARMS
from aleph.report.table import MISSING_TEXT as MISSING
from aleph.report.table import NUMERIC, task_label

SUMMARY_HEADER = ("run", "mean", "dispatch OFF", "toggle", "R@1", "cos->target", "erank/768", "basis",
                  "vs P")
NOT_E1_MARK = " †"  # a per-task cell scored on data that is not the E1 task of its column
# What each column of the summary table means, printed under it. README.md's column table
# carries the same pairs word for word (tests/report/test_glossary.py holds them together).
GLOSSARY = (
    ("mean", "capability: Spearman's rho between the cosine of the two sentence embeddings and "
     "the gold similarity, averaged unweighted over the row's STS tasks (the 8 of E1, or the "
     "offline smoke set for smoke runs; see basis), dispatch on"),
    ("dispatch OFF", "the same capability with the bank's dispatched experts switched off (trunk "
     "FFN only); n/a for the dense arm a2_dense, which has no bank"),
    ("toggle", "dispatch OFF minus mean: negative when the dispatched experts add capability, "
     "near 0 when the trunk carries it alone"),
    ("R@1 (b=256)", "mimicry: share of probe rows whose own teacher target scores highest among "
     "the b targets of its batch; a larger b is harder, so figures with different b are never "
     "averaged; tied top scores (a target present twice in a batch) share the hit, 1/k each; "
     "the legend names the probe rows: for e1 runs a fixed sample of their own rows chosen by "
     "the hash of the caption, seen in training (every row is trained on, as for E1's own "
     "figures), for smoke runs held-out rows"),
    ("cos->target", "mean cosine between a row's embedding and its own teacher target"),
    ("erank/768", "effective rank of the embeddings: participation ratio of their covariance "
     "spectrum, from 1 (one direction) to 768 (isotropic)"),
    ("basis", "which rows may be compared: same config (arm and seed aside), same task set and "
     "data, same weights (final, or step N from `aleph eval --weights`); the legend under the "
     "table says what each letter is, P is the published E1 runs"),
    ("vs P", "how the row differs from the published E1 setup (model shape, each config field "
     "overridden against the e1 preset, target rows trained on, each task's source and pair "
     "count against the pinned test splits, tokenizer; the legend has the details): a row that "
     "differs in anything that moves the score is not comparable to P and is never drawn on "
     "the published scale"),
    ("mean / spread rows", "mean and sample standard deviation over the seeds of one arm on one "
     "basis; runs on different bases, and published rows (basis P), are never averaged"),
)


def _num(value, digits: int = 4, signed: bool = False) -> str:
    if value is None:
        return MISSING
    return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def summary_cells(row: dict) -> list[str]:
    no_bank = row.get("arm") not in BANK_ARMS and row["kind"] != "published"
    off = "n/a" if no_bank else _num(row.get("capability_dispatch_off"))
    toggle = "n/a" if no_bank else _num(row.get("toggle"), signed=row["kind"] != "spread")
    if row.get("r_at_1") is not None:
        b = row.get("r_at_1_batch_size")
        r1 = _num(row["r_at_1"]) + (f" (b={b})" if b else "")
    else:
        r1 = row.get("r_at_1_text", MISSING)
    cos = _num(row.get("cos_target")) if row.get("cos_target") is not None else row.get("cos_target_text", MISSING)
    er = _num(row.get("erank"), 1) if row.get("erank") is not None else row.get("erank_text", MISSING)
    vs = "P" if row["kind"] == "published" else (row.get("vs_e1") or {}).get("short", MISSING)
    return [row["run"], _num(row.get("capability")), off, toggle, r1, cos, er, row.get("basis", MISSING), vs]


def _md_table(header, body) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    return "\n".join(lines)


def markdown(report: dict, glossary: bool = True) -> str:
    """The summary table, its basis legend and notes, the column glossary (unless
    `glossary` is False), then the per-task Spearman table."""
    rows, names = report["rows"], report["task_names"]
    parts = ["## E1 table", "", _md_table(SUMMARY_HEADER, [summary_cells(r) for r in rows]), ""]
    parts += [f"- {line}" for line in (*report.get("legend", []), *report["notes"])]
    if glossary:
        parts += ["", "## Columns", "", *glossary_lines()]
    if names:
        header = ["run", *(task_label(n) for n in names)]
        body = [[r["run"], *(_num(r["tasks"].get(n)) + (NOT_E1_MARK if n in r.get("not_e1_tasks", ()) else "")
                             for n in names)] for r in rows if r.get("tasks")]
        parts += ["", "## Per-task Spearman", "", _md_table(header, body)]
        if any(r.get("not_e1_tasks") for r in rows):
            parts += ["", f"{NOT_E1_MARK.strip()} not the E1 task of that name (another source, pair count "
                      "or content than the pinned test split): the legend's `vs E1` says why"]
    return "\n".join(parts) + "\n"


def glossary_lines() -> list[str]:
    return [f"- **{name}**: {text}" for name, text in GLOSSARY]


def summary_csv(report: dict) -> str:
    fields = ["run", "kind", "arm", "seed", *NUMERIC, "r_at_1_batch_size", "dim", "basis", "weights",
              "comparable"]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in report["rows"]:
        w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in fields})
    return buf.getvalue()


def tasks_csv(report: dict) -> str:
    names = report["task_names"]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["run", "kind", *names])
    for r in report["rows"]:
        if r.get("tasks"):
            w.writerow([r["run"], r["kind"], *("" if r["tasks"].get(n) is None else r["tasks"][n] for n in names)])
    return buf.getvalue()


def write_all(report: dict, out_dir: Path) -> list[Path]:
    """report.md, runs.csv, tasks.csv, report.json in `out_dir`, each written atomically."""
    out_dir = Path(out_dir)
    files = {
        "report.md": markdown(report), "runs.csv": summary_csv(report), "tasks.csv": tasks_csv(report),
    }
    for name, text in files.items():
        atomic_write_text(out_dir / name, text)
    atomic_write_json(out_dir / "report.json", report)
    return [out_dir / n for n in (*files, "report.json")]
