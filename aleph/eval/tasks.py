"""The STS tasks capability is measured on, and where their pairs come from.

A task is a list of (sentence_a, sentence_b, gold) pairs, from the first source that has
it: a local `<tasks_dir>/<name>.tsv` (header `sentence1<TAB>sentence2<TAB>score`) or
`.jsonl` (keys `sentence1`, `sentence2`, `score`); `smoke` (the smoke grammar); the offline
bundle (`aleph data fetch`); the hub's pinned test split through `datasets` (HF_TASKS),
cached under `<work root>/cache/hf`. Gold scores are any real numbers (Spearman uses only
their order), so each set's published scale is used as is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from aleph._io import sha256_bytes, sha256_json, work_root
from aleph.data.bundle import pairs_jsonl, pinned_sts_sha256
from aleph.errors import DataError

# The 8 tasks of E1 capability, in the order of the published per-task row.
E1_TASKS = ("stsb", "sickr", "sts12", "sts13", "sts14", "sts15", "sts16", "biosses")
DISPLAY = {
    "stsb": "STS-B", "sickr": "SICK-R", "sts12": "STS12", "sts13": "STS13",
    "sts14": "STS14", "sts15": "STS15", "sts16": "STS16", "biosses": "BIOSSES",
}
# The MTEB copies (sentence1, sentence2, score; a `test` split) at the revisions MTEB's own
# task definitions pin (mteb/tasks/sts/eng/*.py, 2.x), so every download holds the same pairs.
HF_TASKS = {
    "stsb": ("mteb/stsbenchmark-sts", "b0fddb56ed78048fa8b90373c8a3cfc37b684831"),
    "sickr": ("mteb/sickr-sts", "20a6d6f312dd54037fe07a32d58e5e168867909d"),
    "sts12": ("mteb/sts12-sts", "a0d554a64d88156834ff5ae9920b964011b16384"),
    "sts13": ("mteb/sts13-sts", "7e90230a92c190f1bf69ae9002b8cea547a64cca"),
    "sts14": ("mteb/sts14-sts", "6031580fec1f6af667f0bd2da0a551cf4f0b2375"),
    "sts15": ("mteb/sts15-sts", "ae752c7c21bf194d8b67fd573edf7ae58183cbe3"),
    "sts16": ("mteb/sts16-sts", "4d8694f8f0e0100860b497b999b3dbed754a0513"),
    "biosses": ("mteb/biosses-sts", "d3fb88f8f02e40887cd149695127462bbcf29b4a"),
}
# Pairs of each task's test split at the pinned revision (MTEB's copies; E1-FACTS.md): a
# task with another count is not the E1 task, whatever its file is called.
E1_PAIRS = {"stsb": 1379, "sickr": 9927, "sts12": 3108, "sts13": 1500, "sts14": 3750,
            "sts15": 3000, "sts16": 1186, "biosses": 100}
TASK_FILES = ", ".join(f"{n}.tsv|.jsonl" for n in E1_TASKS)
"""The eight file names `--tasks-dir` is searched for, as errors and help name them."""
SMOKE_PAIRS = 256  # enough pairs that a trained/untrained gap is not noise
SMOKE_SEED = 0


@dataclass(frozen=True)
class STSTask:
    name: str
    pairs: tuple[tuple[str, str, float], ...]
    source: str  # where the pairs came from (file, dataset id, or "smoke grammar")

    @property
    def fingerprint(self) -> str:
        """sha256 of the pairs themselves, so two evaluations can be shown to share data."""
        return sha256_json([list(p) for p in self.pairs])

    @property
    def sha256(self) -> str:
        """sha256 of the pairs as the offline bundle writes them (`pairs_jsonl`): a bundle
        file's recorded sha256, and equal for a .tsv or .jsonl file holding the same pairs."""
        return sha256_bytes(pairs_jsonl(self.pairs).encode("utf-8"))


def e1_task_check(task: STSTask) -> str | None:
    """None when `task` is the E1 task of its name (E1's pair count, from the pinned hub or
    bundle copy or a local file of the same pairs sha256 as the bundle's); else why not."""
    expected = E1_PAIRS.get(task.name)
    if expected is None:
        return f"{task.name} is not one of the 8 E1 tasks"
    dataset, revision = HF_TASKS[task.name]
    pin = f"{dataset}@{revision[:12]}"
    if len(task.pairs) != expected:
        return (f"{task.source} has {len(task.pairs):,} pairs, the E1 test split ({pin}) has "
                f"{expected:,}")
    if task.source in (f"hf:{pin}:test", f"bundle:{pin}:test"):
        return None
    pinned = pinned_sts_sha256(task.name, dataset, revision)
    if pinned is None:
        return (f"{task.source}: a local file, its pairs not checked against the pin (no offline "
                f"bundle records {task.name} of {pin}; `aleph data fetch` makes one)")
    if task.sha256 != pinned:
        return (f"{task.source}: pairs sha256 {task.sha256[:12]} differ from the pinned {pin} "
                f"copy's {pinned[:12]} (offline bundle)")
    return None


def parse_task_names(spec: str) -> list[str]:
    """`e1` (the 8 tasks), `smoke`, or a comma list of task names."""
    names: list[str] = []
    for part in (p.strip().lower() for p in spec.split(",")):
        if not part:
            continue
        for name in E1_TASKS if part == "e1" else (part,):
            if name not in names:
                names.append(name)
    if not names:
        raise DataError(f"--tasks {spec!r} names no task (use e1, smoke, or a comma list)")
    return names


def load_tasks(names: list[str], tasks_dir: str | Path | None = None) -> list[STSTask]:
    return [load_task(n, tasks_dir) for n in names]


def load_task(name: str, tasks_dir: str | Path | None = None) -> STSTask:
    readers = ((".tsv", read_tsv), (".jsonl", read_jsonl)) if tasks_dir is not None else ()
    for ext, reader in readers:
        if (path := Path(tasks_dir) / f"{name}{ext}").is_file():
            return STSTask(name, reader(path), f"file:{path.name}")
    if name == "smoke":
        return smoke_task()
    if name in HF_TASKS:
        from aleph.data.bundle import sts_file

        dataset_id, revision = HF_TASKS[name]
        if (path := sts_file(name, dataset_id, revision)) is not None:
            return STSTask(name, read_jsonl(path), f"bundle:{dataset_id}@{revision[:12]}:test")
        return load_hf_task(name)
    where = f" and no {name}.tsv/.jsonl in {tasks_dir}" if tasks_dir else ""
    raise DataError(f"unknown STS task {name!r}{where}; known: {', '.join(E1_TASKS)}, smoke "
                    f"(or pass --tasks-dir with <name>.tsv / <name>.jsonl files; the E1 tasks' "
                    f"files are {TASK_FILES})")


def smoke_task(n: int = SMOKE_PAIRS, seed: int = SMOKE_SEED) -> STSTask:
    from aleph.data import smoke  # deferred: eval of real tasks does not need the grammar

    pairs = tuple((a, b, float(g)) for a, b, g in smoke.sts_pairs(n, seed))
    return STSTask("smoke", _checked(pairs, "smoke grammar"), f"smoke grammar (n={n}, seed={seed})")


def load_hf_task(name: str) -> STSTask:
    dataset_id, revision = HF_TASKS[name]
    cache = work_root() / "cache" / "hf"
    try:
        import datasets

        ds = datasets.load_dataset(dataset_id, split="test", revision=revision, cache_dir=str(cache))
    except Exception as e:  # network, hub or cache failures all end the same way for a user
        from aleph.data.bundle import fetch_hint

        why = " ".join(str(e)[:300].split())
        raise DataError(f"cannot load STS task {name!r} from dataset {dataset_id} (test split, "
                        f"cache {cache}): {type(e).__name__}: {why}. Offline? Run once with "
                        f"network access to fill the cache, give --tasks-dir with a local "
                        f"{name}.tsv / {name}.jsonl, {fetch_hint()}") from e
    if missing := {"sentence1", "sentence2", "score"} - set(ds.column_names):
        raise DataError(f"dataset {dataset_id} lacks columns {sorted(missing)}")
    pairs = tuple((str(a), str(b), float(s))
                  for a, b, s in zip(ds["sentence1"], ds["sentence2"], ds["score"], strict=True))
    return STSTask(name, _checked(pairs, dataset_id), f"hf:{dataset_id}@{revision[:12]}:test")


def fill_bundle(root: Path, tokenizers: list[str], names: list[str], say) -> int:
    """Fill the offline bundle `root` from the hub (`aleph data fetch`): each tokenizer and
    each hub task's test pairs at its pinned revision; returns the bundle's size in bytes."""
    from aleph.data import bundle
    from aleph.data.bundle import TOKENIZER_PINS
    from aleph.data.tokenizer import load_tokenizer, tokenizer_fingerprint

    if unknown := [n for n in names if n not in HF_TASKS]:
        raise DataError(f"--tasks {','.join(names)!r}: {unknown} are not hub tasks; expected "
                        f"names from {', '.join(HF_TASKS)}")
    for name in tokenizers:
        tok = load_tokenizer(name, use_bundle=False)
        fp = tokenizer_fingerprint(tok)
        d, pin = bundle.add_tokenizer(root, name, tok, fp), TOKENIZER_PINS.get(name)
        say(f"tokenizer {name}" + (f"@{pin[:12]}" if pin else " (unpinned)")
            + f": {d} (fingerprint {fp[:16]})")
    for name in names:
        task = load_hf_task(name)  # the loader eval uses without a bundle: same pairs
        dataset, revision = HF_TASKS[name]
        path = bundle.add_sts(root, name, dataset, revision, "test", task.pairs,
                              expected_pairs=E1_PAIRS.get(name))
        say(f"STS {name}: {len(task.pairs)} pairs from {dataset}@{revision[:12]} -> {path}")
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def read_tsv(path: Path) -> tuple[tuple[str, str, float], ...]:
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    if not lines or lines[0].split("\t") != ["sentence1", "sentence2", "score"]:
        raise DataError(f"{path}: line 1 must be the header 'sentence1<TAB>sentence2<TAB>score'")
    pairs = []
    for lineno, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        cols = line.split("\t")
        if len(cols) != 3:
            raise DataError(f"{path}: line {lineno}: expected 3 tab-separated fields, got {len(cols)}")
        pairs.append((cols[0], cols[1], _score(cols[2], path, lineno)))
    return _checked(tuple(pairs), str(path))


def read_jsonl(path: Path) -> tuple[tuple[str, str, float], ...]:
    pairs = []
    for lineno, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: line {lineno}: not JSON ({e.msg})") from e
        for key in ("sentence1", "sentence2", "score"):
            if not isinstance(row, dict) or key not in row:
                raise DataError(f"{path}: line {lineno}: missing field {key!r}")
        pairs.append((str(row["sentence1"]), str(row["sentence2"]), _score(row["score"], path, lineno)))
    return _checked(tuple(pairs), str(path))


def _score(value, path, lineno) -> float:
    try:
        score = float(value)
    except (TypeError, ValueError):
        raise DataError(f"{path}: line {lineno}: field 'score' is not a number: {value!r}") from None
    if score != score:  # NaN cannot be ranked
        raise DataError(f"{path}: line {lineno}: field 'score' is NaN")
    return score


def _checked(pairs: tuple, where: str) -> tuple:
    if len(pairs) < 2:
        raise DataError(f"{where}: an STS task needs at least 2 pairs, got {len(pairs)}")
    if len({p[2] for p in pairs}) < 2:
        raise DataError(f"{where}: all gold scores are equal, Spearman is undefined")
    return pairs
