"""Loop pieces in-process: data order, schedule, finite checks, checkpoint completeness."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aleph.errors import AlephError, NonFiniteError
from aleph.model import ModelConfig, build_model
from aleph.record.layout import RunLayout
from aleph.train import checkpoint as ckpt
from aleph.train.config import resolve
from aleph.train.distributed import World
from aleph.train.optim import lr_factor, make_optimizer
from aleph.train.order import DataOrder
from aleph.train.step import train_step
from aleph.train.trainer import step_trainer
from tests.train.conftest import tiny_trainer


def test_data_order_is_a_function_of_seed_and_epoch_and_shards_by_rank():
    a, b = DataOrder(7, 100, 20), DataOrder(7, 100, 20)
    assert a.steps_per_epoch == 5
    assert np.array_equal(a.permutation(1), b.permutation(1))
    assert not np.array_equal(a.permutation(0), a.permutation(1))
    assert sorted(a.permutation(2)) == list(range(100))
    whole = a.indices(1, 3, World())
    halves = [a.indices(1, 3, World(rank=r, size=2)) for r in (0, 1)]
    assert np.array_equal(np.concatenate(halves), whole)  # rank order = global batch order
    epoch = np.concatenate([a.indices(0, i, World()) for i in range(5)])
    assert sorted(epoch) == list(range(100))  # each row once per epoch
    with pytest.raises(Exception, match="batch_size"):
        DataOrder(0, 10, 11)


def test_schedule_warmup_then_cosine():
    f = [lr_factor(s, 10, 110, 0.1) for s in range(111)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert f[10] == pytest.approx(1.0) and f[60] == pytest.approx(0.55)
    assert f[110] == pytest.approx(0.1)
    assert all(x >= y for x, y in zip(f[10:], f[11:], strict=False))


def test_matrices_decay_but_vectors_and_unit_anchors_do_not():
    cfg = resolve("smoke", arm="a1_anchored")
    model = build_model(ModelConfig(arm="a1_anchored", vocab_size=50, max_len=8, d_model=16,
                                    n_layers=2, n_heads=2, ffn_dense=32, ffn_expert=8))
    decay, other = make_optimizer(model, cfg).param_groups
    assert decay["weight_decay"] == cfg.weight_decay > 0 and other["weight_decay"] == 0.0
    ids = {id(p) for p in other["params"]}
    names = {n for n, p in model.named_parameters() if id(p) in ids}
    anchors = {n for n in names if n.endswith("address.anchors")}
    assert len(anchors) == 2  # one codebook per block, kept out of decay
    assert all(p.ndim >= 2 for p in decay["params"])
    assert len(decay["params"]) + len(other["params"]) == len(list(model.parameters()))


def test_nonfinite_loss_stops_before_the_update():
    cfg, model, opt, sched = tiny_trainer()
    t = step_trainer(cfg, model, 10)
    t.pos = ckpt.Position(6, 0, 6, 24)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids, mask = torch.randint(5, 50, (4, 8)), torch.ones(4, 8, dtype=torch.bool)
    target = torch.full((4, 768), float("nan"))
    with pytest.raises(NonFiniteError, match="step 7: loss is nan"):
        train_step(t, (ids, mask, target))
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    good = torch.nn.functional.normalize(torch.randn(4, 768), dim=-1)
    res = train_step(t, (ids, mask, good))
    assert np.isfinite(res.loss) and res.grad_norm > 0
    assert not all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_only_complete_checkpoints_count_and_two_are_kept(tmp_path):
    cfg, model, opt, sched = tiny_trainer()
    for step in (3, 6, 9):
        pos = ckpt.Position(step, 0, step, step * 4, 1.0)
        ckpt.save(tmp_path, model, opt, sched, pos, [ckpt.rng_state()], "h", keep=2)
    assert [p.name for p in RunLayout(tmp_path).complete_states()] == ["step-00000006", "step-00000009"]
    torn = RunLayout(tmp_path).state_dir(12)
    torn.mkdir()
    (torn / "meta.json").write_text("{}")  # a killed save: no COMPLETE marker
    path, meta = ckpt.latest(tmp_path)
    assert meta["step"] == 9 and path.name == "step-00000009"
    assert ckpt.remove_incomplete(tmp_path) == ["step-00000012"]
    pos, rngs, _ = ckpt.load(path, model, opt, sched)
    assert pos.samples_seen == 36 and len(rngs) == 1


def test_eta_format_does_not_wrap_at_a_day():
    from aleph.train.progress import fmt_duration

    assert fmt_duration(59.6) == "00:01:00"
    assert fmt_duration(3 * 86400 + 3723) == "3d 01:02:03"


def test_nonfinite_gradient_stops_before_the_update():
    cfg, model, opt, sched = tiny_trainer()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    next(model.parameters()).register_hook(lambda g: g * float("inf"))  # finite loss, inf grad
    ids, mask = torch.randint(5, 50, (4, 8)), torch.ones(4, 8, dtype=torch.bool)
    good = torch.nn.functional.normalize(torch.randn(4, 768), dim=-1)
    t = step_trainer(cfg, model, 10)
    t.pos = ckpt.Position(2, 0, 2, 8)
    with pytest.raises(NonFiniteError, match=r"step 3: gradient norm is (inf|nan) \(loss \d"):
        train_step(t, (ids, mask, good))
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_nonfinite_error_is_an_aleph_error_with_its_own_exit_code():
    from aleph import errors

    assert issubclass(NonFiniteError, AlephError) and NonFiniteError.__doc__
    assert NonFiniteError.exit_code == 65
    others = {c.exit_code for c in vars(errors).values()
              if isinstance(c, type) and issubclass(c, AlephError) and c is not NonFiniteError}
    assert 65 not in others


def _token_store(tmp_path, max_len: int = 12):
    """A real token store whose rows have clearly different lengths (3 .. 9 tokens)."""
    from aleph.data.tokenizer import load_tokenizer, train_wordpiece
    from aleph.data.tokens import build_token_store

    captions = [" ".join(["cat"] * (1 + i % 7)) for i in range(32)]
    train_wordpiece(captions, tmp_path / "tok")
    return build_token_store(captions, load_tokenizer(tmp_path / "tok"), tmp_path / "store",
                             max_len)


def test_compiled_batches_are_bucketed_to_16_and_trimmed_otherwise(tmp_path):
    from types import SimpleNamespace

    from aleph.train.prefetch import BatchSource, bucket_width

    assert [bucket_width(w, 40) for w in (1, 16, 17, 33, 40)] == [16, 16, 32, 40, 40]
    tokens = _token_store(tmp_path, max_len=40)
    targets = SimpleNamespace(gather=lambda idx, pin: torch.zeros(len(idx), 768),
                              implementation="in_ram")  # nothing mapped (prefetch.MappedFiles)
    order = DataOrder(0, tokens.rows, 4)
    widths = {}
    for compiled in (False, True):
        source = BatchSource(tokens, targets, order, World(), torch.device("cpu"), compiled)
        seen = []
        for b in range(order.steps_per_epoch):
            ids, mask, target = source.to_device(source.host(0, b))
            trimmed_ids, trimmed_mask = tokens.gather(order.indices(0, b, World()))
            if mask is None:  # eager, and no row of this batch is padded
                assert not compiled and trimmed_mask.all()
                mask = torch.ones_like(ids, dtype=torch.bool)
            assert ids.shape == mask.shape and target.shape == (4, 768)
            width = trimmed_ids.shape[1]
            assert torch.equal(ids[:, :width], trimmed_ids) and torch.equal(mask[:, :width], trimmed_mask)
            assert (ids[:, width:] == tokens.pad_id).all() and not mask[:, width:].any()
            seen.append(ids.shape[1])
        widths[compiled] = set(seen)
    assert len(widths[False]) > 1  # trimmed to each batch's longest row: the length varies
    assert widths[True] == {16}  # compiled: rows of 3..9 tokens, one bucket (not max_len 40)


def test_an_unpadded_batch_goes_without_a_mask_and_trains_alike(tmp_path):
    """Eager: rows all of one length give mask None (attention then gets no mask, so SDPA
    may pick its flash kernel on a GPU); the step's loss and update equal the masked ones."""
    from types import SimpleNamespace

    from aleph.data.tokenizer import load_tokenizer, train_wordpiece
    from aleph.data.tokens import build_token_store
    from aleph.train.prefetch import BatchSource

    captions = [f"cat sat on mat {w}" for w in ("red", "blue", "big", "old")] * 4
    train_wordpiece(captions, tmp_path / "tok")
    tokens = build_token_store(captions, load_tokenizer(tmp_path / "tok"), tmp_path / "s", 12)
    targets = SimpleNamespace(gather=lambda idx, pin: torch.randn(len(idx), 768,
                                                                  generator=torch.Generator().manual_seed(1)),
                              implementation="in_ram")
    order = DataOrder(0, tokens.rows, 8)
    eager = BatchSource(tokens, targets, order, World(), torch.device("cpu"), False)
    compiled = BatchSource(tokens, targets, order, World(), torch.device("cpu"), True)
    ids, mask, target = eager.host(0, 0)
    assert mask is None and ids.shape[1] == tokens.gather(order.indices(0, 0, World()))[1].shape[1]
    assert compiled.host(0, 0)[1] is not None  # one graph per bucket width: the mask stays

    cfg = resolve("smoke", arm="a2_dense")
    results = []
    for m in (None, torch.ones_like(ids, dtype=torch.bool)):
        torch.manual_seed(0)  # the same init and dropout draws for both
        model = build_model(ModelConfig(arm="a2_dense", vocab_size=len(load_tokenizer(tmp_path / "tok")),
                                        max_len=12, d_model=16, n_layers=1, n_heads=2, ffn_dense=32))
        t = step_trainer(cfg, model, 10)
        res = train_step(t, (ids, m, target))
        results.append((res.loss, res.grad_norm, [p.detach().clone() for p in t.net.parameters()]))
    (l0, n0, p0), (l1, n1, p1) = results
    assert l0 == pytest.approx(l1, abs=1e-6) and n0 == pytest.approx(n1, abs=1e-6)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(p0, p1, strict=True))


def test_fixed_length_refuses_a_batch_longer_than_max_len():
    from aleph.train.prefetch import fixed_length

    ids, mask = torch.ones(2, 5, dtype=torch.long), torch.ones(2, 5, dtype=torch.bool)
    assert fixed_length(ids, mask, 5, 0)[0] is ids
    with pytest.raises(ValueError, match="batch length 5 exceeds max_len 4"):
        fixed_length(ids, mask, 4, 0)


def test_stop_flag_modes_with_real_signals():
    import os
    import signal

    from aleph.train.signals import StopFlag, StopRequested

    before = signal.getsignal(signal.SIGTERM)
    stop = StopFlag("flag")
    try:
        os.kill(os.getpid(), signal.SIGTERM)  # flag mode: only recorded
        assert stop.is_set() and stop.signame == "SIGTERM"
        with pytest.raises(StopRequested, match="stopped by SIGTERM"):
            stop.set_mode("interrupt")  # a signal that came in meanwhile stops at once
    finally:
        stop.restore()
    assert signal.getsignal(signal.SIGTERM) is before
    stop = StopFlag("interrupt")
    try:
        with pytest.raises(StopRequested) as caught:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(100):  # the handler runs at the next bytecode boundary
                pass
        assert caught.value.signame == "SIGINT"
    finally:
        stop.restore()


def test_a_signal_during_a_token_store_build_leaves_no_store(tmp_path):
    """A real SIGTERM mid-build (interrupt mode, as in preflight): nothing counts as built."""
    import os
    import signal

    from aleph.data.tokenizer import load_tokenizer, train_wordpiece
    from aleph.data.tokens import build_token_store
    from aleph.train.signals import StopFlag, StopRequested

    captions = [f"a cat number {i}" for i in range(64)]
    train_wordpiece(captions, tmp_path / "tok")
    tok = load_tokenizer(tmp_path / "tok")
    calls = []

    class SignalOnSecondBatch(list):
        """The captions; the builder reads them a batch (a slice) at a time."""

        def __getitem__(self, item):
            if isinstance(item, slice):
                calls.append(1)
                if len(calls) == 2:
                    os.kill(os.getpid(), signal.SIGTERM)
            return super().__getitem__(item)

    out = tmp_path / "cache" / "store"
    stop = StopFlag("interrupt")
    try:
        with pytest.raises(StopRequested):
            build_token_store(SignalOnSecondBatch(captions), tok, out, 16, batch=16)
    finally:
        stop.restore()
    assert len(calls) == 2
    assert not out.exists() and list(out.parent.iterdir()) == []  # no store, no staging leftovers
    assert build_token_store(captions, tok, out, 16).rows == 64  # a restart builds it whole


def test_position_advances_across_epochs_and_resumes_on_the_right_rows():
    from aleph.train.step import advance

    order = DataOrder(3, 70, 16)  # 4 full batches per epoch; 6 rows dropped each epoch
    pos, seen = ckpt.Position(0, 0, 0, 0), {0: [], 1: []}
    for _ in range(8):
        seen[pos.epoch].append(order.indices(pos.epoch, pos.batch_in_epoch, World()))
        pos = advance(pos, order, 0.0)
        if pos.step == 4:  # the state a resume after epoch 0 starts from
            assert (pos.epoch, pos.batch_in_epoch, pos.samples_seen) == (1, 0, 64)
    assert (pos.step, pos.epoch, pos.batch_in_epoch, pos.samples_seen) == (8, 2, 0, 128)
    for epoch, batches in seen.items():
        rows = np.concatenate(batches)
        assert len(set(rows.tolist())) == 64  # no row twice within an epoch
        assert np.array_equal(rows, order.permutation(epoch)[:64])  # the epoch's own order


# Ops that make the host wait for the device (each a full drain of the GPU queue):
# .item()/float()/bool()/int() all reach aten._local_scalar_dense; nonzero, masked_select
# and unique size their output from the data, as does indexing with a boolean mask.
SYNC_OPS = {"_local_scalar_dense", "nonzero", "masked_select", "_unique2", "unique_dim",
            "unique_consecutive"}
MASK_INDEX_OPS = {"index", "index_put", "index_put_"}


def _is_sync(name: str, args) -> bool:
    if name in SYNC_OPS:
        return True
    return name in MASK_INDEX_OPS and any(
        t is not None and t.dtype in (torch.bool, torch.uint8) for t in args[1])


class SyncCounter:
    """Counts host synchronisations inside a block, at the dispatcher and at the methods
    that never dispatch on CPU (tolist, numpy, cpu): a new `.item()`, `float(t)`, `if t:`,
    `t.tolist()` or boolean-mask index anywhere in the step (model, loss, loop) is counted.

    The optimiser's step counters are excluded: they are host tensors unless fused=True
    (then on the device, never read by the host), so reading them never waits for the GPU.
    """

    def __init__(self, exclude=()) -> None:
        self.exclude = {id(t) for t in exclude}
        self.calls: list[str] = []

    def __enter__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                name = func.overloadpacket.__name__
                if _is_sync(name, args) and not any(id(a) in counter.exclude for a in args):
                    counter.calls.append(name)
                return func(*args, **(kwargs or {}))

        self._saved = {m: getattr(torch.Tensor, m) for m in ("tolist", "numpy", "cpu")}
        for name, orig in self._saved.items():
            setattr(torch.Tensor, name, self._counting(name, orig))
        self._mode = Mode()
        self._mode.__enter__()
        return self

    def _counting(self, name, orig):
        def method(t, *args, **kwargs):
            self.calls.append(name)
            return orig(t, *args, **kwargs)
        return method

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)
        for name, orig in self._saved.items():
            setattr(torch.Tensor, name, orig)


@pytest.mark.parametrize("arm", ["a2_dense", "a1_anchored"])
def test_a_training_step_synchronises_with_the_host_once(arm):
    """Was 4 (loss.item() before backward, the clipped norm, nce and mse after the step)."""
    cfg = resolve("smoke", arm=arm)
    torch.manual_seed(0)
    model = build_model(ModelConfig(arm=arm, vocab_size=50, max_len=8, d_model=16, n_layers=2,
                                    n_heads=2, ffn_dense=32, ffn_expert=8))
    t = step_trainer(cfg, model, 10)
    ids, mask = torch.randint(5, 50, (4, 8)), torch.ones(4, 8, dtype=torch.bool)
    mask[:, 6:] = False
    good = torch.nn.functional.normalize(torch.randn(4, 768), dim=-1)
    train_step(t, (ids, mask, good))  # the optimiser state exists from here on
    with SyncCounter(s["step"] for s in t.opt.state.values()) as sync:
        res = train_step(t, (ids, mask, good))
    assert sync.calls == ["tolist"]
    assert list(res.values) == ["loss", "nce", "mse", "grad_norm"]
    assert all(isinstance(v, float) for v in res.values.values())
    with SyncCounter() as probe:  # the counter itself sees what it is meant to see
        torch.ones(2).sum().item()
        bool(torch.ones(2).any())
        torch.ones(2)[torch.ones(2) > 0].numpy()
    assert probe.calls == ["_local_scalar_dense", "_local_scalar_dense", "index", "numpy"]


def test_ranks_agree_on_stop_and_timed_save_every_16_steps_not_every_step():
    """Under DDP the agreement is a collective whose result the host reads (a sync)."""
    from dataclasses import dataclass, field

    from aleph.train.loop import AGREE_EVERY_STEPS, Clock, after_step
    from aleph.train.signals import StopFlag

    @dataclass(frozen=True)
    class Counting(World):
        calls: list = field(default_factory=list)

        def any_flag(self, *flags):
            self.calls.append(flags)
            return [True, True]  # rank r's timed save is due and a signal came on rank r

    for size, expected in ((2, [16, 32]), (1, list(range(1, 33)))):
        world = Counting(rank=0, size=size)
        cfg = resolve("smoke", overrides=["ckpt_every_steps=0", "weights_every_steps=0"])
        agreed = []
        stop = StopFlag("flag")
        try:
            t = step_trainer(cfg, tiny_trainer()[1], 32, world)
            for step in range(1, 33):
                t.pos, t.total_steps = ckpt.Position(step, 0, step, 0), step  # last: no save
                saved, stopping = after_step(t, stop, Clock(0.0))
                if stopping:
                    agreed.append(step)
        finally:
            stop.restore()
        assert AGREE_EVERY_STEPS == 16 and agreed == expected and len(world.calls) == len(expected)
