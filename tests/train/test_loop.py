"""Loop pieces in-process: data order, schedule, finite checks, checkpoint completeness."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aleph.errors import AlephError, NonFiniteError
from aleph.model import ModelConfig, build_model
from aleph.train import checkpoint as ckpt
from aleph.train.config import resolve
from aleph.train.distributed import World
from aleph.train.loop import (
    DataOrder,
    lr_factor,
    make_optimizer,
    make_scheduler,
    train_step,
)


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


def _tiny():
    cfg = resolve("smoke", arm="a2_dense")
    torch.manual_seed(0)
    model = build_model(ModelConfig(arm="a2_dense", vocab_size=50, max_len=8, d_model=16,
                                    n_layers=1, n_heads=2, ffn_dense=32))
    opt = make_optimizer(model, cfg)
    return cfg, model, opt, make_scheduler(opt, cfg, 10)


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
    cfg, model, opt, sched = _tiny()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids, mask = torch.randint(5, 50, (4, 8)), torch.ones(4, 8, dtype=torch.bool)
    target = torch.full((4, 768), float("nan"))
    with pytest.raises(NonFiniteError, match="step 7: loss is nan"):
        train_step(model, opt, sched, ids, mask, target, cfg, World(), 6, torch.device("cpu"))
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    good = torch.nn.functional.normalize(torch.randn(4, 768), dim=-1)
    res = train_step(model, opt, sched, ids, mask, good, cfg, World(), 0, torch.device("cpu"))
    assert np.isfinite(res.loss) and res.grad_norm > 0
    assert not all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_only_complete_checkpoints_count_and_two_are_kept(tmp_path):
    cfg, model, opt, sched = _tiny()
    for step in (3, 6, 9):
        pos = ckpt.Position(step, 0, step, step * 4, 1.0)
        ckpt.save(tmp_path, model, opt, sched, pos, [ckpt.rng_state()], "h", keep=2)
    assert [p.name for p in ckpt.complete_steps(tmp_path)] == ["step-00000006", "step-00000009"]
    torn = ckpt.step_dir(tmp_path, 12)
    torn.mkdir()
    (torn / "meta.json").write_text("{}")  # a killed save: no COMPLETE marker
    path, meta = ckpt.latest(tmp_path)
    assert meta["step"] == 9 and path.name == "step-00000009"
    assert ckpt.remove_incomplete(tmp_path) == ["step-00000012"]
    pos, rngs, _ = ckpt.load(path, model, opt, sched)
    assert pos.samples_seen == 36 and len(rngs) == 1


def test_eta_format_does_not_wrap_at_a_day():
    from aleph.train.fit import fmt_duration

    assert fmt_duration(59.6) == "00:01:00"
    assert fmt_duration(3 * 86400 + 3723) == "3d 01:02:03"


def test_nonfinite_gradient_stops_before_the_update():
    cfg, model, opt, sched = _tiny()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    next(model.parameters()).register_hook(lambda g: g * float("inf"))  # finite loss, inf grad
    ids, mask = torch.randint(5, 50, (4, 8)), torch.ones(4, 8, dtype=torch.bool)
    good = torch.nn.functional.normalize(torch.randn(4, 768), dim=-1)
    with pytest.raises(NonFiniteError, match=r"step 3: gradient norm is (inf|nan) \(loss \d"):
        train_step(model, opt, sched, ids, mask, good, cfg, World(), 2, torch.device("cpu"))
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_nonfinite_error_is_an_aleph_error_with_its_own_exit_code():
    from aleph import errors

    assert issubclass(NonFiniteError, AlephError) and NonFiniteError.__doc__
    assert NonFiniteError.exit_code == 65
    others = {c.exit_code for c in vars(errors).values()
              if isinstance(c, type) and issubclass(c, AlephError) and c is not NonFiniteError}
    assert 65 not in others


def _token_store(tmp_path):
    """A real token store whose rows have clearly different lengths (3 .. 9 tokens of 12)."""
    from aleph.data.tokenizer import load_tokenizer, train_wordpiece
    from aleph.data.tokens import build_token_store

    captions = [" ".join(["cat"] * (1 + i % 7)) for i in range(32)]
    train_wordpiece(captions, tmp_path / "tok")
    return build_token_store(captions, load_tokenizer(tmp_path / "tok"), tmp_path / "store", 12)


def test_batches_have_max_len_when_compiled_and_trimmed_otherwise(tmp_path):
    from types import SimpleNamespace

    from aleph.train.fit import load_batch

    tokens = _token_store(tmp_path)
    widths = {}
    for compiled in (False, True):
        cfg = resolve("smoke", overrides=[f"compile={str(compiled).lower()}"], arm="a2_dense")
        s = SimpleNamespace(cfg=cfg, tokens=tokens, order=DataOrder(0, tokens.rows, 4), world=World(),
                            targets=SimpleNamespace(gather=lambda idx, pin: torch.zeros(len(idx), 768)),
                            device=torch.device("cpu"), pos=ckpt.Position(0, 0, 0, 0))
        seen = []
        for b in range(s.order.steps_per_epoch):
            s.pos = ckpt.Position(b, 0, b, 4 * b)
            ids, mask, target = load_batch(s)
            assert ids.shape == mask.shape and target.shape == (4, 768)
            trimmed_ids, trimmed_mask = tokens.gather(s.order.indices(0, b, World()))
            width = trimmed_ids.shape[1]
            assert torch.equal(ids[:, :width], trimmed_ids) and torch.equal(mask[:, :width], trimmed_mask)
            assert (ids[:, width:] == tokens.pad_id).all() and not mask[:, width:].any()
            seen.append(ids.shape[1])
        widths[compiled] = set(seen)
    assert len(widths[False]) > 1  # trimmed to each batch's longest row: the length varies
    assert widths[True] == {tokens.max_len}  # compiled: one static shape, no recompiles


def test_fixed_length_refuses_a_batch_longer_than_max_len():
    from aleph.train.loop import fixed_length

    ids, mask = torch.ones(2, 5, dtype=torch.long), torch.ones(2, 5, dtype=torch.bool)
    assert fixed_length(ids, mask, 5, 0)[0] is ids
    with pytest.raises(ValueError, match="batch length 5 exceeds max_len 4"):
        fixed_length(ids, mask, 4, 0)


def test_stop_flag_modes_with_real_signals():
    import os
    import signal

    from aleph.train.loop import StopFlag, StopRequested

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
    from aleph.train.loop import StopFlag, StopRequested

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
    from aleph.train.fit import advance

    order = DataOrder(3, 70, 16)  # 4 full batches per epoch; 6 rows dropped each epoch
    pos, seen = ckpt.Position(0, 0, 0, 0), {0: [], 1: []}
    for _ in range(8):
        seen[pos.epoch].append(order.indices(pos.epoch, pos.batch_in_epoch, World()))
        pos = advance(pos, order.steps_per_epoch, 16, 0.0)
        if pos.step == 4:  # the state a resume after epoch 0 starts from
            assert (pos.epoch, pos.batch_in_epoch, pos.samples_seen) == (1, 0, 64)
    assert (pos.step, pos.epoch, pos.batch_in_epoch, pos.samples_seen) == (8, 2, 0, 128)
    for epoch, batches in seen.items():
        rows = np.concatenate(batches)
        assert len(set(rows.tolist())) == 64  # no row twice within an epoch
        assert np.array_equal(rows, order.permutation(epoch)[:64])  # the epoch's own order
