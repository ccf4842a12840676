"""Tests of lnbook.experiments.handwriting (section 6.5): data, mixture density loss, model."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from lnbook.experiments import handwriting as HW
from lnbook.experiments import load_results
from lnbook.norms import LayerNorm


@pytest.fixture(scope="module")
def lines() -> torch.Tensor:
    return HW.make_handwriting(40, 300, seed=5)


# ----------------------------------------------------------------------------- data


def test_handwriting_shapes_start_point_and_bits(lines):
    assert lines.shape == (40, 301, 3) and lines.dtype == torch.float32
    assert torch.all(lines[:, 0] == 0)  # the zero start point
    assert set(lines[..., 2].unique().tolist()) <= {0.0, 1.0}


def test_handwriting_is_deterministic_under_its_seed():
    a, b = HW.make_handwriting(3, 80, seed=1), HW.make_handwriting(3, 80, seed=1)
    assert torch.equal(a, b)
    assert not torch.equal(a, HW.make_handwriting(3, 80, seed=2))


def test_handwriting_looks_like_cursive(lines):
    d = lines[:, 1:]  # (N, T, 3)
    # offsets of order 1 in the model's units, so the mixture starts at a sensible scale
    std = d[..., :2].reshape(-1, 2).std(0)
    assert torch.all(std > 0.5) and torch.all(std < 3.0)
    # several strokes per line: the pen is lifted between words
    lifts = d[..., 2].sum(1)
    assert lifts.min() >= 3
    # the pen moves right on the whole, but backwards while drawing loops (pen down)
    down = d[..., 2] == 0
    dx = d[..., 0][down]
    assert d[..., 0].sum(1).min() > 0
    assert 0.03 < float((dx < 0).double().mean()) < 0.4
    # the letters go up and (descenders) below the baseline
    y = torch.cumsum(d[..., 1], dim=1)
    assert float(y.max()) > 5 and float(y.min()) < -5


def test_handwriting_lines_differ_in_slant(lines):
    # slant couples the horizontal and vertical pen speed; it varies from line to line
    d = lines[:, 1:].double()
    corr = [np.corrcoef(s[:, 0], s[:, 1])[0, 1] for s in d.numpy()]
    assert np.ptp(corr) > 0.2


def test_strokes_split_at_end_of_stroke_bits():
    seq = torch.tensor([[10.0, 0, 0], [10, 0, 1], [10, 10, 0], [0, 10, 0], [0, 10, 1]])
    parts = HW.strokes(seq)
    assert len(parts) == 2 and [len(p) for p in parts] == [2, 3]
    np.testing.assert_allclose(parts[0][-1], [2.0, 0.0])  # 0.1 pen units per offset unit
    np.testing.assert_allclose(parts[1][-1], [3.0, 3.0])
    with pytest.raises(ValueError, match=r"\(T, 3\)"):
        HW.strokes(torch.zeros(4, 2))


def test_bad_data_arguments_raise():
    with pytest.raises(ValueError, match="seq_len"):
        HW.make_handwriting(2, 1, seed=0)
    with pytest.raises(ValueError, match="n must be"):
        HW.make_handwriting(0, 10, seed=0)


# ----------------------------------------------------------------------------- mixture


def _nll_float64(y: np.ndarray, x: np.ndarray, M: int) -> np.ndarray:
    """The mixture NLL written out per component with densities, in float64 numpy."""
    out = np.zeros(y.shape[0])
    for n in range(y.shape[0]):
        pi_raw, mu, ls, rho_raw, e = np.split(y[n], [M, 3 * M, 5 * M, 6 * M])
        pi = np.exp(pi_raw - pi_raw.max())
        pi /= pi.sum()
        dens = 0.0
        for j in range(M):
            m1, m2 = mu[2 * j], mu[2 * j + 1]
            s1, s2 = np.exp(ls[2 * j]), np.exp(ls[2 * j + 1])
            r = np.tanh(rho_raw[j]) * (1 - 1e-5)
            z1, z2 = (x[n, 0] - m1) / s1, (x[n, 1] - m2) / s2
            Z = z1 * z1 + z2 * z2 - 2 * r * z1 * z2
            norm = 2 * np.pi * s1 * s2 * np.sqrt(1 - r * r)
            dens += pi[j] * np.exp(-Z / (2 * (1 - r * r))) / norm
        p_eos = 1 / (1 + np.exp(-e[0]))
        out[n] = -np.log(dens) - (np.log(p_eos) if x[n, 2] == 1 else np.log(1 - p_eos))
    return out


@pytest.mark.parametrize("M", [1, 3, 7])
def test_mixture_nll_matches_a_float64_density_computation(M):
    g = torch.Generator().manual_seed(M)
    y = torch.randn(50, 6 * M + 1, generator=g, dtype=torch.float64)
    x = torch.randn(50, 3, generator=g, dtype=torch.float64)
    x[:, 2] = (torch.rand(50, generator=g) < 0.3).double()
    ours = HW.mixture_nll(HW.split_mixture_params(y, M), x)
    ref = _nll_float64(y.numpy(), x.numpy(), M)
    np.testing.assert_allclose(ours.numpy(), ref, rtol=1e-10, atol=1e-10)
    ours32 = HW.mixture_nll(HW.split_mixture_params(y.float(), M), x.float())
    np.testing.assert_allclose(ours32.numpy(), ref, rtol=1e-4, atol=1e-4)


def test_mixture_nll_of_one_uncorrelated_component_is_two_gaussians():
    M = 1
    y = torch.zeros(1, 7, dtype=torch.float64)
    y[0, 1:3] = torch.tensor([0.5, -1.0], dtype=torch.float64)  # mu
    y[0, 3:5] = torch.tensor([math.log(2.0), math.log(0.5)], dtype=torch.float64)
    x = torch.tensor([[1.5, 0.0, 0.0]], dtype=torch.float64)
    nll = HW.mixture_nll(HW.split_mixture_params(y, M), x)
    g1 = 0.5 * math.log(2 * math.pi * 4.0) + (1.0 / 2.0) ** 2 / 2
    g2 = 0.5 * math.log(2 * math.pi * 0.25) + (1.0 / 0.5) ** 2 / 2
    assert float(nll) == pytest.approx(g1 + g2 + math.log(2.0), rel=1e-9)  # eos p = 1/2


def test_mixture_nll_stays_finite_far_from_every_component():
    y = torch.zeros(1, 13)
    y[0, 5:9] = -5.0  # tiny sigmas
    x = torch.tensor([[1e3, -1e3, 1.0]])
    assert torch.isfinite(HW.mixture_nll(HW.split_mixture_params(y, 2), x)).all()


def test_split_mixture_params_ranges_and_errors():
    p = HW.split_mixture_params(torch.randn(4, 5, 31) * 10, 5)
    torch.testing.assert_close(p.log_pi.exp().sum(-1), torch.ones(4, 5))
    assert p.mu.shape == (4, 5, 5, 2) and p.rho.abs().max() < 1
    with pytest.raises(ValueError, match="6M \\+ 1"):
        HW.split_mixture_params(torch.randn(2, 30), 5)


# ----------------------------------------------------------------------------- model


def test_model_nll_is_causal_and_matches_forward():
    torch.manual_seed(0)
    model = HW.HandwritingModel(16, num_layers=2, n_mixtures=3, layer_norm=True)
    seq = HW.make_handwriting(3, 20, seed=0)
    nll = model.nll(seq)  # (3, 20)
    assert nll.shape == (3, 20)
    torch.testing.assert_close(model(seq), nll.mean())
    changed = seq.clone()
    changed[:, 12:] += 5.0  # points 12.. are predicted at positions 11..
    nll2 = model.nll(changed)
    torch.testing.assert_close(nll2[:, :11], nll[:, :11])
    assert not torch.allclose(nll2[:, 11:], nll[:, 11:])


def test_model_uses_layer_norm_only_when_asked():
    with_ln = HW.HandwritingModel(8, 2, 2, layer_norm=True)
    without = HW.HandwritingModel(8, 2, 2, layer_norm=False)
    assert sum(isinstance(m, LayerNorm) for m in with_ln.modules()) == 6
    assert not any(isinstance(m, LayerNorm) for m in without.modules())
    # skip connections: layer 2 reads the point and layer 1's output
    assert with_ln.layers[1].input_size == 3 + 8 and with_ln.head.in_features == 16


def test_sample_is_deterministic_and_well_formed():
    torch.manual_seed(0)
    model = HW.HandwritingModel(8, 1, 2)
    a, b = model.sample(30, seed=3), model.sample(30, seed=3)
    assert a.shape == (30, 3) and torch.equal(a, b)
    assert set(a[:, 2].tolist()) <= {0.0, 1.0}
    assert not torch.equal(a, model.sample(30, seed=4))


# ----------------------------------------------------------------------------- experiment


def test_get_config_presets_and_errors():
    paper = HW.get_config("paper")
    assert (paper.hidden_size, paper.num_layers, paper.n_mixtures) == (400, 3, 20)
    assert paper.batch_size == 8 and paper.seq_len == 700
    assert HW.get_config("quick").batch_size == 8
    with pytest.raises(ValueError, match="scale"):
        HW.get_config("tiny")
    with pytest.raises(ValueError, match="unknown Config fields"):
        HW.get_config("quick", layers=2)


def test_run_writes_json_results(tmp_path):
    cfg = HW.get_config("quick", seq_len=12, n_train=16, n_valid=4, hidden_size=8,
                        n_mixtures=2, steps=2, eval_every=1, seeds=(0,))
    res = HW.run(cfg, device="cpu", out=tmp_path, progress=False)
    back = load_results(tmp_path / "handwriting.json")
    assert json.loads(json.dumps(res)) == back
    h = back["histories"]["layer_norm"]["0"]
    assert h["eval_steps"] == [0, 1, 2] and len(h["losses"]) == 2
    assert back["final_nll"]["baseline"]["0"] == pytest.approx(h_last(back, "baseline"))


def h_last(results: dict, variant: str) -> float:
    return results["histories"][variant]["0"]["metrics"][-1]["nll"]
