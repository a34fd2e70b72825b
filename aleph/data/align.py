"""Does caption row i belong with target row i? Decided from a sample, with no neural model.

The E1 image cannot load a transformers model class on torch 2.4.1, so the check is
linear: each sampled caption becomes hashed unigram + bigram token features (`features`);
a kernel ridge map from features to targets is fitted on half of the sample and scored by
held-out R@1 (ties by identity, `retrieval_credit`), for the pairing as given, a shuffled
pairing (chance with this much data) and the pairings shifted by +-1 and +-2 rows (an
off-by-one scores higher shifted). Aligned: at least MIN_HITS hits, CHANCE_FACTOR times
chance and MARGIN times the best alternative.

The sample is BLOCKS contiguous blocks spread evenly over the rows (a misalignment that
starts halfway is seen), alternately fitted and held out; only the sample is read. A
sampled target row holding a NaN or Inf is a DataError (exit 2, not a misalignment's 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch

from aleph.data.captions import (
    BATCH_ROWS,
    CaptionSource,
    _check_arrow,
    check_row_counts,
    open_captions,
)
from aleph.errors import DataError

FEATURE_DIM = 4096  # hashed feature buckets
BLOCKS = 16  # contiguous sample blocks (even: half fitted, half held out)
SHIFTS = (-2, -1, 1, 2)  # alternative pairings scored next to the given one
PAD = max(abs(s) for s in SHIFTS)  # target rows read beyond each sample block, each side
RIDGE = 1.0  # kernel ridge regulariser (features are unit vectors: kernel diagonal 1)
MIN_HITS, CHANCE_FACTOR, MARGIN = 8, 10.0, 1.25
TEXT_CHARS = 1 << 14  # of a sampled caption kept: more than its first 512 tokens, all scored
_MIX = np.uint64(0x9E3779B97F4A7C15)  # 64-bit golden-ratio multiplier for hashing


def retrieval_credit(scores: torch.Tensor, same: torch.Tensor) -> torch.Tensor:
    """(..., B) R@1 credit per query from (..., B, B) scores (candidate i is query i's own)
    and `same` (candidate j's target bitwise equals query i's): such a candidate gets
    exactly the own score (whatever the GEMM rounded), then 1/k when the own target is
    among k tied at the top, 0 below it."""
    own = torch.diagonal(scores, dim1=-2, dim2=-1)  # (..., B)
    scores = torch.where(same, own.unsqueeze(-1), scores)  # (..., B, B)
    top = scores.max(-1).values  # (..., B)
    tied = (scores == top.unsqueeze(-1)).sum(-1)  # (..., B) >= 1
    return (own == top).double() / tied.double()  # (..., B)


def bitwise_same(rows: torch.Tensor) -> torch.Tensor:
    """(..., B, D) -> (..., B, B) bool: row i and row j are bitwise-equal vectors. Rows are
    numbered by their distinct bit patterns (torch.unique over the raw bytes), so memory
    is the rows plus B x B, not B x B x D."""
    flat = rows.contiguous().view(-1, rows.shape[-1])  # (N, D)
    raw = flat.view(torch.uint8).view(flat.shape[0], -1)  # (N, D * bytes)
    if raw.shape[1] % 8 == 0:
        raw = raw.view(torch.int64)  # (N, D * bytes / 8): fewer columns to compare
    _, ident = torch.unique(raw, dim=0, return_inverse=True)  # (N,) one id per bit pattern
    ident = ident.view(rows.shape[:-1])  # (..., B)
    return ident.unsqueeze(-1) == ident.unsqueeze(-2)


@dataclass
class Alignment:
    """The figures of one check; `line()` is what the CLI and the preflight print."""

    aligned: bool
    rows: int
    fitted: int
    held_out: int
    r_at_1: float
    shuffled: float
    shifted: dict[int, float]
    reason: str = ""

    @property
    def chance(self) -> float:
        return 1.0 / self.held_out

    def line(self) -> str:
        shifts = ", ".join(f"{s:+d}: {r:.4f}" for s, r in sorted(self.shifted.items()))
        return (f"{'ALIGNED' if self.aligned else 'MISALIGNED'}: held-out R@1 {self.r_at_1:.4f} "
                f"({round(self.r_at_1 * self.held_out)} of {self.held_out}) vs chance "
                f"{self.chance:.4f}, shuffled pairing {self.shuffled:.4f}, shifted pairings "
                f"{shifts} ({self.fitted} rows fitted of {self.rows:,}){self.reason}")

    def as_dict(self) -> dict:
        return {**asdict(self), "chance": self.chance,
                "shifted": {str(k): v for k, v in self.shifted.items()}}


def sample_blocks(rows: int, sample: int) -> list[tuple[int, int]]:
    """(start, length) of the sample's caption blocks; SHIFTS rows stay free at both ends."""
    usable = rows - 2 * PAD
    if usable < 2 * BLOCKS:
        raise DataError(f"alignment check: {rows} rows are too few; expected at least "
                        f"{2 * BLOCKS + 2 * PAD}")
    length = max(2, min(sample, usable) // BLOCKS)
    span = usable - length  # starts spread evenly over [PAD, PAD + span]
    return [(PAD + (k * span) // (BLOCKS - 1), length) for k in range(BLOCKS)]


def take_captions(src: CaptionSource, idx: np.ndarray) -> list[str]:
    """Captions at sorted row indices `idx` (each cut to TEXT_CHARS, so the sample's memory
    is bounded): parquet by the row groups that hold them, a directory shard by shard,
    anything else streamed once up to the last index."""
    import pyarrow.compute as pc

    if src.kind == "parquet":
        pf, out, start = src.parquet_reader(), [], 0
        for g in range(pf.file.metadata.num_row_groups):
            n = pf.file.metadata.row_group(g).num_rows
            local = idx[(idx >= start) & (idx < start + n)] - start
            at = 0  # rows of group g read so far; the reader checks they add up to n
            for rb in pf.batches([src.column], BATCH_ROWS, g) if local.size else ():
                col = _check_arrow(rb.column(0), src._where(), start + at)
                took = col.take(local[(local >= at) & (local < at + len(col))] - at)
                out += pc.utf8_slice_codeunits(took, 0, TEXT_CHARS).to_pylist()
                at += len(col)
            start += n
        return out
    if src.kind == "dir":
        out, start = [], 0
        for shard in src.shards:
            n = shard.count_rows()
            local = idx[(idx >= start) & (idx < start + n)] - start
            if local.size:
                out += take_captions(shard, local)
            start += n
        return out
    out, start, want = [], 0, set(idx.tolist())
    for batch in src.batches():
        out += [c[:TEXT_CHARS] for j, c in enumerate(batch) if start + j in want]
        start += len(batch)
        if start > idx[-1]:
            break
    return out


def take_targets(paths: Sequence[str], idx: np.ndarray) -> torch.Tensor:
    """Target rows at sorted indices `idx` of the chunk files `paths`, in their own dtype."""
    from aleph.targets.format import tensor_view
    from aleph.targets.sources import describe_sources, open_chunk

    parts, start = [], 0
    for info in describe_sources(paths):
        local = idx[(idx >= start) & (idx < start + info.rows)] - start
        if local.size:
            with open_chunk(info) as arr:  # (rows, dim) raw bits, mapped
                parts.append(tensor_view(np.ascontiguousarray(arr[local]), info.dtype))  # (k, D)
        start += info.rows
    return torch.cat(parts)


OUTLIER = 1e6  # a target row's norm over the sample's median: another scale, refused


def check_finite(paths: Sequence[str], idx: np.ndarray, rows: torch.Tensor) -> None:
    """DataError naming the chunk file and row of the first of `rows` (the target rows at
    sorted indices `idx` of `paths`) that holds a NaN or Inf, or whose norm is over OUTLIER
    times the sample's median: no pairing can be scored around it (one 3e38 row made every
    score tie, a confident MISALIGNED for aligned targets)."""
    from aleph.targets.sources import describe_sources

    r = rows.double()  # (n, d)
    norms = r.norm(dim=1)  # (n,)
    finite = torch.isfinite(r).all(1)
    median = float(norms[finite].median()) if bool(finite.any()) else 0.0
    checks = ((~finite, "holds NaN or Inf values; expected finite vectors"),
              ((norms > OUTLIER * median) & (median > 0), f"has norm {{norm:.3g}}, over "
               f"{OUTLIER:,.0f} times the sampled rows' median {median:.3g}; expected vectors "
               "of one scale"))
    for bad, what in checks:
        if bool(bad.any()):
            i = int(bad.nonzero()[0])
            row, start = int(idx[i]), 0
            for info in describe_sources(paths):
                if row < start + info.rows:
                    raise DataError(f"{info.path}: target row {row - start:,} (row {row:,} of the "
                                    f"targets) {what.format(norm=float(norms[i]))}: rebuild the "
                                    "targets or drop the row and its caption")
                start += info.rows


def target_files(path: str) -> list[str]:
    """A chunk file as given, or a directory's chunk files in row order; anything else (a
    FIFO would block the first read) is a DataError."""
    import os
    import stat

    from aleph._io import file_kind
    from aleph.targets.sources import chunk_files_in

    try:
        mode = os.stat(path).st_mode
    except OSError:
        raise DataError(f"--targets {path} does not exist; expected a chunk file or a "
                        "directory of chunk files") from None
    if stat.S_ISDIR(mode):
        return chunk_files_in(path)
    if not stat.S_ISREG(mode):
        raise DataError(f"--targets {path} is {file_kind(mode)}; expected a chunk file (a "
                        "regular file) or a directory of chunk files")
    return [path]


def features(token_ids: Sequence[Sequence[int]], dim: int = FEATURE_DIM) -> torch.Tensor:
    """(n, dim) float32: hashed unigram + bigram counts, log(1 + count), L2-normalised."""
    cells = []
    for r, ids in enumerate(token_ids):
        a = np.asarray(ids, np.uint64)
        grams = np.concatenate([a * _MIX, (a[:-1] * np.uint64(1_000_003) + a[1:] + _MIX) * _MIX])
        cells.append(r * dim + ((grams >> np.uint64(20)) % np.uint64(dim)).astype(np.int64))
    flat = np.concatenate(cells) if cells else np.zeros(0, np.int64)
    counts = np.bincount(flat, minlength=len(token_ids) * dim).astype(np.float32)
    x = torch.from_numpy(np.log1p(counts, out=counts)).view(len(token_ids), dim)  # (n, dim)
    return x / x.norm(dim=1, keepdim=True).clamp_min(1e-12)


def check_pairing(captions: CaptionSource, targets: Sequence[str], tokenizer,
                    sample: int = 4096, seed: int = 0, target_desc: str = "targets"
                    ) -> Alignment:
    """Check that caption row i goes with target row i (see the module docstring).
    Row counts that differ are a DataError naming both, before any sampling."""
    from aleph.targets.sources import describe_sources

    rows = captions.count_rows()
    target_rows = sum(i.rows for i in describe_sources(targets))
    check_row_counts(rows, target_rows, f"captions {captions.name}", target_desc)
    blocks = sample_blocks(rows, sample)
    cap_idx = np.concatenate([np.arange(s, s + n) for s, n in blocks])
    tgt_idx = np.concatenate([np.arange(s - PAD, s + n + PAD) for s, n in blocks])
    texts = take_captions(captions, cap_idx)
    y_all = take_targets(targets, tgt_idx)  # (blocks * (n + 2 PAD), D)
    check_finite(targets, tgt_idx, y_all)  # a NaN row would poison every score: name it
    # one common scale (the largest row norm, taken in float64) so float32 sums cannot
    # overflow on finite but huge values; the scores are cosines, so it changes no verdict
    y_f = y_all.double()
    y_f = (y_f / y_f.norm(dim=1).max().clamp_min(1e-300)).float()
    ids = tokenizer(texts, add_special_tokens=False, truncation=True, max_length=512)["input_ids"]
    x = features(ids)  # (blocks * n, dim)
    n = blocks[0][1]
    x = x.view(len(blocks), n, -1)  # (K, n, dim)
    y_all = y_all.view(len(blocks), n + 2 * PAD, -1)  # (K, n + 2 PAD, D) own dtype
    y_f = y_f.view(y_all.shape)  # (K, n + 2 PAD, D) float32, scaled
    fit, test = slice(0, None, 2), slice(1, None, 2)  # alternate blocks
    x_fit = x[fit].reshape(-1, x.shape[-1])  # (m, dim)
    x_test = x[test].reshape(-1, x.shape[-1])  # (m, dim)
    gram = (x_fit @ x_fit.T).double() + RIDGE * torch.eye(x_fit.shape[0], dtype=torch.float64)
    # kernel ridge: predictions = cross @ gram^-1 @ (Y - mean), the same map for every pairing
    smoother = torch.linalg.solve(gram, (x_test @ x_fit.T).double().T).T.float()  # (m, m)
    del gram

    def r_at_1(shift: int, permute: torch.Tensor | None = None) -> float:
        y = y_f[:, PAD + shift: PAD + shift + n]  # (K, n, D): target of caption i is i+shift
        y_fit = y[fit].reshape(-1, y.shape[-1])  # (m, D)
        y_test = y[test].reshape(-1, y.shape[-1])  # (m, D)
        y_test_raw = y_all[:, PAD + shift: PAD + shift + n][test].reshape(y_test.shape)  # identity
        if permute is not None:
            y_fit = y_fit[permute]
        mean = y_fit.mean(0, keepdim=True)  # (1, D)
        pred = smoother @ (y_fit - mean)  # (m, D)
        cand = y_test - mean  # (m, D)
        scores = (pred / pred.norm(dim=1, keepdim=True).clamp_min(1e-12)) @ (
            cand / cand.norm(dim=1, keepdim=True).clamp_min(1e-12)).T  # (m, m)
        return float(retrieval_credit(scores, bitwise_same(y_test_raw)).mean())

    g = torch.Generator().manual_seed(seed)
    given = r_at_1(0)
    shuffled = r_at_1(0, torch.randperm(x_fit.shape[0], generator=g))
    shifted = {s: r_at_1(s) for s in SHIFTS}
    m = x_test.shape[0]
    if not np.isfinite([given, shuffled, *shifted.values()]).all():
        named = target_desc if target_desc != "targets" else f"targets {', '.join(targets[:2])}" + (
            f" (and {len(targets) - 2} more)" if len(targets) > 2 else "")
        raise DataError(f"{named}: held-out R@1 is not finite ({given}); expected finite "
                        "target vectors of a usable scale (rebuild the targets)")
    best_alt = max(shuffled, *shifted.values())
    reasons = []
    if given * m < MIN_HITS:
        reasons.append(f"fewer than {MIN_HITS} held-out hits")
    if given < CHANCE_FACTOR / m:
        reasons.append(f"under {CHANCE_FACTOR:g}x chance")
    if given < MARGIN * best_alt:
        s = max(shifted, key=shifted.get)
        clear = shifted[s] > given and shifted[s] * m >= MIN_HITS
        reasons.append(f"not {MARGIN:g}x the best alternative pairing" +
                       (f" (caption i looks like target i{s:+d}'s)" if clear else ""))
    return Alignment(not reasons, rows, x_fit.shape[0], m, given, shuffled, shifted,
                     f"; {', '.join(reasons)}" if reasons else "")


PREFLIGHT_SAMPLE = 4096
_MEMO_VERSION = 1  # bump when the check's figures change meaning


def preflight_alignment(source: str, column: str, targets: Sequence[str], tokenizer,
                        captions_sha256: str, allow: bool, say) -> dict | None:
    """The e1 preflight's pairing check (`check_pairing` on PREFLIGHT_SAMPLE rows), said in
    one line; misaligned: a DataError unless `allow`, then the figures for the manifest.
    Memoised under <work>/cache/alignment by its inputs' identity, so a resume reads nothing."""
    from aleph._io import atomic_write_json, read_json, sha256_json, work_root
    from aleph.data.tokenizer import tokenizer_fingerprint
    from aleph.targets.sources import source_fingerprint, source_stats

    key = {"v": _MEMO_VERSION, "captions_sha256": captions_sha256, "column": column,
           "targets": source_fingerprint(source_stats(targets)),
           "tokenizer": tokenizer_fingerprint(tokenizer), "sample": PREFLIGHT_SAMPLE}
    memo = work_root() / "cache" / "alignment" / f"{sha256_json(key)[:16]}.json"
    try:
        saved = read_json(memo) if memo.is_file() else {}
    except ValueError:
        saved = {}  # written atomically, so a hand edit: check again
    if saved.get("key") == key and isinstance(saved.get("result"), dict):
        result, how = saved["result"], f" (memoised, {memo.name})"
    else:
        caps = open_captions(source, column=column)
        rows = caps.count_rows()
        if rows < 2 * BLOCKS + 2 * PAD:
            say(f"inputs: alignment: not checked: {rows} rows are too few for the check")
            return None
        checked = check_pairing(caps, targets, tokenizer, PREFLIGHT_SAMPLE)
        result = {**checked.as_dict(), "line": checked.line()}
        atomic_write_json(memo, {"key": key, "result": result})
        how = ""
    if result["aligned"]:
        say(f"inputs: alignment: {result['line']}{how}")
        return None
    if not allow:
        raise DataError(f"captions {source} do not pair with the targets row by row: "
                        f"{result['line']}; row i of the captions must be the text of target "
                        "row i (aleph data check-align shows the same figures): fix the order, "
                        "or set allow_misaligned=true to train anyway (recorded in manifest.json)")
    say(f"inputs: alignment: {result['line']}; ALLOWED by allow_misaligned=true (recorded in "
        "manifest.json)")
    return {"by": "allow_misaligned=true", **result}
