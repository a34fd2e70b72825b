"""Weight initialisation (ModelConfig.init): the E1-form orthogonal scheme, the former
normal(0, 0.02), what each parameter starts as, and anchor drift as 1 - cos(anchor, home)."""

from __future__ import annotations

import math

import pytest
import torch

from aleph.errors import ConfigError
from aleph.model import ARMS, ModelConfig, build_model, count_parameters
from aleph.model.config import INIT_SCHEMES


def _is_orthogonal(w: torch.Tensor) -> bool:
    """W W^T = I on the smaller side (orthonormal rows if wide, orthonormal columns if tall)."""
    w = w.detach().double()
    gram = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
    return torch.allclose(gram, torch.eye(min(w.shape), dtype=gram.dtype), rtol=0, atol=1e-5)


def _matrices(model) -> dict[str, torch.Tensor]:
    """Every matrix that the init scheme decides, by name: a bank's trunk in/out and each
    expert's input block of the merged w_in on their own (the expert output blocks start at
    zero), every other 2-D parameter except the embeddings and the anchors."""
    out = {}
    for name, p in model.named_parameters():
        if name.endswith(("ffn.w_in", "ffn.w_out")):  # a bank's merged (trunk + K experts) maps
            bank = model.get_submodule(name.rsplit(".", 1)[0])
            side = name.rsplit("_", 1)[1]
            out.update({f"{name}[{k}]": v for k, v in bank.blocks().items()
                        if k.endswith(side) and (k.startswith("trunk") or side == "in")})
        elif p.ndim == 2 and not name.startswith(("tok.", "pos.")) and "address" not in name:
            out[name] = p
    return out


# d_model 64 with ffn_expert 96 and ffn_dense 256: wide and tall matrices of every kind
SHAPES = dict(d_model=64, ffn_expert=96, ffn_dense=256)


@pytest.mark.parametrize("arm", ARMS)
def test_e1_orthogonal_makes_every_matrix_orthogonal(arm, tiny):
    torch.manual_seed(0)
    model = build_model(tiny(arm, **SHAPES))
    assert model.config.init == "e1_orthogonal"  # the default
    mats = _matrices(model)
    shapes = {tuple(w.shape) for w in mats.values()}
    assert any(a < b for a, b in shapes) and any(a > b for a, b in shapes)  # both sides tested
    not_orthogonal = [n for n, w in mats.items() if not _is_orthogonal(w)]
    assert not_orthogonal == []
    ffn = [n for n in mats if ".ffn." in n]
    expected_ffn = 2 * 2 + (2 * 3 if model.banks() else 0)  # per block: 2 trunk/dense + K experts
    assert len(ffn) == expected_ffn, ffn
    for bank in model.banks():
        views = bank.blocks()
        assert not torch.equal(views["0_in"], views["1_in"])  # each expert its own draw
        for k in range(3):
            assert torch.equal(views[f"{k}_out"], torch.zeros_like(views[f"{k}_out"]))
        assert torch.equal(bank.gates, torch.full_like(bank.gates, -3.0))


@pytest.mark.parametrize("arm", ARMS)
def test_every_parameter_starts_as_its_scheme_says(arm, tiny):
    """No parameter escapes the scheme: decided matrices, embeddings normal(0.02), biases
    zero, LayerNorm 1/0, bank w_out zero, gates gate_init, anchors unit rows."""
    torch.manual_seed(0)
    model = build_model(tiny(arm, **SHAPES))
    decided = {n.split("[")[0] for n in _matrices(model)}
    for name, p in model.named_parameters():
        if name.endswith("ffn.w_out"):  # the trunk's rows are decided, the experts' are zero
            bank = model.get_submodule(name.rsplit(".", 1)[0])
            assert torch.equal(p[bank.ff:], torch.zeros_like(p[bank.ff:])), name
        if name in decided:
            continue
        if name.startswith(("tok.", "pos.")):
            assert abs(p.std().item() - 0.02) < 0.002, name
        elif name.endswith("bias"):
            assert torch.equal(p, torch.zeros_like(p)), name
        elif "ln" in name and name.endswith("weight"):
            assert torch.equal(p, torch.ones_like(p)), name
        elif name.endswith("gates"):
            assert torch.equal(p, torch.full_like(p, model.config.gate_init)), name
        elif name.endswith("address.anchors"):
            torch.testing.assert_close(p.norm(dim=-1), torch.ones(p.shape[0]))
        else:
            pytest.fail(f"parameter {name} {tuple(p.shape)} has no rule in this test")


@pytest.mark.parametrize("arm", ARMS)
def test_normal_002_gives_std_002_and_no_orthogonal_matrix(arm, tiny):
    torch.manual_seed(0)
    model = build_model(tiny(arm, init="normal_0.02", **SHAPES))
    for name, w in _matrices(model).items():
        # >= 4,096 draws each: the sample std is within ~1.1% of 0.02 (one standard error)
        assert abs(w.std().item() - 0.02) < 0.02 * 0.05, (name, w.std().item())
        assert abs(w.mean().item()) < 0.002, name
        assert not _is_orthogonal(w), name


def test_the_two_schemes_draw_different_matrices_of_equal_shape(tiny):
    torch.manual_seed(0)
    a = build_model(tiny("a1_anchored", init="e1_orthogonal", **SHAPES)).state_dict()
    torch.manual_seed(0)
    b = build_model(tiny("a1_anchored", init="normal_0.02", **SHAPES)).state_dict()
    assert {k: v.shape for k, v in a.items()} == {k: v.shape for k, v in b.items()}
    assert not torch.equal(a["blocks.0.ffn.w_in"], b["blocks.0.ffn.w_in"])


@pytest.mark.parametrize("arm", ARMS)
def test_parameter_counts_do_not_depend_on_the_init(arm):
    counts = {}
    for init in INIT_SCHEMES:
        with torch.device("meta"):  # the E1 shape, shapes only
            model = build_model(ModelConfig(arm=arm, vocab_size=30522, init=init))
        counts[init] = (count_parameters(model),
                        {k: tuple(v.shape) for k, v in model.state_dict().items()})
    assert counts["e1_orthogonal"] == counts["normal_0.02"]


@pytest.mark.parametrize("init", INIT_SCHEMES)
def test_a_seed_gives_the_same_init_twice(init, tiny):
    states = []
    for _ in range(2):
        torch.manual_seed(3)
        states.append(build_model(tiny("a1_anchored", init=init)).state_dict())
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])


# --- the config field -------------------------------------------------------------------

def test_unknown_init_names_the_field_and_the_schemes():
    with pytest.raises(ConfigError) as e:
        ModelConfig(arm="a1_anchored", vocab_size=10, init="xavier")
    msg = str(e.value)
    assert "ModelConfig.init" in msg and "'xavier'" in msg
    assert all(s in msg for s in INIT_SCHEMES)


def test_init_round_trips_and_a_config_without_it_is_refused_in_one_line():
    cfg = ModelConfig(arm="a2_dense", vocab_size=99, init="normal_0.02")
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    old = ModelConfig(arm="a2_dense", vocab_size=99).to_dict()
    del old["init"]  # a model_config.json written before the field existed
    with pytest.raises(ConfigError) as e:
        ModelConfig.from_dict(old, source="w/model_config.json")
    assert str(e.value) == "w/model_config.json: missing required field(s) ['init']"


# --- anchor drift ----------------------------------------------------------------------

@pytest.mark.parametrize("arm", ["a1_anchored", "a3_random"])
def test_drift_is_zero_at_init_and_one_minus_cos_after_a_rotation(arm, tiny):
    torch.manual_seed(0)
    model = build_model(tiny(arm, n_layers=1))
    h = model.health()
    assert abs(h["layer00/anchor_drift"]) < 1e-6 and abs(h["layer00/anchor_drift_max"]) < 1e-6
    bank = model.banks()[0]
    home = bank.address.anchors_init.clone()  # (K, D) unit rows
    angles = [0.3, 1.0, 2.5]  # radians, one per anchor
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for k, theta in enumerate(angles):
            u = torch.randn(home.shape[1], generator=g)
            u = u - (u @ home[k]) * home[k]
            u = u / u.norm()  # unit, orthogonal to home[k]
            # rotate by theta in the (home, u) plane, and change the length: only the
            # direction may count
            bank.address.anchors[k] = 3.0 * (math.cos(theta) * home[k] + math.sin(theta) * u)
    expected = [1 - math.cos(t) for t in angles]
    torch.testing.assert_close(bank.address.drift().double(), torch.tensor(expected, dtype=torch.float64),
                               rtol=0, atol=1e-6)
    h = model.health()
    assert h["layer00/anchor_drift"] == pytest.approx(sum(expected) / 3, abs=1e-6)
    assert h["layer00/anchor_drift_max"] == pytest.approx(max(expected), abs=1e-6)
