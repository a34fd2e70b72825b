"""The E1 picture: `aleph report` writes it as report.png beside the tables.

Six panels, 1500 x 800 px: training loss per run over samples seen (tb `train/loss`),
capability per arm and seed (open markers: dispatch off; published E1 runs as black
crosses), and four bank health gauges averaged over layers (`health/layerNN/<gauge>`).
Runs not comparable to P (`aleph.report.comparability`) are never drawn on the published
scale: the capability panel splits, those runs go on their own axis as diamonds, and
their curves, the title and the PNG's Description text say "not comparable to P".
Rendered with matplotlib's Agg backend (no display needed), written atomically.
"""

from __future__ import annotations

import io
from collections import defaultdict
from pathlib import Path

from aleph._io import atomic_write_bytes
from aleph.eval import rundir
from aleph.report import published
from aleph.report.comparability import NOT_COMPARABLE

SIZE_PX = (1500, 800)
DPI = 100
ARM_COLOURS = {"a1_anchored": "#1f77b4", "a2_dense": "#ff7f0e", "a3_random": "#2ca02c"}
ARM_ORDER = ("a1_anchored", "a2_dense", "a3_random")
HEALTH = (("gate_mean", "gate_mean: sigmoid(gate), mean over experts"),
          ("anchor_drift", "anchor_drift: 1 - cos(anchor, init)"),
          ("usage_ppl", "usage_ppl: expert usage perplexity (1..2K)"),
          ("neg_frac", "neg_frac: share of negative address weights"))
LINESTYLES = ("-", "--", ":", "-.")


def read_scalars(run_dir: Path, prefixes: tuple[str, ...] = ("train/", "health/")) -> dict[str, list]:
    """{tag: [(step, value), ...]} of a run's tb/ (sorted by step; the last value of a step
    wins), for the tags starting with one of `prefixes`; {} when the run has no tb/."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = Path(run_dir) / rundir.TB
    if not tb.is_dir():
        return {}
    acc = EventAccumulator(str(tb), size_guidance={"scalars": 0})
    acc.Reload()
    out = {}
    for tag in acc.Tags().get("scalars", []):
        if tag.startswith(prefixes):
            out[tag] = sorted({e.step: e.value for e in acc.Scalars(tag)}.items())
    return out


def _samples_per_step(run_dir: Path) -> int | None:
    cfg = rundir.read_run_json(run_dir, rundir.CONFIG, required=False) or {}
    b = cfg.get("batch_size")
    return b if isinstance(b, int) and b > 0 else None


def _label(row: dict) -> str:
    return row["run"] if row.get("comparable", True) else f"{row['run']} ({NOT_COMPARABLE})"


def description(report: dict) -> str:
    """The PNG's Description text: each run row's `vs P` cell."""
    return "\n".join(f"{r['run']}: {(r.get('vs_e1') or {}).get('short', 'not judged')}"
                      for r in report["rows"] if r["kind"] == "run")


def render_png(report: dict, run_dirs: list[Path]) -> bytes:
    """The picture of `report` (aleph.report.table.build of `run_dirs`) as PNG bytes."""
    import matplotlib.pyplot as plt

    fig = figure(report, run_dirs)
    try:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=DPI, metadata={"Description": description(report)})
    finally:
        plt.close(fig)
    return buf.getvalue()


def figure(report: dict, run_dirs: list[Path]):
    """The matplotlib Figure of the picture (the caller closes it: plt.close)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in report["rows"] if r["kind"] == "run"]
    dirs = [Path(d) for d in run_dirs]
    fig, axes = plt.subplots(2, 3, figsize=(SIZE_PX[0] / DPI, SIZE_PX[1] / DPI), dpi=DPI)
    try:
        scalars = [read_scalars(d) for d in dirs]
        per_step = [_samples_per_step(d) for d in dirs]
        x_is_samples = all(p is not None for p in per_step)
        xlabel = "samples seen" if x_is_samples else "step"
        _loss_panel(axes[0][0], runs, scalars, per_step, x_is_samples, xlabel)
        _capability_panel(axes[0][1], report, runs)
        health_axes = [axes[0][2], axes[1][0], axes[1][1], axes[1][2]]
        for ax, (gauge, title) in zip(health_axes, HEALTH, strict=True):
            _health_panel(ax, gauge, title, runs, scalars, per_step, x_is_samples, xlabel)
        fig.suptitle(_title(runs), fontsize=11)
        fig.tight_layout(rect=(0, 0, 1, 0.96))
    except BaseException:
        plt.close(fig)
        raise
    return fig


def _title(runs: list[dict]) -> str:
    """'smoke runs: a1_anchored-s0, ...': the presets the runs trained, so a smoke picture
    is not read as E1's; the runs not comparable to P are named as such."""
    presets = sorted({str(r.get("preset") or "unknown-preset") for r in runs})
    title = f"{' + '.join(presets)} runs: " + ", ".join(r["run"] for r in runs)
    apart = [r["run"] for r in runs if not r.get("comparable", True)]
    return title + (f" ({NOT_COMPARABLE}: {', '.join(apart)})" if apart else "")


def _curves(ax, runs, curves, per_step, x_is_samples, xlabel, title, empty, **title_kw) -> bool:
    """One line per run that has points (`curves[i]`: [(step, value)]); False when none has."""
    drawn = False
    for row, pts, ps in zip(runs, curves, per_step, strict=True):
        if pts:
            i = [r for r in runs if r["arm"] == row["arm"]].index(row)  # its arm's i-th run
            ax.plot([s * ps if x_is_samples else s for s, _ in pts], [v for _, v in pts],
                    label=_label(row), color=ARM_COLOURS.get(row["arm"], "grey"),
                    linestyle=LINESTYLES[i % len(LINESTYLES)])
            drawn = True
    ax.set_title(title, **title_kw)
    ax.set_xlabel(xlabel)
    ax.grid(alpha=0.3)
    if not drawn:
        ax.text(0.5, 0.5, empty, ha="center", va="center", transform=ax.transAxes, fontsize=9,
                color="grey")
    return drawn


def _loss_panel(ax, runs, scalars, per_step, x_is_samples, xlabel) -> None:
    if _curves(ax, runs, [sc.get("train/loss") for sc in scalars], per_step, x_is_samples, xlabel,
               "training loss (distillation: NCE + MSE)", "no train/loss scalars in the runs' tb/"):
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    ax.set_ylabel("loss (log scale)")


def _capability_panel(ax, report, runs) -> None:
    """Capability per arm and seed; runs not comparable to P on a panel of their own."""
    show_published = any(r["kind"] == "published" for r in report["rows"]) or \
        any(r.get("preset") == "e1" for r in runs)
    pub = [r for r in report["rows"] if r["kind"] == "published"] or \
        (published.reference_rows() if show_published else [])
    near = [r for r in runs if r.get("comparable", True)]
    apart = [r for r in runs if not r.get("comparable", True)]
    if not apart:
        _capability_axes(ax, near, pub, "capability (mean STS Spearman) per arm and seed")
        return
    if not near and not pub:
        _capability_axes(ax, apart, [], f"capability: {NOT_COMPARABLE} (own scale)", apart=True)
        return
    fig, spec = ax.figure, ax.get_subplotspec().subgridspec(1, 2, wspace=0.15)
    ax.remove()
    _capability_axes(fig.add_subplot(spec[0]), near, pub, "comparable to P\n(published scale)")
    _capability_axes(fig.add_subplot(spec[1]), apart, [], f"{NOT_COMPARABLE}\n(own scale)", apart=True)


def _capability_axes(ax, runs, pub, title: str, apart: bool = False) -> None:
    arms = [a for a in ARM_ORDER if any(r["arm"] == a for r in runs)]
    arms += sorted({r["arm"] for r in runs} - set(arms))
    arms = list(dict.fromkeys(arms + [r["arm"] for r in pub]))
    labelled = False
    marker = "D" if apart else "o"  # diamonds: never mistaken for runs on the published scale
    for i, arm in enumerate(arms):
        group = [r for r in runs if r["arm"] == arm]
        for j, r in enumerate(group):
            x = i + (j - (len(group) - 1) / 2) * 0.15
            ax.plot([x], [r["capability"]], marker, color=ARM_COLOURS.get(arm, "grey"), markersize=8,
                    label=(NOT_COMPARABLE if apart and not labelled else None))
            labelled = labelled or apart
            if r.get("capability_dispatch_off") is not None:
                ax.plot([x], [r["capability_dispatch_off"]], marker, mfc="none",
                        color=ARM_COLOURS.get(arm, "grey"), markersize=8)
            ax.annotate(f"s{r['seed']} ({r.get('basis', '?')})", (x, r["capability"]),
                        textcoords="offset points", xytext=(6, 4), fontsize=8)
        for j, r in enumerate(p for p in pub if p["arm"] == arm):
            ax.plot([i + 0.3 + 0.08 * j], [r["capability"]], "x", color="black", markersize=8,
                    label=None if labelled else "published E1 runs (basis P)")
            labelled = True
    split = "\n" in title  # one of two half-width panels: short arm names, own y axis side
    ax.set_xticks(range(len(arms)), [a.split("_")[0] for a in arms] if split else arms)
    ax.set_xlim(-0.6, len(arms) - 0.2)
    ax.set_title(title, fontsize=10)
    if apart and split:
        ax.yaxis.tick_right()  # its own scale, away from the published one
    else:
        ax.set_ylabel("Spearman (filled: dispatch on, open: off)")
    if labelled:
        ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3, axis="y")


def _health_panel(ax, gauge, title, runs, scalars, per_step, x_is_samples, xlabel) -> None:
    if _curves(ax, runs, [_layer_mean(sc, gauge) for sc in scalars], per_step, x_is_samples,
               xlabel, f"bank health (mean over layers)\n{title}",
               "no bank arm (a1/a3) with health scalars", fontsize=10):
        ax.legend(fontsize=8)


def _layer_mean(scalars: dict, gauge: str) -> list:
    """[(step, mean over layers)] of a run's `health/layerNN/<gauge>`; [] when it has none."""
    by_step: dict[int, list[float]] = defaultdict(list)
    for tag, pts in scalars.items():
        if tag.startswith("health/layer") and tag.rsplit("/", 1)[-1] == gauge:
            for s, v in pts:
                by_step[s].append(v)
    return sorted((s, sum(v) / len(v)) for s, v in by_step.items())


def write_png(report: dict, run_dirs: list[Path], path: Path) -> Path:
    atomic_write_bytes(Path(path), render_png(report, run_dirs))
    return Path(path)
