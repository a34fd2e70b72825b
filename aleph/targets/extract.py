"""`aleph targets extract`: captions -> one fp16 chunk directory per teacher, rows aligned.

Runs in the teacher environment (lockfiles/teachers.txt: transformers 4.x on torch 2.4.1;
`./aleph-dev extract`, or the `extract-targets` compose service); transformers is imported
only inside functions, so importing this module (or `aleph`) never touches it.

Chunk c holds caption rows c*chunk_rows ...; per chunk and teacher: tokenise (truncated to
`max_length`, length-sorted batches so a batch pads little), encode (bf16 on a GPU, fp32 on
CPU), mean-pool the last hidden state over the attention mask in fp32, L2-normalise, write
`OUT/<teacher>/chunk_<c:05d>.npy` in caption order, atomically. A chunk file that exists is
finished and never redone; `extract-plan.json` (aleph.targets.extract_plan) pins what a
resumed run or another shard must match.

`--shard I/N` encodes the chunks with c mod N == I; the shard that finds every chunk in place
writes `extract.json` and prints the consensus command. With several GPUs and no `--shard`,
one shard process per GPU. Any number of SIGTERM/SIGINT is one stop: the chunk being written
is discarded, finished ones kept, one line says which and how to resume, exit 76.

Every teacher directory (local, or a hub snapshot fetched file by file through the checks of
`aleph._hub`) passes `teacher_dir.check_model_dir` before anything of it loads, and every
loader passes `trust_remote_code=False`: no code that came with a teacher ever runs.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from aleph._faults import fault_point
from aleph._io import atomic_write_json, short_repr
from aleph._signals import StopRequested, run_until_stop
from aleph.errors import AlephError, ConfigError, StoreError
from aleph.targets.chunkio import ChunkWriter
from aleph.targets.extract_plan import (
    RESULT_FILE,
    chunk_path,
    missing_chunks,
    n_chunks,
    publish_plan,
)
from aleph.targets.teacher_dir import check_model_dir
from aleph.targets.teachers import (
    ExtractOptions,
    TeacherSpec,
    forward_flops,
    gpu_hours,
    parse_teachers,
)

POOLING = "attention-masked mean of the last hidden state, fp32, then L2-normalised"
NOT_TEACHER_ENV = ("the teacher models do not load in this environment ({why}); extraction "
                   "runs in the teacher set (lockfiles/teachers.txt): ./aleph-dev extract ..., "
                   "or docker compose --profile targets run --rm extract-targets")
_MODEL_FILES = ("config.json", "model.safetensors")
_MAX_MODEL_FILE_BYTES = 4 << 30  # refuse (and never hash) anything larger in a model dir


def _shard(text: str | None) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)/(\d+)", "0/1" if text is None else text)
    if not m or int(m[1]) >= int(m[2]):
        raise ConfigError(f"--shard {text!r}: expected I/N, two integers with 0 <= I < N "
                          "(e.g. 0/3, 1/3, 2/3)")
    return int(m[1]), int(m[2])


def _hub_call(where: str, what: str, call):
    """call(), its failure (unreachable hub, no such repo or revision) one ConfigError line."""
    try:
        return call()
    except AlephError:
        raise
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0]
        raise ConfigError(f"{where}: {what}: {type(e).__name__}: "
                          f"{short_repr(first, 200)}") from None


def _download(spec: TeacherSpec) -> tuple[str, str, str]:
    """(snapshot directory, its blob directory, commit) of a hub teacher: the listing's commit
    and every name it lists checked first (`aleph._hub`), then the top-level *.json, *.txt,
    *.model and model.safetensors fetched one by one at that commit, each answer's ETag and
    commit checked before huggingface_hub makes a path of it."""
    from huggingface_hub import HfApi, hf_hub_download  # the teacher set's hub client

    from aleph._hub import check_commit, check_repo_name, guard_hub

    where = f"teacher {spec.name}@{spec.revision or 'main'}"
    guard_hub()
    info = _hub_call(where, "the hub listing failed",
                     lambda: HfApi().model_info(spec.name, revision=spec.revision))
    commit = check_commit(info.sha, where)
    names = [check_repo_name(s.rfilename, f"{where}@{commit[:12]}") for s in info.siblings or []]
    wanted = [n for n in names if "/" not in n and (n.endswith((".json", ".txt", ".model"))
                                                    or n == "model.safetensors")]
    if "model.safetensors" not in wanted:  # no .bin: torch < 2.6 refuses them
        raise ConfigError(f"{where}: no model.safetensors (pickled .bin weights are not loaded)")
    paths = _hub_call(where, "download failed",
                      lambda: [hf_hub_download(spec.name, n, revision=commit) for n in wanted])
    snapshot = os.path.dirname(paths[0])
    return snapshot, os.path.join(os.path.dirname(os.path.dirname(snapshot)), "blobs"), commit


def resolve(spec: TeacherSpec, known_types: set[str]) -> tuple[str, dict, dict]:
    """(local model directory, its record: name, revision or file hashes, its config.json),
    the directory checked by `teacher_dir.check_model_dir` before anything loads it."""
    if spec.local:
        checked = check_model_dir(spec.name, known_types, hash_limit=_MAX_MODEL_FILE_BYTES)
        if missing := [f for f in _MODEL_FILES if f not in checked.files_sha256]:
            raise ConfigError(f"{spec.name}: local teacher lacks {missing} (a model saved with "
                              "save_pretrained(safe_serialization=True) and its tokenizer)")
        return spec.name, {"name": spec.name, "local": True,
                           "files_sha256": checked.files_sha256}, checked.config
    path, blobs, commit = _download(spec)
    checked = check_model_dir(path, known_types, blobs=blobs, hash_limit=-1)  # the commit names it
    return path, {"name": spec.name, "local": False, "revision": commit}, checked.config


def _load(path: str, config: dict, device: torch.device):
    """(tokenizer, model) of a checked local model directory (`config`: its config.json),
    the model in eval mode on `device`; never runs code of the directory."""
    from transformers import AutoModel, AutoTokenizer  # the teacher environment only

    kind = config.get("model_type")
    extra = {"reference_compile": False} if kind == "modernbert" else {}  # eager, reproducible
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = AutoModel.from_pretrained(path, trust_remote_code=False, local_files_only=True,
                                      torch_dtype=dtype, use_safetensors=True, **extra)
    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=False, local_files_only=True)
    return tok, model.to(device).eval()


@torch.inference_mode()
def encode(tok, model, texts: list[str], max_length: int) -> torch.Tensor:
    """(n, D) float32 L2-normalised mean-pooled embeddings of `texts` (one batch)."""
    dev = next(model.parameters()).device
    b = tok(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    ids, mask = b["input_ids"].to(dev), b["attention_mask"].to(dev)  # (n, L)
    h = model(input_ids=ids, attention_mask=mask).last_hidden_state.float()  # (n, L, D)
    m = mask.unsqueeze(-1).float()  # (n, L, 1)
    pooled = (h * m).sum(1) / m.sum(1).clamp_min(1.0)  # (n, D)
    return torch.nn.functional.normalize(pooled, dim=1)


def encode_chunk(tok, model, texts: list[str], opts: ExtractOptions, writer: ChunkWriter,
                 chunk: int, progress) -> None:
    """Encode one chunk's captions in length-sorted batches into `writer`, caption order;
    on any exception (a stop included) the unfinished chunk's partial file is removed."""
    order = sorted(range(len(texts)), key=lambda i: (-len(texts[i]), i))
    try:
        for s in range(0, len(order), opts.batch_size):
            idx = sorted(order[s:s + opts.batch_size])  # ascending rows: a sequential-ish write
            writer.write(idx, encode(tok, model, [texts[i] for i in idx], opts.max_length))
            progress(len(idx))
            fault_point("extract-batch", chunk)
        writer.commit()
    except BaseException:  # a stop (StopRequested) or an error: no partial file is left
        writer.discard()
        raise


class Progress:
    """Rows encoded so far vs the run's total, with rate and ETA, on stderr every ~10 s."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.t0, self.last = total, 0, time.monotonic(), 0.0

    def __call__(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if now - self.last >= 10 or self.done >= self.total:
            rate = self.done / max(now - self.t0, 1e-9)
            eta = (self.total - self.done) / rate if rate else float("inf")
            print(f"extract: {self.done:,}/{self.total:,} teacher-rows, {rate:,.1f} rows/s, "
                  f"ETA {eta:,.0f} s", file=sys.stderr, flush=True)
            self.last = now


def estimate(configs: list[dict], rows: int, max_length: int, mean_tokens: float,
             tflops: float) -> str:
    """The FLOPs / GPU-hours line printed before a run."""
    full = sum(forward_flops(c, max_length) for c in configs) * rows
    mean = sum(forward_flops(c, max(1, round(mean_tokens))) for c in configs) * rows
    return (f"estimate: {rows:,} rows x {len(configs)} teachers: {full:.3e} FLOP padded to "
            f"{max_length} tokens = {gpu_hours(full, tflops):,.3g} GPU-hours; at the sampled mean "
            f"length {mean_tokens:.1f} tokens {mean:.3e} FLOP = "
            f"{gpu_hours(mean, tflops):,.3g} GPU-hours (at {tflops} TFLOP/s per GPU)")


def _plan(captions: str, rows: int, records: list[dict], opts: ExtractOptions,
          device: torch.device) -> dict:
    return {"format": "aleph-extract", "format_version": 1, "captions": captions, "rows": rows,
            "column": opts.column, "max_length": opts.max_length, "chunk_rows": opts.chunk_rows,
            "pooling": POOLING, "dtype": "float16",
            "precision": "bfloat16" if device.type == "cuda" else "float32",
            "teachers": records}


def command_line(captions: str, out: Path, teachers: str, opts: ExtractOptions,
                 shard: str | None, consensus_out: str | None) -> list[str]:
    """The `aleph targets extract` arguments of this run (a GPU's shard, the resume hint)."""
    argv = ["targets", "extract", "--captions", captions, "--out", str(out), "--teachers",
            teachers]
    for k, v in dataclasses.asdict(opts).items():
        if k not in ("shard", "estimate_only", "consensus_out"):
            argv += [f"--{k.replace('_', '-')}", str(v)]
    argv += ["--shard", shard] if shard else []
    return argv + (["--consensus-out", consensus_out] if consensus_out else [])


def _spawn_shards(argv: list[str], n: int) -> int:
    """One `--shard g/n` process per GPU (CUDA_VISIBLE_DEVICES=g); the worst exit code. On a
    stop each shard is sent one SIGTERM (`docker stop` signals only this process) and
    waited for: each keeps its finished chunks and says so."""
    procs = [subprocess.Popen([sys.executable, "-m", "aleph", *argv, "--shard", f"{g}/{n}"],
                              env={**os.environ, "CUDA_VISIBLE_DEVICES": str(g)})
             for g in range(n)]
    try:
        return max(p.wait() for p in procs)
    except StopRequested:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait()  # the StopFlag ignores further signals: this wait is not cut short
        raise


def run_extract(captions: str, out: str | os.PathLike, teachers: str,
                opts: ExtractOptions, open_captions) -> int:
    """The whole pass (module docstring); exit code 0, or 76 after a stop. `open_captions`
    is aleph.data.captions.open_captions, passed in by the CLI: targets does not import
    data, which reads target chunks for its alignment check."""
    where: dict = {"phase": "setup"}
    out = Path(out).absolute()
    return run_until_stop(  # partial chunks never count
        "targets extract", lambda: _extract(captions, out, teachers, opts, open_captions, where),
        lambda signame: stop_summary(signame, where),
        lambda: command_line(captions, out, teachers, opts, opts.shard, opts.consensus_out))


def stop_summary(signame: str, where: dict) -> str:
    """What a stop kept, read from the disk: the finished chunks of this process's share."""
    if where["phase"] == "setup":
        return f"stopped by {signame} before the plan was written: nothing was written"
    if where["phase"] == "consensus":
        from aleph.targets.consensus import stop_summary as consensus_kept

        return f"every chunk extracted and kept; the consensus {consensus_kept(signame, where['consensus'])}"
    out, mine = where["out"], where["mine"]
    shard, shards = where["shard"]
    scope = f"shard {shard}/{shards}" if shards > 1 else "this run"
    kept = [f"{len(mine) - len(missing_chunks(out, where['plan'], slug, mine))} of {len(mine)} "
            f"chunks of teacher {slug} complete" for slug in where["slugs"]]
    return (f"stopped by {signame}: {scope}: {', '.join(kept)}, kept (a chunk being written "
            "is discarded, never counted)")


def _extract(captions: str, out: Path, teachers: str, opts: ExtractOptions, open_captions,
             where: dict) -> int | str:
    if opts.max_length < 2 or opts.batch_size < 1 or opts.chunk_rows < 1:
        raise ConfigError("--max-length >= 2, --batch-size >= 1 and --chunk-rows >= 1 expected")
    shard, shards = _shard(opts.shard)
    if shards > 1 and opts.consensus_out:
        raise ConfigError("--consensus-out: not with --shard; run `aleph targets consensus` as "
                          "its own step once every shard has finished")
    try:  # before anything is written: the E1 image's transformers 5.x fails on torch 2.4.1
        import transformers.modeling_utils  # noqa: F401  (the module every model class needs)
    except ImportError as e:
        raise ConfigError(NOT_TEACHER_ENV.format(why=str(e).splitlines()[0])) from None
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    src = open_captions(captions, opts.column)
    rows = src.count_rows()
    if rows == 0:
        raise StoreError(f"captions {captions}: no rows")
    specs = parse_teachers(teachers)
    known = set(CONFIG_MAPPING_NAMES)  # the model types this transformers can configure
    resolved = [resolve(s, known) for s in specs]  # every directory checked before any loads
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    plan = _plan(captions, rows, [r for _, r, _ in resolved], opts, device)
    from transformers import AutoTokenizer  # the teacher environment only

    sample = src.head(1024)
    toks = [AutoTokenizer.from_pretrained(p, trust_remote_code=False, local_files_only=True)
            for p, _, _ in resolved]
    mean_tokens = sum(len(t(c, truncation=True, max_length=opts.max_length)["input_ids"])
                      for t in toks for c in sample) / (len(sample) * len(toks))
    print(estimate([c for _, _, c in resolved], rows, opts.max_length, mean_tokens, opts.assume_tflops),
          file=sys.stderr, flush=True)
    if opts.estimate_only:
        return 0
    publish_plan(out, plan)
    total = n_chunks(plan)
    n_gpu = torch.cuda.device_count()
    spawn = opts.shard is None and n_gpu > 1
    mine = [c for c in range(total) if spawn or c % shards == shard]
    where.update(phase="chunks", out=out, plan=plan, mine=mine, shard=(shard, shards),
                 slugs=[s.slug for s in specs])
    if spawn:
        rc = _spawn_shards(command_line(captions, out, teachers, opts, None, None), n_gpu)
        return rc or _finish(out, plan, specs, opts.consensus_out, where)
    todo = {c: [i for i, s in enumerate(specs) if not chunk_path(out, s.slug, c).is_file()]
            for c in mine}
    left = sum(min(opts.chunk_rows, rows - c * opts.chunk_rows) * len(t) for c, t in todo.items())
    print(f"extract: {len(mine)} chunks of {total} in this process, "
          f"{sum(len(t) == 0 for t in todo.values())} already done", file=sys.stderr)
    progress = Progress(left)
    models: dict[int, tuple] = {}
    for s in specs:
        (out / s.slug).mkdir(exist_ok=True)
    c, buf = 0, []
    for batch in src.batches():
        buf += batch
        while len(buf) >= opts.chunk_rows or (buf and c == total - 1
                                              and len(buf) == rows - c * opts.chunk_rows):
            texts, buf = buf[:opts.chunk_rows], buf[opts.chunk_rows:]
            for i in todo.get(c, []):
                if i not in models:
                    models[i] = _load(resolved[i][0], resolved[i][2], device)
                dim = models[i][1].config.hidden_size
                writer = ChunkWriter(str(chunk_path(out, specs[i].slug, c)), len(texts), dim)
                encode_chunk(*models[i], texts, opts, writer, c, progress)
            c += 1
    if c != total:
        raise StoreError(f"captions {captions}: read {c} chunks, expected {total} "
                         f"({rows:,} rows counted): the source changed while being read")
    if shards == 1:
        return _finish(out, plan, specs, opts.consensus_out, where)
    if missing := _missing(out, plan, specs):  # other shards still running, or not yet started
        return (f"{out}: shard {shard}/{shards} done: its {len(mine)} chunk(s) of every teacher "
                f"in place; {len(missing)} chunk file(s) of other shards still missing (first "
                f"{missing[0]}); the consensus runs once every shard has finished")
    return _finish(out, plan, specs, None, where)


def _missing(out: Path, plan: dict, specs: list[TeacherSpec]) -> list[Path]:
    return [p for s in specs for p in missing_chunks(out, plan, s.slug)]


def _finish(out: Path, plan: dict, specs: list[TeacherSpec], consensus_out: str | None,
            where: dict) -> str:
    """extract.json once every teacher has every chunk; the summary naming the teachers'
    directories (run_until_stop prints it once a signal can no longer stop the run)."""
    n = n_chunks(plan)
    if missing := _missing(out, plan, specs):
        raise StoreError(f"{out}: {len(missing)} chunk(s) missing after the run, first {missing[0]}")
    atomic_write_json(out / RESULT_FILE, {**plan, "chunks": n,
                                          "teacher_dirs": [s.slug for s in specs]})
    dirs = [str(out / s.slug) for s in specs]
    if consensus_out is None:
        return (f"{out}: {plan['rows']:,} rows x {len(specs)} teachers in {n} chunks each; next: "
                f"aleph targets consensus --teachers {' '.join(dirs)} --out {out / 'consensus'}")
    from aleph.targets.consensus import run_consensus  # numpy/torch only

    where.update(phase="consensus", consensus=Path(consensus_out).absolute())
    r = run_consensus(dirs, consensus_out)
    return (f"{consensus_out}: {r['rows']:,} x {r['dim']} float16 consensus targets of "
            f"{len(dirs)} teachers ({r['fit']['iterations']} sweeps)")
