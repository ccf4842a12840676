"""Tests of lnbook.experiments.handwriting (section 6.5): data, mixtures, LSTMs, model, run."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import assert_same_runs

from lnbook import LSTM, LayerNorm
from lnbook.engine import Stack, load_results
from lnbook.engine.results import Results, Run
from lnbook.engine.store import results_file
from lnbook.engine.train import History
from lnbook.experiments import handwriting as HW
from lnbook.seeds import verdict_seeds


@pytest.fixture(scope="module")
def lines() -> HW.Lines:
    return HW.make_handwriting(40, 300, seed=5)


# ----------------------------------------------------------------------------- data


def test_handwriting_shapes_start_point_bits_and_letters(lines):
    pts, let = lines
    assert pts.shape == (40, 301, 3) and pts.dtype == torch.float32
    assert let.shape == (40, 300) and let.dtype == torch.int64
    assert torch.all(pts[:, 0] == 0)  # the zero start point
    assert set(pts[..., 2].unique().tolist()) <= {0.0, 1.0}
    assert set(let.unique().tolist()) == set(range(len(HW.LETTERS)))


def test_handwriting_is_deterministic_under_its_seed():
    a, b = HW.make_handwriting(3, 80, seed=1), HW.make_handwriting(3, 80, seed=1)
    assert torch.equal(a.points, b.points) and torch.equal(a.letters, b.letters)
    assert not torch.equal(a.points, HW.make_handwriting(3, 80, seed=2).points)


def test_handwriting_looks_like_cursive(lines):
    d = lines.points[:, 1:]  # (N, T, 3)
    # offsets of order 1 in the model's units, so the mixture starts at a sensible scale
    std = d[..., :2].reshape(-1, 2).std(0)
    assert torch.all(std > 0.5) and torch.all(std < 3.0)
    # several strokes per line: the pen is lifted between words
    assert d[..., 2].sum(1).min() >= 2
    # the pen moves right on the whole, but backwards while drawing loops (pen down)
    down = d[..., 2] == 0
    assert d[..., 0].sum(1).min() > 0
    assert 0.03 < float((d[..., 0][down] < 0).double().mean()) < 0.4


def test_letters_are_aligned_with_the_pen(lines):
    # the pen's height where each letter is written must follow that letter's shape:
    # descenders (g, y) below the baseline, the others above it, tall letters (l, t) higher
    # than the small ones
    y = torch.cumsum(lines.points[:, 1:, 1], dim=1) * HW.OFFSET_SCALE  # (N, T) pen height
    for k, letter in enumerate(HW.LETTERS):
        yk = y[lines.letters == k]
        if letter.descender:
            assert float(yk.mean()) < -0.2, letter.name
        else:
            assert float(yk.mean()) > 0.1, letter.name
        top = float(torch.quantile(yk, 0.9))
        if letter.height > 1.2:
            assert top > 1.0, letter.name
        elif not letter.descender:
            assert top < 1.0, letter.name


def test_handwriting_lines_differ_in_slant(lines):
    # slant couples the horizontal and vertical pen speed; it varies from line to line
    d = lines.points[:, 1:].double()
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


def test_strokes_cut_after_every_pen_lift_and_keep_every_point():
    def by_hand(seq):  # a stroke runs up to and including a point whose bit is 1
        pos, out, cur = np.cumsum(seq[:, :2] * HW.OFFSET_SCALE, axis=0), [], []
        for p, eos in zip(pos, seq[:, 2], strict=True):
            cur.append(p)
            if eos > 0.5:
                out.append(np.array(cur))
                cur = []
        return out + ([np.array(cur)] if cur else [])

    rng = np.random.default_rng(0)
    for bits in ([0, 0, 0], [1, 1, 1], [0, 1, 1, 0, 1], [1, 0, 0, 0, 0]):
        seq = np.column_stack([rng.normal(size=(len(bits), 2)), bits])
        got, want = HW.strokes(seq), by_hand(seq)
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)


def test_bad_data_arguments_raise():
    with pytest.raises(ValueError, match="seq_len"):
        HW.make_handwriting(2, 1, seed=0)
    with pytest.raises(ValueError, match="n must be"):
        HW.make_handwriting(0, 10, seed=0)


# ----------------------------------------------------------------------------- mixtures


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
    y = torch.zeros(1, 7, dtype=torch.float64)
    y[0, 1:3] = torch.tensor([0.5, -1.0], dtype=torch.float64)  # mu
    y[0, 3:5] = torch.tensor([math.log(2.0), math.log(0.5)], dtype=torch.float64)
    x = torch.tensor([[1.5, 0.0, 0.0]], dtype=torch.float64)
    nll = HW.mixture_nll(HW.split_mixture_params(y, 1), x)
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


def _two_gaussians(n: int = 3000) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    cov_b = np.array([[0.5, 0.3], [0.3, 0.4]])
    a = rng.normal([-3.0, 1.0], [1.0, 0.3], size=(2 * n // 3, 2))
    b = rng.multivariate_normal([2.0, -1.0], cov_b, size=n // 3)
    return np.concatenate([a, b]), cov_b


def test_gaussian_mixture_em_recovers_the_components():
    x, cov_b = _two_gaussians()
    w, mu, cov = HW.fit_gaussian_mixture(x, 2, seed=0, iters=200)
    k = int(np.argmax(mu[:, 0]))  # the component at (2, -1)
    np.testing.assert_allclose(sorted(w), [1 / 3, 2 / 3], atol=0.02)
    np.testing.assert_allclose(mu[k], [2.0, -1.0], atol=0.05)
    np.testing.assert_allclose(mu[1 - k], [-3.0, 1.0], atol=0.05)
    np.testing.assert_allclose(cov[k], cov_b, atol=0.05)
    np.testing.assert_allclose(cov[1 - k], np.diag([1.0, 0.09]), atol=0.05)


def test_gaussian_mixture_log_likelihood_matches_scikit_learn():
    sklearn_mixture = pytest.importorskip("sklearn.mixture")
    x, _ = _two_gaussians()
    params = HW.fit_gaussian_mixture(x, 2, seed=0, iters=200)
    ours = HW._mixture_log_likelihood(x, *params)[0].mean()
    ref = sklearn_mixture.GaussianMixture(2, random_state=0).fit(x).score(x)
    assert ours == pytest.approx(ref, abs=1e-3)
    with pytest.raises(ValueError, match="points"):
        HW.fit_gaussian_mixture(x[:, :1], 2)


def test_mixture_baseline_nll_of_one_gaussian_is_its_entropy():
    # offsets from one isotropic Gaussian, no pen lifts: the NLL per point is the entropy
    # of the Gaussian plus the (tiny) cost of predicting "no lift" with p = 1e-4
    g = torch.Generator().manual_seed(0)
    pts = torch.zeros(200, 51, 3)
    pts[:, 1:, :2] = 1.5 * torch.randn(200, 50, 2, generator=g)
    data = HW.Lines(pts, torch.zeros(200, 50, dtype=torch.int64))
    nll = HW.mixture_baseline_nll(data, data, n_components=1, max_points=10_000)
    entropy = math.log(2 * math.pi * math.e * 1.5**2)
    assert nll == pytest.approx(entropy - math.log1p(-1e-4), abs=0.02)


def test_knowing_the_letter_helps_the_memoryless_predictor():
    train, valid = HW.make_handwriting(64, 100, seed=0), HW.make_handwriting(8, 100, seed=1)
    one = HW.mixture_baseline_nll(train, valid, per_letter=False)
    per_letter = HW.mixture_baseline_nll(train, valid, per_letter=True)
    assert per_letter < one - 0.1


# ----------------------------------------------------------------------------- the LSTMs


def _reference(m: HW.RecurrenceLNLSTM, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor):
    """Eqs. 20-22 (without LN of the input term unless the layer has one), step by step."""
    H, G = m.hidden_size, 4 * m.hidden_size
    gi = F.linear(x, m.weight_ih)
    if m.ln_ih is not None:
        gi = F.layer_norm(gi, (G,), m.ln_ih.weight, m.ln_ih.bias, m.eps)
    outs = []
    for t in range(x.shape[0]):
        a = F.layer_norm(h @ m.weight_hh.t(), (G,), m.ln_hh.weight, None, m.eps)
        i, f, g, o = (a + gi[t] + m.bias).split(H, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        cn = F.layer_norm(c, (H,), m.ln_c.weight, m.ln_c.bias, m.eps)
        h = torch.sigmoid(o) * torch.tanh(cn)
        outs.append(h)
    return torch.stack(outs), h, c


@pytest.mark.parametrize("normalize_input", [False, True])
def test_recurrence_ln_lstm_matches_eqs_20_to_22_with_its_gradients(normalize_input):
    torch.manual_seed(0)
    T, B, I, H = 9, 3, 5, 4
    m = HW.RecurrenceLNLSTM(I, H, normalize_input=normalize_input).double()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.3 * torch.randn_like(p))  # gains and biases away from 1 and 0
    x = torch.randn(T, B, I, dtype=torch.float64, requires_grad=True)
    h0, c0 = torch.randn(2, 1, B, H, dtype=torch.float64)
    out, (h, c) = m(x, (h0, c0))
    ref, h_ref, c_ref = _reference(m, x, h0[0], c0[0])
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    w_out, w_h, w_c = torch.randn_like(out), torch.randn(B, H, dtype=torch.float64), \
        torch.randn(B, H, dtype=torch.float64)
    params = [x, *m.parameters()]
    ours = torch.autograd.grad((out * w_out).sum() + (h[0] * w_h).sum() + (c[0] * w_c).sum(),
                               params)
    theirs = torch.autograd.grad((ref * w_out).sum() + (h_ref * w_h).sum()
                                 + (c_ref * w_c).sum(), params)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_recurrence_ln_lstm_with_input_ln_is_lnbook_lstm():
    torch.manual_seed(1)
    ours = HW.RecurrenceLNLSTM(6, 8, normalize_input=True)
    theirs = LSTM(6, 8, layer_norm=True)
    with torch.no_grad():
        for p in theirs.parameters():
            p.add_(0.2 * torch.randn_like(p))
        sd = dict(theirs.named_parameters())
        ours.weight_ih.copy_(sd["weight_ih_l0"])
        ours.weight_hh.copy_(sd["weight_hh_l0"])
        ours.bias.copy_(sd["bias_ih_l0"] + sd["bias_hh_l0"] + sd["ln_ih_l0.bias"]
                        + sd["ln_hh_l0.bias"])
        ours.ln_ih.weight.copy_(sd["ln_ih_l0.weight"])
        ours.ln_hh.weight.copy_(sd["ln_hh_l0.weight"])
        ours.ln_c.weight.copy_(sd["ln_c_l0.weight"])
        ours.ln_c.bias.copy_(sd["ln_c_l0.bias"])
    x = torch.randn(12, 4, 6)
    torch.testing.assert_close(ours(x)[0], theirs(x)[0], rtol=1e-5, atol=1e-5)


def test_recurrence_ln_lstm_state_carries_over_and_shapes():
    torch.manual_seed(2)
    m = HW.RecurrenceLNLSTM(3, 5)
    x = torch.randn(10, 2, 3)
    whole, (h, c) = m(x)
    first, state = m(x[:4])
    second, (h2, c2) = m(x[4:], state)
    torch.testing.assert_close(torch.cat([first, second]), whole)
    torch.testing.assert_close((h2, c2), (h, c))
    assert whole.shape == (10, 2, 5) and h.shape == c.shape == (1, 2, 5)
    assert m.ln_ih is None and not any(isinstance(p, LayerNorm) and p is m.ln_ih
                                       for p in m.modules())
    assert "normalize_input=False" in repr(m)
    with pytest.raises(ValueError, match=r"\(T, B, 3\)"):
        m(torch.randn(10, 2, 4))
    with pytest.raises(ValueError, match="hidden_size"):
        HW.RecurrenceLNLSTM(3, 0)


def test_match_input_scale_gives_the_input_term_unit_variance():
    torch.manual_seed(3)
    m = HW.RecurrenceLNLSTM(11, 16)
    x = torch.randn(20, 8, 11) * 0.7
    with torch.no_grad():
        before = F.linear(x, m.weight_ih).var(-1, unbiased=False).mean().sqrt()
        factor = m.match_input_scale(x)
        after = F.linear(x, m.weight_ih).var(-1, unbiased=False).mean()
    assert factor == pytest.approx(1 / float(before), rel=1e-5)
    assert float(after) == pytest.approx(1.0, rel=1e-5)
    assert HW.RecurrenceLNLSTM(11, 16, normalize_input=True).match_input_scale(x) == 1.0


# ----------------------------------------------------------------------------- the model


@pytest.mark.parametrize("variant", HW.VARIANTS)
def test_model_nll_is_causal_and_reads_the_letters(variant):
    torch.manual_seed(0)
    model = HW.HandwritingModel(16, num_layers=2, n_mixtures=3, variant=variant)
    pts, let = HW.make_handwriting(3, 20, seed=0)
    nll = model.nll(pts, let)  # (3, 20)
    assert nll.shape == (3, 20)
    torch.testing.assert_close(model(pts, let), nll.mean())
    changed = pts.clone()
    changed[:, 12:] += 5.0  # points 12.. are predicted at positions 11..
    nll2 = model.nll(changed, let)
    torch.testing.assert_close(nll2[:, :11], nll[:, :11])
    assert not torch.allclose(nll2[:, 11:], nll[:, 11:])
    other = let.clone()
    other[:, 7] = (other[:, 7] + 1) % len(HW.LETTERS)  # the letter of point 8
    nll3 = model.nll(pts, other)
    torch.testing.assert_close(nll3[:, :7], nll[:, :7])
    assert not torch.allclose(nll3[:, 7], nll[:, 7])


def test_model_builds_the_lstm_of_each_variant():
    kinds = {v: type(HW.HandwritingModel(8, 2, 2, variant=v).layers[1]) for v in HW.VARIANTS}
    assert kinds == {"baseline": torch.nn.LSTM, "layer_norm": LSTM,
                     "ln_recurrent": HW.RecurrenceLNLSTM}
    model = HW.HandwritingModel(8, 2, 2, variant="layer_norm")
    k = 3 + len(HW.LETTERS)
    assert model.layers[0].input_size == k and model.layers[1].input_size == k + 8
    assert model.head.in_features == 16
    with pytest.raises(ValueError, match="variant must be one of"):
        HW.HandwritingModel(8, variant="batch_norm")


def test_model_rejects_bad_letters():
    model = HW.HandwritingModel(8, 1, 2)
    pts, let = HW.make_handwriting(2, 10, seed=0)
    with pytest.raises(ValueError, match="letters must be int64"):
        model(pts, let[:, :5])
    with pytest.raises(ValueError, match=r"letters must lie in \[0, 8\)"):
        model(pts, let + 8)
    with pytest.raises(ValueError, match="points must be"):
        model(pts[..., :2], let)


def test_match_input_scales_touches_only_ln_recurrent_layers():
    pts, let = HW.make_handwriting(8, 30, seed=0)
    torch.manual_seed(0)
    rec = HW.HandwritingModel(16, 2, 2, variant="ln_recurrent")
    factors = rec.match_input_scales(pts, let)
    assert len(factors) == 2 and all(f > 1 for f in factors)
    with torch.no_grad():
        x = rec._inputs(pts[:, :-1], let)
        var = F.linear(x, rec.layers[0].weight_ih).var(-1, unbiased=False).mean()
    assert float(var) == pytest.approx(1.0, rel=1e-4)
    assert HW.HandwritingModel(16, 2, 2, variant="layer_norm").match_input_scales(pts, let) == []


def test_sample_is_deterministic_and_well_formed():
    torch.manual_seed(0)
    model = HW.HandwritingModel(8, 1, 2, variant="ln_recurrent")
    letters = HW.make_handwriting(1, 30, seed=0).letters[0]
    a, b = model.sample(letters, seed=3), model.sample(letters, seed=3)
    assert a.shape == (30, 3) and torch.equal(a, b)
    assert set(a[:, 2].tolist()) <= {0.0, 1.0}
    assert not torch.equal(a, model.sample(letters, seed=4))


# ----------------------------------------------------------------------------- measuring


def _results(curves: dict[str, list[list[float]]], info: dict | None = None,
             config: dict | None = None) -> Results:
    runs = []
    for v, rows in curves.items():
        for seed, row in enumerate(rows):
            h = History(steps=[1], losses=[0.0], eval_steps=[0, 10, 20],
                        metrics=[{"nll": x} for x in row])
            runs.append(Run(v, seed, h))
    return Results("handwriting", config or {}, "cpu", runs, info=info or {})


def test_race_measures_updates_to_the_baselines_final_value():
    res = _results({"baseline": [[3.0, 2.0, 1.0], [3.0, 2.5, 2.0]],
                    "layer_norm": [[3.0, 1.0, 0.5], [3.0, 3.0, 2.5]]})
    r = HW.race(res, "layer_norm")
    np.testing.assert_allclose(r["target"], [1.0, 2.0])
    np.testing.assert_allclose(r["reference_updates"], [20.0, 20.0])
    # seed 1: LN never reaches 2.0 (inf updates), so its speed-up is 0, a seed against
    assert r["updates"][0] == pytest.approx(10.0) and math.isinf(r["updates"][1])
    np.testing.assert_allclose(r["speedup"], [2.0, 0.0])


def test_c16_quantities_by_hand():
    """Per-letter mixture at 4 nats, margin 0.5: seed 0 past the bar (base 2, LN 2.1: LN is
    0.1 above, a tenth of the baseline's distance 2 below the bar is 0.2, so 0.5 tenths);
    seed 1's baseline ends at 3.6, not half a nat below the mixture."""
    res = _results({"baseline": [[5.0, 3.0, 2.0], [5.0, 4.0, 3.6]],
                    "layer_norm": [[5.0, 2.0, 2.1], [5.0, 3.0, 2.0]]},
                   info={"gmm_letter_nll": 4.0}, config={"margin": 0.5})
    q = HW.c16_quantities(res)
    np.testing.assert_allclose(q["comparable"], [0.5, (2.0 - 3.6) / (0.1 * 0.4)])
    assert q["left"].tolist() == [True, False]
    # the baselines reach their final NLL at update 20; LN reaches 2.0 at 10 and 3.6 at
    # 10 * (5 - 3.6) / (5 - 3) = 7, between the evaluations at 0 and 10
    np.testing.assert_allclose(q["much faster"], [2.0, 20.0 / 7.0])


# ----------------------------------------------------------------------------- experiment


_TINY = dict(seq_len=12, n_train=16, n_val=4, hidden_size=8, n_mixtures=2, steps=2,
             eval_every=1, seeds=(0,))


def test_get_config_presets_and_errors():
    paper = HW.get_config("paper")
    assert (paper.hidden_size, paper.num_layers, paper.n_mixtures) == (400, 3, 20)
    assert paper.batch_size == 8 and paper.seq_len == 500
    assert HW.get_config("quick").batch_size == 8
    with pytest.raises(ValueError, match="scale"):
        HW.get_config("tiny")
    with pytest.raises(ValueError, match="unknown Config fields"):
        HW.get_config("quick", layers=2)
    with pytest.raises(ValueError, match="variants must be drawn from"):
        HW.get_config("quick", variants=("batch",))


def test_run_returns_results_and_writes_json(tmp_path):
    cfg = HW.get_config("quick", **_TINY)
    res = HW.run(cfg, device="cpu", out=tmp_path)
    assert isinstance(res, Results) and res.variants == list(HW.VARIANTS)
    path = results_file(tmp_path, HW.NAME, res.config)
    back = load_results(path)
    assert json.loads(json.dumps(back.to_dict())) == back.to_dict()
    steps, nll = back.curves("layer_norm", "nll")
    assert steps.tolist() == [0, 1, 2] and nll.shape == (1, 3)
    assert np.all(np.isfinite(nll))
    assert all(math.isfinite(back.info[k]) for k in ("gmm_nll", "gmm_letter_nll"))
    assert len(back.select("baseline")[0].info["sample"]) == cfg.seq_len
    assert back.info_of("ln_recurrent", "input_scales")[0][0] > 0
    assert back.info_of("baseline", "input_scales") == [[]]
    with pytest.raises(TypeError, match="handwriting.Config"):
        HW.run({"scale": "quick"})
    # another config shares the folder: its own files, the first config's kept as they were
    other = HW.run(HW.get_config("quick", **{**_TINY, "hidden_size": 4}), device="cpu",
                   out=tmp_path)
    assert load_results(results_file(tmp_path, HW.NAME, other.config)).config["hidden_size"] == 4
    assert load_results(path).to_dict() == back.to_dict()


def test_a_tiny_paper_preset_runs():
    cfg = HW.get_config("paper", **{**_TINY, "num_layers": 2, "checkpoint": False,
                                    "seeds": (1,)})
    res = HW.run(cfg, device="cpu")
    assert res.seeds == [1] and len(res.runs) == 3
    assert torch.get_num_threads() >= 1


@pytest.mark.parametrize("num_layers", [1, 2])
def test_stacked_training_is_training_each_model_alone(num_layers):
    # the seeds of each variant trained as one engine Stack give the same curves, losses,
    # input scales and samples as fit() on each model alone, to float32 rounding
    kw = {**_TINY, "steps": 4, "eval_every": 2, "seeds": (3, 7), "num_layers": num_layers}
    alone = HW.run(HW.get_config("quick", **kw, stacked=False), device="cpu")
    stacked = HW.run(HW.get_config("quick", **kw, stacked=True), device="cpu")
    assert [(r.variant, r.seed) for r in alone.runs] == [
        (r.variant, r.seed) for r in stacked.runs]
    for v in HW.VARIANTS:
        for metric in ("nll", "loss"):
            s1, c1 = alone.curves(v, metric)
            s2, c2 = stacked.curves(v, metric)
            assert s1.tolist() == s2.tolist()
            np.testing.assert_allclose(c2, c1, rtol=1e-4, atol=1e-5)
        assert stacked.info_of(v, "input_scales") == alone.info_of(v, "input_scales")
        np.testing.assert_allclose(stacked.select(v)[0].info["sample"],
                                   alone.select(v)[0].info["sample"], atol=1e-3)
    assert stacked.info == alone.info


@pytest.mark.parametrize("stacked", [True, False])
def test_a_run_continues_from_its_checkpoints(tmp_path, stacked):
    """Stacked (one job per variant) or one run at a time, each job checkpoints under out; trained
    longer, it continues to the numbers of a run trained at once; two workers change
    nothing; an int of seeds is the first of the seed set, and only the first writes."""
    kw = {**_TINY, "eval_every": 2, "seeds": 2, "stacked": stacked}
    whole = HW.run(HW.get_config("quick", **{**kw, "steps": 4}), device="cpu")
    assert whole.seeds == list(verdict_seeds(2))
    assert ["sample" in r.info for r in whole.select("baseline")] == [True, False]
    HW.run(HW.get_config("quick", **kw, checkpoint=True), device="cpu", out=tmp_path)
    n_jobs = 3 if stacked else 6  # 3 variants, 2 seeds
    assert len(list((tmp_path / "checkpoints").rglob("*.pt"))) == n_jobs
    longer = HW.run(HW.get_config("quick", **{**kw, "steps": 4}, checkpoint=True, workers=2),
                    device="cpu", out=tmp_path)
    assert_same_runs(whole, longer)


@pytest.mark.parametrize("variant", HW.VARIANTS)
def test_a_stack_of_models_gives_each_model_s_loss_and_gradient(variant):
    # the engine's Stack of one variant's seeds, the baseline's torch LSTMs made lnbook LSTMs
    # without layer norm (torch's has no vmap rule): each copy's mean NLL and its gradient
    # are those of the model alone, in float64
    models = []
    for seed in (0, 1, 2):
        torch.manual_seed(seed)
        m = HW.HandwritingModel(8, num_layers=2, n_mixtures=2, variant=variant).double()
        with torch.no_grad():  # gains and biases away from their starts, to test every one
            for q in m.parameters():
                q.add_(0.1 * torch.randn_like(q))
        models.append(m)
    data = HW.make_handwriting(3, 10, seed=1)
    pts = data.points.double()
    stack = Stack([HW._vmappable(copy.deepcopy(m)) for m in models])
    if variant == "baseline":
        assert isinstance(models[0].layers[0], torch.nn.LSTM)  # the originals keep torch's
        assert not any(isinstance(k, torch.nn.LSTM) for k in stack.unstack()[0].modules())
    got = stack.call(HW._mean_nll, pts, data.letters, shared=(0, 1))  # (3,)
    got.sum().backward()
    grads = stack.named_stacked(grad=True)
    for j, m in enumerate(models):
        want = m.nll(pts, data.letters).mean()
        torch.testing.assert_close(got[j], want, rtol=1e-12, atol=0)
        want.backward()
        for name, q in m.named_parameters():
            stacked = grads[name][j]
            torch.testing.assert_close(stacked, q.grad, rtol=1e-9, atol=1e-12)
    assert not torch.equal(got[0], got[1])
