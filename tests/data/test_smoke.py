import hashlib
import random

import numpy as np
import pytest
import torch

from aleph.data import ensure_smoke_data, sts_pairs
from aleph.data.grammar import Meaning, render, sample_meaning
from aleph.data.smoke_teacher import Teacher, overlap_cosine
from aleph.errors import DataError


def _digest_tree(root):
    h = hashlib.sha256()
    for p in sorted(q for q in root.rglob("*") if q.is_file()):
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def test_same_arguments_same_bytes(smoke, smoke_root, tmp_path):
    other = ensure_smoke_data(tmp_path / "again")
    assert _digest_tree(smoke_root) == _digest_tree(tmp_path / "again")
    assert other.rows == smoke.rows == 4096
    different = ensure_smoke_data(tmp_path / "seed1", rows=64, seed=1)
    assert different.captions.read_bytes() != smoke.captions.read_bytes()


def test_files_and_formats(smoke):
    captions = smoke.captions.read_text(encoding="utf-8").split("\n")
    assert captions[-1] == "" and len(captions) - 1 == smoke.rows
    assert len(smoke.target_chunks) == 4
    chunks = [torch.load(p, weights_only=True) for p in smoke.target_chunks]
    assert sum(c.shape[0] for c in chunks) == smoke.rows
    for c in chunks:
        assert c.dtype == torch.float16 and c.shape[1] == 768
        torch.testing.assert_close(c.float().norm(dim=-1), torch.ones(c.shape[0]),
                                   atol=2e-3, rtol=0)


def test_second_call_reuses_and_a_damaged_set_is_rebuilt(tmp_path):
    first = ensure_smoke_data(tmp_path / "s", rows=300)
    stamp = first.target_chunks[0].stat().st_mtime_ns
    ensure_smoke_data(tmp_path / "s", rows=300)
    assert first.target_chunks[0].stat().st_mtime_ns == stamp  # reused, not rewritten
    good = first.captions.read_bytes()
    first.captions.write_text("tampered\n")
    ensure_smoke_data(tmp_path / "s", rows=300)
    assert first.captions.read_bytes() == good
    with pytest.raises(DataError, match="rows"):
        ensure_smoke_data(tmp_path / "t", rows=1)


def test_targets_follow_meaning_not_surface():
    rng, teacher = random.Random(0), Teacher()
    for _ in range(20):
        m = sample_meaning(rng)
        _, t1 = render(m, rng)
        other = Meaning(object="chair" if m.object != "chair" else "dog",
                        colour="orange" if m.colour != "orange" else "red",
                        action="posing" if m.action != "posing" else "running",
                        place="kitchen" if m.place != "kitchen" else "lake")
        a, b = teacher.target(m, t1), teacher.target(m, (t1 + 1) % 6)
        c = teacher.target(other, t1)
        assert a @ b > 0.98  # paraphrase: only the template term differs
        assert a @ c < 0.3  # nothing shared but the template


def test_captions_of_one_meaning_share_a_target_in_the_data(smoke):
    captions = smoke.captions.read_text(encoding="utf-8").split("\n")[:-1]
    targets = torch.cat([torch.load(p, weights_only=True) for p in smoke.target_chunks]).float()
    sims = targets @ targets.T  # (N, N)
    sims.fill_diagonal_(-1)
    i = int(sims.max(dim=1).values.argmax())  # the row with the closest other row
    j = int(sims[i].argmax())
    assert sims[i, j] > 0.98 and captions[i] != captions[j]  # a paraphrase, not a copy


def test_sts_pairs_are_deterministic_and_span_the_scale():
    pairs = sts_pairs(400, seed=7)
    assert pairs == sts_pairs(400, seed=7) and pairs != sts_pairs(400, seed=8)
    gold = np.array([g for _, _, g in pairs])
    assert gold.min() == 0.0 and gold.max() == 5.0 and 0 <= gold.min() <= gold.max() <= 5
    assert len(np.unique(np.round(gold))) >= 5  # graded, not binary
    assert all(isinstance(a, str) and isinstance(b, str) and a and b for a, b, _ in pairs)


def test_gold_tracks_the_teacher_cosine():
    teacher = Teacher()
    rng = random.Random(3)
    golds, cosines = [], []
    for _ in range(200):
        a, b = sample_meaning(rng), sample_meaning(rng)
        golds.append(5 * overlap_cosine(a, b))
        cosines.append(teacher.target(a, 0) @ teacher.target(b, 1))
    assert np.corrcoef(golds, cosines)[0, 1] > 0.9


def test_concurrent_callers_share_one_set(tmp_path):
    """Arms launched together all call ensure_smoke_data on the same root."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(3) as pool:
        sets = list(pool.map(lambda _: ensure_smoke_data(tmp_path / "s", rows=200), range(3)))
    assert sets[0] == sets[1] == sets[2]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".s.lock", "s"]  # nothing staged left
    assert len(sets[0].captions.read_text().split("\n")) == 201


def test_a_root_holding_other_data_is_refused_not_deleted(tmp_path):
    # a rebuild swaps the root out and deletes it: --root pointing at a user's file or
    # data directory must be an error that leaves it intact
    other = tmp_path / "mydata"
    other.mkdir()
    (other / "notes.txt").write_text("important\n")
    with pytest.raises(DataError, match="refusing to replace"):
        ensure_smoke_data(other, rows=20)
    assert (other / "notes.txt").read_text() == "important\n"
    afile = tmp_path / "file.txt"
    afile.write_text("keep\n")
    with pytest.raises(DataError, match="not a directory"):
        ensure_smoke_data(afile, rows=20)
    assert afile.read_text() == "keep\n"
    (tmp_path / "empty").mkdir()
    assert ensure_smoke_data(tmp_path / "empty", rows=20).rows == 20  # empty dir is fine
    assert ensure_smoke_data(tmp_path / "empty", rows=30).rows == 30  # other args: rebuilt


def test_a_mangled_smoke_manifest_is_an_error_not_a_crash(tmp_path):
    ensure_smoke_data(tmp_path / "s", rows=20)
    (tmp_path / "s" / "smoke.json").write_text("[]")  # valid JSON, not an object
    with pytest.raises(DataError, match="smoke data manifest"):
        ensure_smoke_data(tmp_path / "s", rows=20)
    (tmp_path / "s" / "smoke.json").write_text('{"format": "aleph-smoke-data", "files": 3}')
    assert ensure_smoke_data(tmp_path / "s", rows=20).rows == 20  # ours, damaged: rebuilt


def test_an_intact_set_on_a_read_only_volume_is_used_and_a_missing_one_named(tmp_path, monkeypatch):
    from aleph.data import smoke as smoke_mod

    made = ensure_smoke_data(tmp_path / "s", rows=20)

    def read_only(path, *a, **kw):  # the lock file beside the root cannot be created
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(smoke_mod, "open_write_nofollow", read_only)
    assert ensure_smoke_data(tmp_path / "s", rows=20) == made
    with pytest.raises(DataError, match="cannot create it or its lock file"):
        ensure_smoke_data(tmp_path / "s", rows=30)
