"""Per-rank RNG state in resume states: this rank's own CUDA device only, and a derived
per-rank stream when a state saved without CUDA is resumed on CUDA."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from aleph.record.layout import RunLayout
from aleph.train import checkpoint as ckpt


def test_cpu_state_holds_no_cuda_generator_and_restores_every_stream():
    torch.manual_seed(5)
    random.seed(5)
    np.random.seed(5)
    state = ckpt.rng_state(torch.device("cpu"))
    assert set(state) == {"python", "numpy", "torch"}
    drawn = (random.random(), np.random.rand(), torch.rand(3))
    random.seed(9)
    np.random.seed(9)
    torch.manual_seed(9)
    assert ckpt.set_rng_state(state, torch.device("cpu"), 123) == ""
    again = (random.random(), np.random.rand(), torch.rand(3))
    assert drawn[:2] == again[:2] and torch.equal(drawn[2], again[2])


def test_derived_streams_differ_per_rank_and_step():
    seeds = {ckpt.stream_seed(7, r, 40) for r in range(8)}
    assert len(seeds) == 8  # eight ranks, eight dropout streams
    assert ckpt.stream_seed(7, 0, 40) != ckpt.stream_seed(7, 0, 41)
    assert all(0 <= s < 2**32 for s in seeds)


def test_a_cuda_state_in_list_form_is_refused_in_one_line(tmp_path):
    """A trainer.pt whose CUDA RNG state is get_rng_state_all's list (every visible device,
    an earlier trainer's format) is not read: one line naming the file and the field."""
    from aleph.errors import StoreError
    from aleph.model import ModelConfig, build_model
    from aleph.train.config import resolve
    from aleph.train.optim import make_optimizer, make_scheduler

    cfg = resolve("smoke", arm="a2_dense")
    model = build_model(ModelConfig(arm="a2_dense", vocab_size=50, max_len=8, d_model=16,
                                    n_layers=1, n_heads=2, ffn_dense=32))
    opt = make_optimizer(model, cfg)
    sched = make_scheduler(opt, cfg, 10)
    listed = dict(ckpt.rng_state(), cuda=[torch.zeros(16, dtype=torch.uint8)])
    ckpt.save(tmp_path, model, opt, sched, ckpt.Position(2, 0, 2, 8), [listed], "h", keep=2)
    state = RunLayout(tmp_path).state_dir(2)
    with pytest.raises(StoreError) as e:
        ckpt.load(state, model, opt, sched)
    assert str(e.value).startswith(f"{state / 'trainer.pt'}: refused as a resume state: "
                                   "rng[0].cuda: expected one ByteTensor (the rank's own device)")
    assert "\n" not in str(e.value)


@pytest.mark.gpu
def test_cuda_state_is_this_device_only_and_round_trips():
    dev = torch.device("cuda", torch.cuda.device_count() - 1)
    torch.cuda.manual_seed_all(3)
    state = ckpt.rng_state(dev)
    assert isinstance(state["cuda"], torch.Tensor) and state["cuda_device"] == dev.index
    drawn = torch.rand(4, device=dev)
    torch.cuda.manual_seed_all(4)
    assert ckpt.set_rng_state(state, dev) == "restored"
    assert torch.equal(torch.rand(4, device=dev), drawn)


@pytest.mark.gpu
def test_cpu_saved_state_resumed_on_cuda_gives_each_rank_its_own_stream():
    dev = torch.device("cuda", 0)
    state = ckpt.rng_state(torch.device("cpu"))
    draws = []
    for rank in (0, 1):
        torch.cuda.manual_seed_all(0)  # as a fresh process seeded with the config seed
        assert ckpt.set_rng_state(state, dev, ckpt.stream_seed(0, rank, 10)) == "derived"
        draws.append(torch.rand(8, device=dev))
    assert not torch.equal(draws[0], draws[1])
