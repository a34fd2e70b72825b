"""The batch prefetcher: the same batches in the same order as gathering on demand, across
epochs and across a stop and restart, with the next batch gathered while a step runs."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
import torch

from aleph.train import checkpoint as ckpt
from aleph.train.distributed import World
from aleph.train.order import DataOrder
from aleph.train.prefetch import BatchSource, Prefetcher
from aleph.train.step import advance


class Targets:
    """Target rows = the row index (so a batch's rows can be read back), recording the
    thread of each gather."""

    implementation = "in_ram"  # nothing mapped: prefetch.MappedFiles skips it

    def __init__(self) -> None:
        self.threads: list[str] = []

    def gather(self, idx, pin=False):
        self.threads.append(threading.current_thread().name)
        return torch.as_tensor(idx, dtype=torch.float32)[:, None].expand(-1, 4).clone()


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    from aleph.data.tokenizer import load_tokenizer, train_wordpiece
    from aleph.data.tokens import build_token_store

    root = tmp_path_factory.mktemp("prefetch")
    captions = [" ".join(["cat", "dog"][: 1 + i % 2] * (1 + i % 5)) for i in range(40)]
    train_wordpiece(captions, root / "tok")
    return build_token_store(captions, load_tokenizer(root / "tok"), root / "store", 12)


def _rows(batch) -> list[int]:
    return batch[2][:, 0].long().tolist()


def _run(tokens, order, start: ckpt.Position, total: int) -> tuple[list[list[int]], Targets]:
    targets = Targets()
    src = BatchSource(tokens, targets, order, World(), torch.device("cpu"), False)
    pf, pos, seen = Prefetcher(src, total), start, []
    try:
        while pos.step < total:
            batch = pf.take(pos.epoch, pos.batch_in_epoch, pos.step)
            ids, mask = tokens.gather(order.indices(pos.epoch, pos.batch_in_epoch, World()))
            assert torch.equal(batch[0], ids) and torch.equal(batch[1], mask)
            seen.append(_rows(batch))
            pos = advance(pos, order, 0.0)
        assert pf.ahead is None  # nothing gathered beyond the last step
        assert pf.hits == len(seen) - 1  # every batch but the first came from the worker
    finally:
        pf.close()
    return seen, targets


def test_prefetched_batches_follow_the_data_order_across_epochs_and_a_restart(tokens):
    order = DataOrder(5, tokens.rows, 8)  # 5 steps per epoch
    whole, targets = _run(tokens, order, ckpt.Position(0, 0, 0, 0), 12)
    expected = [order.indices(e, b, World()).tolist() for e in range(3) for b in range(5)][:12]
    assert whole == expected
    assert targets.threads[0] == "MainThread"
    assert all(t.startswith("aleph-prefetch") for t in targets.threads[1:])
    # stop after step 7 (its worker had batch 8 in hand), restart from the saved position
    first, _ = _run(tokens, order, ckpt.Position(0, 0, 0, 0), 7)
    pos = ckpt.Position(7, 1, 2, 56)
    rest, _ = _run(tokens, order, pos, 12)
    assert first + rest == whole  # no batch twice, none skipped


def test_next_position_wraps_at_the_epoch_end_and_a_gather_error_reaches_the_caller(tokens):
    order = DataOrder(0, 40, 8)  # 5 steps per epoch
    assert order.after(0, 3) == (0, 4) and order.after(0, 4) == (1, 0)

    class Broken(Targets):
        def gather(self, idx, pin=False):
            if threading.current_thread().name != "MainThread":
                raise OSError("disk gone")
            return super().gather(idx, pin)

    src = BatchSource(tokens, Broken(), DataOrder(0, tokens.rows, 8), World(),
                      torch.device("cpu"), False)
    pf = Prefetcher(src, 10)
    try:
        pf.take(0, 0, 0)
        with pytest.raises(OSError, match="disk gone"):
            pf.take(0, 1, 1)
    finally:
        pf.close()


TRUNCATED_CHILD = """
import sys
from pathlib import Path

import torch

from aleph.data.tokens import open_token_store
from aleph.errors import StoreError
from aleph.targets import open_store
from aleph.train.distributed import World
from aleph.train.order import DataOrder
from aleph.train.prefetch import BatchSource, Prefetcher


class CutAfterSecondGather:
    \"\"\"The real store; its data file is truncated in place right after the second gather
    (batch 1, in the worker), so the worker's next gather is the first to meet it.\"\"\"

    def __init__(self, store):
        self.store, self.calls = store, 0

    def __getattr__(self, name):
        return getattr(self.store, name)

    def gather(self, idx, pin=False):
        out = self.store.gather(idx, pin)
        self.calls += 1
        if self.calls == 2:
            Path(self.store.path).write_bytes(b"")
        return out


tokens = open_token_store(sys.argv[1])
targets = CutAfterSecondGather(open_store(sys.argv[2], "streaming"))
src = BatchSource(tokens, targets, DataOrder(0, tokens.rows, 8), World(), torch.device("cpu"), False)
pf = Prefetcher(src, 5)
try:
    for b in range(3):
        pf.take(0, b, b)
    print("no error")
except StoreError as e:
    print(f"StoreError: {e}")
finally:
    pf.close()
"""


def test_a_target_store_truncated_during_training_is_a_store_error_not_a_sigbus(tokens, tmp_path):
    """The worker's gather read a mapping of a file cut short: the child used to die of SIGBUS
    (no message, launch left 'running'); now the next take raises a StoreError naming the
    store. In a child process, so a regression kills the child, not the test session."""
    from aleph.targets import build_store
    from tests.train.conftest import REPO

    torch.save(torch.nn.functional.normalize(torch.randn(tokens.rows, 16), dim=-1).half(),
               tmp_path / "chunk-000.pt")
    store = build_store([tmp_path / "chunk-000.pt"], tmp_path / "store")
    assert store.implementation == "streaming"
    proc = subprocess.run([sys.executable, "-c", TRUNCATED_CHILD, str(tokens.path),
                           str(store.store_dir)], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 0, f"child died ({proc.returncode}): {proc.stderr[-2000:]}"
    assert f"StoreError: target store {store.store_dir}: targets.bin is 0 B, expected " \
           f"{store.byte_length:,} B: truncated or rewritten during training" in proc.stdout


def test_a_store_file_replaced_or_removed_under_the_run_is_not_an_error(tokens, tmp_path):
    """The mapping keeps the old inode whole, so only an in-place size change is refused."""
    import shutil

    from aleph.data.tokens import open_token_store
    from aleph.errors import StoreError
    from aleph.targets import build_store
    from aleph.train.prefetch import MappedFiles

    shutil.copytree(tokens.path, tmp_path / "tokens")  # a copy: the module's store stays whole
    tokens = open_token_store(tmp_path / "tokens")
    torch.save(torch.zeros(tokens.rows, 8).half(), tmp_path / "chunk-000.pt")
    store = build_store([tmp_path / "chunk-000.pt"], tmp_path / "store")
    mapped = MappedFiles(tokens, store)
    assert [p.name for p, *_ in mapped.files] == ["ids.npy", "lengths.npy", "targets.bin"]
    other = tmp_path / "other.bin"
    other.write_bytes(b"x")
    os.replace(other, store.path)  # a new, 1-byte file under the name: not what is mapped
    mapped.check(0, 0)
    store.path.unlink()
    mapped.check(0, 0)
    with open(tokens.path / "lengths.npy", "r+b") as f:  # the mapped token array, cut short
        f.truncate(64)
    with pytest.raises(StoreError, match=rf"token store {tokens.path}: lengths.npy is 64 B, "
                                         r"expected [\d,]+ B: truncated or rewritten during "
                                         r"training \(found before gathering batch 3 of epoch 1\)"):
        mapped.check(1, 3)


def test_a_failed_store_prefault_is_logged_and_training_goes_on(train_work, monkeypatch):
    """The prefault is a page-cache hint: when it fails (here: the planner's read of the
    target sources raises), the launch logs why and trains; the gathers read the store."""
    from aleph.train import prefetch as pf
    from aleph.train.config import resolve
    from aleph.train.identity import run_dir_for
    from aleph.train.run import train
    from tests.train.conftest import SMOKE_ROWS

    def unreadable(store, sources, headroom):
        raise OSError(5, "Input/output error", sources[0])

    monkeypatch.setenv("ALEPH_WORK", str(train_work))
    monkeypatch.setattr(pf, "warm_target_store", unreadable)
    cfg = resolve("smoke", arm="a2_dense", overrides=[f"smoke_rows={SMOKE_ROWS}",
                                                        "batch_size=64", "epochs=1"])
    assert train(cfg) == 0
    log = next((run_dir_for(cfg) / "launches").glob("*.log")).read_text()
    assert "target store prefault: skipped ([Errno 5] Input/output error" in log
    assert (run_dir_for(cfg) / "weights" / "final" / "model.safetensors").is_file()
