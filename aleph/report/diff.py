"""`aleph runs diff A B`: is run B equivalent to run A?

Sections compared from the run directories' own files: environment, envelope, execution,
code, config, target store, launches, plus "vs E1" (aleph.report.comparability), which is
information only. A run is represented by the first launch that trained steps it kept
(aleph.record.launch); each later such launch is compared with its run's first, naming its
step range. Levels: same/info (cannot change what was computed), caveat (named in the
verdict for the reader to judge), blocker (changes what was computed: torch/CUDA/Python,
a hyper-parameter, target contents). Verdict: "not equivalent" with any blocker, else
"equivalent with caveats" with any caveat, else "equivalent". Arm and seed are the
experiment's variables: reported, never held against equivalence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from aleph.errors import DataError
from aleph.eval import rundir
from aleph.record.executed import read_executed
from aleph.record.launch import (
    NUMERIC_CONFIG_FIELDS,
    NUMERIC_FACTS,
    LaunchRecord,
    reference_launch,
    training_launches,
)
from aleph.report import code_compare, comparability, launches, store_diff
from aleph.report.gitdiff import CodeDiff
from aleph.train.config import RESUMABLE_CHANGES, RETIRED

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

    def adder(self, section: str):
        """add(level, text) into `section`."""
        return lambda level, text: self.add(section, level, text)

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


def _same_or(level: str, name: str, va, vb) -> tuple[str, str]:
    """('same', 'name va') when equal, else (level, 'name va vs vb')."""
    return ("same", f"{name} {_v(va)}") if va == vb else (level, f"{name} {_v(va)} vs {_v(vb)}")


def _minor(version) -> str:
    return ".".join(str(version).split(".")[:2])


def _environment(ref, source: str) -> dict:
    """The environment the reference launch recorded; its absence is an error naming it."""
    if ref is None or not ref.environment:
        raise DataError(f"{source}: missing field "
                        f"'launches[{ref.index - 1 if ref else 0}].environment'")
    return ref.environment


def compare_environment(add, ea: dict, eb: dict) -> None:
    pa, pb = ea.get("python"), eb.get("python")
    if pa == pb:
        add("same", f"Python {pa}")
    elif _minor(pa) != _minor(pb):
        add("blocker", f"Python {pa} vs {pb}")
    else:
        add("caveat", f"Python patch level differs: {pa} vs {pb}")
    for key in (*ENV_BLOCKING, *ENV_CAVEAT):
        level = "blocker" if key in ENV_BLOCKING else "caveat"
        add(*_same_or(level, key, ea.get(key), eb.get(key)))
    _compare_gpus(add, ea.get("gpus") or [], eb.get("gpus") or [])
    _compare_packages(add, ea, eb)


def _gpu_names(gpus: list) -> str:
    names = [g.get("name", "?") for g in gpus]
    return ", ".join(f"{names.count(n)} x {n}" for n in sorted(set(names))) or "no GPU"


def _compare_gpus(add, ga: list, gb: list) -> None:
    na, nb = _gpu_names(ga), _gpu_names(gb)
    if na != nb:
        add("caveat", f"GPUs {na} vs {nb}")
        return
    ua = sorted(g.get("uuid") or "" for g in ga)
    ub = sorted(g.get("uuid") or "" for g in gb)
    add("same" if ua == ub else "info",
        f"GPUs {na}" + ("" if ua == ub else " (same model, different physical devices)"))


def _compare_packages(add, ea: dict, eb: dict) -> None:
    fa, fb = ea.get("freeze_sha256"), eb.get("freeze_sha256")
    if fa is not None and fa == fb:
        add("same", f"package set identical (freeze sha256 {fa[:12]})")
        return
    pa, pb = ea.get("packages") or {}, eb.get("packages") or {}
    changed = sorted(n for n in set(pa) | set(pb) if pa.get(n) != pb.get(n))
    add("info", f"freeze sha256 {str(fa)[:12]} vs {str(fb)[:12]}: {len(changed)} package(s) "
        "differ")
    for name in changed:
        if name in ENV_BLOCKING:
            continue  # already judged above from the runtime facts
        add("caveat", f"package {name} {pa.get(name, 'absent')} vs {pb.get(name, 'absent')}")


# --- envelope -------------------------------------------------------------------------------

# Limits a replication must match (the seed: "any rig sized against that law wants the exact
# byte value"): a caveat when they differ. Placement facts: named, not held against it.
ENVELOPE_CAVEAT = {"memory_limit_bytes": "memory limit (bytes)", "cpu_cores": "CPU quota (cores)"}
ENVELOPE_INFO = {"cpuset": "cpuset", "numa_nodes": "NUMA nodes", "cgroup_version": "cgroup version"}


def _gpu_memory(env: dict) -> list:
    return sorted((g.get("name"), g.get("memory_mib")) for g in env.get("gpus") or [])


def _unrecorded(xa, xb, la: str, lb: str) -> str:
    """Who of the two launches did not record it ('' when both did)."""
    return " and ".join(w for w, x in ((la, xa), (lb, xb)) if x is None)


def compare_envelope(add, ea: dict | None, eb: dict | None, la: str = "A", lb: str = "B") -> None:
    """The resource envelopes two launches ran in (aleph.record.provenance.envelope)."""
    if who := _unrecorded(ea, eb, la, lb):
        add("info", f"envelope not recorded by {who} (a launch from before per-launch records)")
        return
    for key, name in ENVELOPE_CAVEAT.items():
        va, vb = ea.get(key), eb.get(key)
        if va == vb:
            add("same", f"{name} {_fmt(va)}")
        else:
            add("caveat", f"{name} {_fmt(va)} vs {_fmt(vb)}: a different resource envelope "
                "(what fits in memory, how many cores)")
    if _gpu_memory(ea) != _gpu_memory(eb):
        add("caveat", f"GPU memory {_gpu_memory(ea)} vs {_gpu_memory(eb)}")
    for key, name in ENVELOPE_INFO.items():
        add(*_same_or("info", name, ea.get(key), eb.get(key)))


def _fmt(value) -> str:
    if value is None:
        return "none (no limit)"
    return f"{value:,}" if isinstance(value, int) else str(value)


# --- execution --------------------------------------------------------------------------------

def compare_execution(add, xa: dict | None, xb: dict | None, la: str = "A", lb: str = "B") -> None:
    """What each launch executed with that changes the floating-point result
    (aleph.record.launch.NUMERIC_FACTS): any difference is a caveat, with the reason."""
    if who := _unrecorded(xa, xb, la, lb):
        add("info", f"execution facts not recorded by {who} (a launch from before per-launch "
            "records): see the config section")
        return
    for key, why in NUMERIC_FACTS.items():
        level, text = _same_or("caveat", key, xa.get(key), xb.get(key))
        add(level, text if level == "same" else f"{text}: not bitwise comparable: {why}")


# --- code ---------------------------------------------------------------------------------

def compare_code(d: RunDiff, ca: dict, cb: dict, repo: Path | None, la: str, lb: str,
                 run_a: Path, run_b: Path) -> None:
    """Two launches' code records, with their executed-code records when they have them
    (aleph.report.code_compare)."""
    (exec_a, why_a), (exec_b, why_b) = read_executed(run_a, ca), read_executed(run_b, cb)
    cd = code_compare.compare_code(d.adder("code"), ca, cb, repo, la, lb, exec_a, exec_b,
                                   why_a, why_b)
    if cd is not None and d.code_diff is None:
        d.code_diff = cd


# --- config -------------------------------------------------------------------------------

INTENDED = ("arm", "seed")  # the experiment's variables
LABELS = ("preset",)  # recorded names, not interpreted by the trainer
HOLDING = ("store_implementation",)  # how targets are held: judged in the target section
# Where the data was read from: a path or name differs between machines (a replication on
# another host), while the contents are judged by content keys in the targets section
# (target store content hash; token store key = captions content, tokenizer, max_len).
SOURCES = ("captions", "captions_column", "targets", "tokenizer")
_CONFIG_INFO = ((INTENDED, "experiment variable"), (LABELS, "a label only"),
                (HOLDING, "see target store"),
                (SOURCES, "a data location: contents judged in the targets section"),
                # fields the trainer itself lets change between launches of one run
                (RESUMABLE_CHANGES, "does not change what is computed"),
                (RETIRED, "a field since removed; it changed nothing computed"))


def _flatten(obj, prefix="") -> dict:
    if not isinstance(obj, dict):
        return {prefix[:-1]: obj}
    return {k: v for key, val in obj.items() for k, v in _flatten(val, f"{prefix}{key}.").items()}


def compare_config(d: RunDiff, ca: dict, cb: dict, executed: bool = False) -> None:
    """Every differing field is a blocker unless classed above. A field that changes the
    floating-point result is a caveat "not bitwise comparable", or info when both runs
    recorded what they executed (`executed`: judged in the execution section)."""
    s = "config"
    fa, fb = _flatten(ca), _flatten(cb)
    differing = sorted(k for k in set(fa) | set(fb) if fa.get(k, ...) != fb.get(k, ...))
    for key in differing:
        va, vb = fa.get(key, "absent"), fb.get(key, "absent")
        text = f"{key}: {va!r} vs {vb!r}"
        fact = NUMERIC_CONFIG_FIELDS.get(key)
        why = next((why for names, why in _CONFIG_INFO if key in names), None)
        if fact is not None and executed:
            d.add(s, "info", f"{text} (judged from what each launch executed: {fact} in "
                  "the execution section)")
        elif fact is not None:
            d.add(s, "caveat", f"{text}: not bitwise comparable: {NUMERIC_FACTS[fact]}")
        elif why is not None:
            d.add(s, "info", f"{text} ({why})")
        else:
            d.add(s, "blocker", text)
    if not [k for k in differing if k not in INTENDED]:
        d.add(s, "same", f"{len(fa)} fields identical apart from the experiment variables")


# --- top level ----------------------------------------------------------------------------

def _label(who: str, r: LaunchRecord | None, manifest: dict) -> str:
    """'A' or, when the run's kept launches ran several sources, 'A launch 1 (...)'."""
    several = len({x.code.get("source_sha256") for x in training_launches(manifest)}) > 1
    return f"{who} {r.label()}" if several and r is not None else who


def _lift(d: RunDiff, section: str, prefix: str, compare, a: dict, b: dict) -> None:
    """Run compare(add, a, b) aside and keep its differences in `section`, prefixed."""
    found: list[tuple[str, str]] = []
    compare(lambda level, text: found.append((level, text)), a, b)
    for level, text in found:
        if level != "same":
            d.add(section, level, f"{prefix}{text}")


def _within_run(d: RunDiff, who: str, run: Path, manifest: dict, repo: Path | None) -> None:
    """Each later launch that trained steps, against the run's first: code, environment,
    envelope, execution changes name the launch and its step range."""
    ref, *later = training_launches(manifest) or [None]
    for r in later:
        la, lb = f"{who} {ref.label()}", f"{who} {r.label()}"
        if r.code.get("source_sha256") != ref.code.get("source_sha256"):
            compare_code(d, ref.code, r.code, repo, la, lb, run, run)
        for section, compare in (("environment", compare_environment),
                                 ("envelope", compare_envelope), ("execution", compare_execution)):
            a, b = getattr(ref, section), getattr(r, section)
            if a and b and a != b:  # equal records: nothing to report
                _lift(d, section, f"{lb} vs {la}: ", compare, a, b)


def diff_runs(run_a: str | Path, run_b: str | Path, repo: Path | None = None) -> RunDiff:
    run_a, run_b = rundir.require_run_dir(run_a), rundir.require_run_dir(run_b)
    ma, mb = (rundir.read_run_json(r, rundir.MANIFEST) for r in (run_a, run_b))
    ca, cb = (rundir.read_run_json(r, rundir.CONFIG) for r in (run_a, run_b))
    d = RunDiff(rundir.run_label(run_a, ma), rundir.run_label(run_b, mb))
    src_a, src_b = str(run_a / rundir.MANIFEST), str(run_b / rundir.MANIFEST)
    # Each run through the first launch whose steps it kept (the record of that launch;
    # for a manifest from before per-launch records, its top-level record).
    ref_a, ref_b = reference_launch(ma), reference_launch(mb)
    la, lb = _label("A", ref_a, ma), _label("B", ref_b, mb)
    compare_environment(d.adder("environment"), _environment(ref_a, src_a),
                        _environment(ref_b, src_b))
    compare_envelope(d.adder("envelope"), ref_a.envelope if ref_a else None,
                     ref_b.envelope if ref_b else None)
    xa, xb = (ref_a.execution if ref_a else None), (ref_b.execution if ref_b else None)
    compare_execution(d.adder("execution"), xa, xb)
    compare_code(d, ref_a.code if ref_a else {}, ref_b.code if ref_b else {}, repo, la, lb,
                 run_a, run_b)
    for who, run, m in (("A", run_a, ma), ("B", run_b, mb)):
        _within_run(d, who, run, m, repo)
    compare_config(d, ca, cb, executed=xa is not None and xb is not None)
    ta, tb = rundir.manifest_targets(ma, src_a), rundir.manifest_targets(mb, src_b)
    sources_differ = any(_flatten(ca).get(k) != _flatten(cb).get(k) for k in SOURCES)
    for level, text in [*store_diff.compare_targets(ta, tb),
                        *store_diff.compare_tokens(ta, tb, sources_differ)]:
        d.add("targets", level, text)
    for who, run, m in (("A", run_a, ma), ("B", run_b, mb)):
        for level, text in launches.check_launches(run, m):
            d.add("launches", level, f"{who}: {text}")
    for who, run, c, m in (("A", run_a, ca, ma), ("B", run_b, cb, mb)):
        ev = rundir.read_run_json(run, rundir.EVAL, required=False)
        judged = comparability.judge(c, ev, m)
        tasks = "" if ev is not None else " (not evaluated: tasks not judged)"
        d.add("vs E1", "info", f"{who}: {judged['text']}{tasks}")
    return d

