"""`aleph runs diff A B`: is run B equivalent to run A? The seed's argument, made mechanical.

Five sections are compared from the run directories' own files (manifest.json,
config.json, launches/*.log): environment, code, config, target store, launches. Every
finding has a level:
- same / info: nothing that can change what the run computed;
- caveat: a difference that is named in the verdict (the reader judges it; e.g. a
  changed code revision, a resumed run, a launch log without its header);
- blocker: a difference that changes what was computed (torch/CUDA/cuDNN/Python, a
  training hyper-parameter, different target contents).
Verdict: "not equivalent" if any blocker, else "equivalent with caveats" if any caveat,
else "equivalent". The arm and seed are the experiment's variables: they are reported,
never held against equivalence (the seed compares a1, a2 and a3 runs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from aleph.eval import rundir
from aleph.report import launches, store_diff
from aleph.report.gitdiff import CodeDiff, HunksUnavailable, diff_revisions
from aleph.train.config import ADDED_FIELDS, RESUMABLE_CHANGES, with_added_fields

LEVELS = ("same", "info", "caveat", "blocker")


@dataclass
class Finding:
    section: str
    level: str
    text: str


@dataclass
class RunDiff:
    a: str
    b: str
    findings: list[Finding] = field(default_factory=list)
    code_diff: CodeDiff | None = None

    def add(self, section: str, level: str, text: str) -> None:
        assert level in LEVELS, level  # programming error, not user input
        self.findings.append(Finding(section, level, text))

    @property
    def caveats(self) -> list[str]:
        return [f.text for f in self.findings if f.level == "caveat"]

    @property
    def blockers(self) -> list[str]:
        return [f.text for f in self.findings if f.level == "blocker"]

    @property
    def verdict(self) -> str:
        if self.blockers:
            return "not equivalent"
        return "equivalent with caveats" if self.caveats else "equivalent"


# --- environment --------------------------------------------------------------------------

# Facts that change numerics or torch semantics (the seed's torch-2.4 laws): a blocker.
ENV_BLOCKING = ("torch", "cuda", "cudnn", "triton")
# Facts that are worth naming but do not by themselves change the computation.
ENV_CAVEAT = ("compiler", "driver", "variant")


def _v(value) -> str:
    return "not present" if value is None else str(value)


def _minor(version) -> str:
    return ".".join(str(version).split(".")[:2])


def compare_environment(d: RunDiff, ea: dict, eb: dict) -> None:
    s = "environment"
    pa, pb = ea.get("python"), eb.get("python")
    if pa == pb:
        d.add(s, "same", f"Python {pa}")
    elif _minor(pa) != _minor(pb):
        d.add(s, "blocker", f"Python {pa} vs {pb}")
    else:
        d.add(s, "caveat", f"Python patch level differs: {pa} vs {pb}")
    for key in ENV_BLOCKING:
        va, vb = ea.get(key), eb.get(key)
        d.add(s, "same" if va == vb else "blocker", f"{key} {_v(va)}" if va == vb else f"{key} {_v(va)} vs {_v(vb)}")
    for key in ENV_CAVEAT:
        va, vb = ea.get(key), eb.get(key)
        d.add(s, "same" if va == vb else "caveat", f"{key} {_v(va)}" if va == vb else f"{key} {_v(va)} vs {_v(vb)}")
    _compare_gpus(d, ea.get("gpus") or [], eb.get("gpus") or [])
    _compare_packages(d, ea, eb)


def _gpu_names(gpus: list) -> str:
    names = [g.get("name", "?") for g in gpus]
    return ", ".join(f"{names.count(n)} x {n}" for n in sorted(set(names))) or "no GPU"


def _compare_gpus(d: RunDiff, ga: list, gb: list) -> None:
    na, nb = _gpu_names(ga), _gpu_names(gb)
    if na != nb:
        d.add("environment", "caveat", f"GPUs {na} vs {nb}")
        return
    ua = sorted(g.get("uuid") or "" for g in ga)
    ub = sorted(g.get("uuid") or "" for g in gb)
    d.add("environment", "same" if ua == ub else "info",
          f"GPUs {na}" + ("" if ua == ub else " (same model, different physical devices)"))


def _compare_packages(d: RunDiff, ea: dict, eb: dict) -> None:
    fa, fb = ea.get("freeze_sha256"), eb.get("freeze_sha256")
    if fa is not None and fa == fb:
        d.add("environment", "same", f"package set identical (freeze sha256 {fa[:12]})")
        return
    pa, pb = ea.get("packages") or {}, eb.get("packages") or {}
    changed = sorted(n for n in set(pa) | set(pb) if pa.get(n) != pb.get(n))
    d.add("environment", "info", f"freeze sha256 {str(fa)[:12]} vs {str(fb)[:12]}: "
          f"{len(changed)} package(s) differ")
    for name in changed:
        if name in ENV_BLOCKING:
            continue  # already judged above from the runtime facts
        d.add("environment", "caveat", f"package {name} {pa.get(name, 'absent')} vs {pb.get(name, 'absent')}")


# --- code ---------------------------------------------------------------------------------

def compare_code(d: RunDiff, ca: dict, cb: dict, repo: Path | None) -> None:
    s = "code"
    ra, rb = ca.get("revision"), cb.get("revision")
    ha, hb = ca.get("source_sha256"), cb.get("source_sha256")
    if ha and ha == hb:
        level = "same" if ra == rb else "info"
        d.add(s, level, f"identical source (sha256 {ha[:12]})"
              + ("" if ra == rb else f" under revisions {ra} and {rb}"))
        return
    d.add(s, "caveat", f"code differs: A executed {ra} (source {str(ha)[:12]}), "
          f"B executed {rb} (source {str(hb)[:12]})")
    for who, rev in (("A", ra), ("B", rb)):
        if str(rev).endswith("-dirty"):
            d.add(s, "caveat", f"{who} ran from a modified working tree ({rev}): its exact source has no revision")
    clean = [str(r).removesuffix("-dirty") for r in (ra, rb)]
    if any(c in ("unknown", "None", "") for c in clean):
        d.add(s, "info", "hunks not shown: a run records no code revision (neither an image "
              "REVISION nor a git checkout); only the source hashes compare")
        return
    if clean[0] == clean[1]:
        d.add(s, "info", f"same base revision {clean[0][:12]}: the difference is in uncommitted "
              "changes, which no checkout holds (compare the source hashes)")
        return
    try:
        cd = diff_revisions(repo, *clean)
    except HunksUnavailable as e:  # one line: no git here, no checkout, revision not in it
        d.add(s, "info", str(e))
        return
    d.code_diff = cd
    d.add(s, "info", f"{clean[0][:12]} -> {clean[1][:12]}: {len(cd.files)} file(s) of the "
          f"executed package (aleph/), {cd.lines_changed} line(s) changed")
    for f in cd.files:
        counts = "binary" if f.added is None else f"+{f.added} -{f.removed}"
        d.add(s, "info", f"  {f.path} ({counts}; {len(f.hunks)} hunk(s))")


# --- config -------------------------------------------------------------------------------

INTENDED = ("arm", "seed")  # the experiment's variables
LABELS = ("preset",)  # recorded names, not interpreted by the trainer
# Fields that the trainer itself lets change between launches of one run because they do
# not change what is computed (aleph.train.config.RESUMABLE_CHANGES is the source).
_RESUMABLE = RESUMABLE_CHANGES
HOLDING = ("store_implementation",)  # how targets are held: judged in the target section
# Where the data was read from: a path or name differs between machines (a replication on
# another host), while the contents are judged by content keys in the targets section
# (target store content hash; token store key = captions content, tokenizer, max_len).
SOURCES = ("captions", "captions_column", "targets", "tokenizer")


def _flatten(obj, prefix="") -> dict:
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: obj}


def compare_config(d: RunDiff, ca: dict, cb: dict) -> None:
    """Every differing field is a blocker unless it is classed above. A field that a config
    predates (ADDED_FIELDS, e.g. `init`) counts as the value that run ran with, and says so:
    a run initialised normal_0.02 before the field existed is not equivalent to an
    e1_orthogonal one, and is equivalent to a later normal_0.02 one."""
    s = "config"
    fa, fb = _flatten(with_added_fields(ca)), _flatten(with_added_fields(cb))
    differing = sorted(k for k in set(fa) | set(fb) if fa.get(k, ...) != fb.get(k, ...))
    for key in differing:
        va, vb = fa.get(key, "absent"), fb.get(key, "absent")
        text = f"{key}: {va!r} vs {vb!r}"
        implied = [who for who, c in (("A", ca), ("B", cb)) if key in ADDED_FIELDS and key not in c]
        if implied:
            text += (f" ({' and '.join(implied)} recorded no {key}: its config predates the "
                     f"field, so it ran {ADDED_FIELDS[key]!r})")
        if key in INTENDED:
            d.add(s, "info", f"{text} (experiment variable)")
        elif key in LABELS:
            d.add(s, "info", f"{text} (a label only)")
        elif key in HOLDING:
            d.add(s, "info", f"{text} (see target store)")
        elif key in SOURCES:
            d.add(s, "info", f"{text} (a data location: contents judged in the targets section)")
        elif key in _RESUMABLE:
            d.add(s, "info", f"{text} (does not change what is computed)")
        else:
            d.add(s, "blocker", text)
    if not [k for k in differing if k not in INTENDED]:
        d.add(s, "same", f"{len(fa)} fields identical apart from the experiment variables")


# --- top level ----------------------------------------------------------------------------

def diff_runs(run_a: str | Path, run_b: str | Path, repo: Path | None = None) -> RunDiff:
    run_a, run_b = rundir.require_run_dir(run_a), rundir.require_run_dir(run_b)
    ma = rundir.read_run_json(run_a, rundir.MANIFEST)
    mb = rundir.read_run_json(run_b, rundir.MANIFEST)
    ca = rundir.read_run_json(run_a, rundir.CONFIG)
    cb = rundir.read_run_json(run_b, rundir.CONFIG)
    d = RunDiff(rundir.run_label(run_a, ma), rundir.run_label(run_b, mb))
    src_a, src_b = str(run_a / rundir.MANIFEST), str(run_b / rundir.MANIFEST)
    compare_environment(d, rundir.field(ma, "environment", src_a, kind=dict),
                        rundir.field(mb, "environment", src_b, kind=dict))
    compare_code(d, rundir.manifest_code(ma), rundir.manifest_code(mb), repo)
    compare_config(d, ca, cb)
    ta, tb = rundir.manifest_targets(ma, src_a), rundir.manifest_targets(mb, src_b)
    for level, text in store_diff.compare_targets(ta, tb):
        d.add("targets", level, text)
    sources_differ = any(_flatten(ca).get(k) != _flatten(cb).get(k) for k in SOURCES)
    for level, text in store_diff.compare_tokens(ta, tb, sources_differ):
        d.add("targets", level, text)
    for who, run, m in (("A", run_a, ma), ("B", run_b, mb)):
        for level, text in launches.check_launches(run, m):
            d.add("launches", level, f"{who}: {text}")
    return d
