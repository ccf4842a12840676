"""The shared parts of the Part II Transformer experiments: task, trivial baseline, and the one
training run the stacked copies are held to (and what a diverged run leaves)."""

from __future__ import annotations

import math
import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest
import torch
from seq_reference import sequence_metrics, train_transformer

from lnbook.data import IGNORE_INDEX
from lnbook.engine import History, capped, using_executor
from lnbook.engine.job import Job
from lnbook.experiments import placement, qk_norm, rmsnorm, seq_tasks
from lnbook.experiments.seq_tasks import (
    TaskConfig,
    make_task,
    position_unigram_loss,
    presets,
)
from lnbook.seeds import verdict_seeds
from lnbook.transformer import Transformer, TransformerConfig, sequence_loss


def _job(seed: int = 0) -> Job:
    return Job.one("v", None, seed)


def test_position_unigram_loss_against_a_hand_count():
    y = torch.tensor([[IGNORE_INDEX, 0, 1], [IGNORE_INDEX, 0, 2], [IGNORE_INDEX, 1, 2]])
    # position 1: counts (2, 1, 0) + 1 -> (3, 2, 1) / 6; position 2: (0, 1, 2) + 1 -> (1, 2, 3) / 6
    p1, p2 = np.array([3, 2, 1]) / 6, np.array([1, 2, 3]) / 6
    expected = -np.mean(np.log([p1[0], p1[0], p1[1], p2[1], p2[2], p2[2]]))
    assert position_unigram_loss(y, y, 3) == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match="same T"):
        position_unigram_loss(y, y[:, :2], 3)


def test_make_task_shapes_held_out_set_and_baselines():
    sort = make_task("sort", 500, 200, size=6, symbols=8, seed=3)
    assert sort.x.shape == (500, 12) and sort.x_test.shape == (200, 12) and sort.seq_len == 12
    assert sort.vocab_size == 9 and sort.uniform_loss == pytest.approx(math.log(8))
    assert not torch.equal(sort.x[:200], sort.x_test)  # another seed for the held-out set
    # sorted positions are order statistics: far from uniform, so the baseline is lower
    assert sort.baseline_loss < sort.uniform_loss - 0.3
    recall = make_task("recall", 500, 200, size=4, symbols=8)
    assert recall.x.shape == (500, 10)
    # the recalled value is uniform whatever its position: the baseline is log(8), up to noise
    assert abs(recall.baseline_loss - math.log(8)) < 0.1
    with pytest.raises(ValueError, match="task"):
        make_task("copy", 10, 10, 4, 8)


def test_sequence_metrics_loss_accuracy_and_max_logit():
    task = make_task("sort", 32, 16, size=4, symbols=5)
    torch.manual_seed(0)
    model = Transformer(6, 16, 2, 1, task.seq_len).eval()
    with torch.no_grad():
        m = sequence_metrics(model, task.x_test, task.y_test)
        logits = model(task.x_test)
    assert m["loss"] == pytest.approx(float(sequence_loss(logits, task.y_test)), rel=1e-6)
    scored = task.y_test != IGNORE_INDEX
    acc = float((logits.argmax(-1)[scored] == task.y_test[scored]).float().mean())
    assert m["accuracy"] == pytest.approx(acc)
    assert m["max_logit"] == pytest.approx(float(model.blocks[0].attn.last_max_logit))


def _tiny(task, qk=False):
    return TransformerConfig(vocab_size=task.vocab_size, d_model=16, n_heads=2, n_layers=1,
                             max_len=task.seq_len, qk_norm=qk)


def test_train_transformer_is_deterministic_and_learns():
    task = make_task("sort", 256, 64, size=4, symbols=5)
    kw = dict(lr=1e-2, steps=30, batch_size=32, eval_every=10)
    h1, info = train_transformer(_job(1), _tiny(task), task, **kw)
    h2, _ = train_transformer(_job(1), _tiny(task), task, **kw)
    assert h1.losses == h2.losses and h1.metrics == h2.metrics
    assert h1.eval_steps == [0, 10, 20, 30] and info == {"diverged": False, "diverged_at": None}
    loss = h1.metric("loss")
    assert loss[-1] < loss[0] - 0.3  # it learns something in 30 updates
    _, measured = train_transformer(_job(1), _tiny(task), task, **{**kw, "steps": 2},
                                    measure=lambda m: {"d": m.config.d_model})
    assert measured["d"] == 16


def test_a_diverged_run_is_recorded_not_raised():
    task = make_task("sort", 64, 16, size=4, symbols=5)
    hist, info = train_transformer(_job(0), _tiny(task), task, lr=float("inf"), steps=8,
                                   batch_size=16, eval_every=2,
                                   measure=lambda m: {"never": True})
    assert info["diverged"] and info["diverged_at"] == 2  # the first update makes it inf
    assert "never" not in info
    assert hist.steps == [1] and len(hist.losses) == 1
    assert hist.eval_steps == [0, 2, 4, 6, 8]
    initial = hist.metrics[0]
    for m in hist.metrics[1:]:  # counted at the initial loss, as Wortsman et al. do
        assert m["loss"] == initial["loss"] and m["accuracy"] == initial["accuracy"]


def test_task_config_is_the_one_shared_part_of_the_three_experiments():
    """Each experiment's Config is a TaskConfig with its own fields and defaults; the shared
    checks, the paper preset and the model they build come from one place."""
    cfgs = [m.get_config() for m in (placement, qk_norm, rmsnorm)]
    assert all(isinstance(c, TaskConfig) for c in cfgs)
    assert [(c.steps, c.eval_every, c.seeds) for c in cfgs] == [(60, 20, 10), (40, 20, 3),
                                                                 (50, 10, 5)]
    for m in (placement, qk_norm, rmsnorm):
        with pytest.raises(ValueError, match="task must be one of"):
            m.get_config(task="copy")
        with pytest.raises(ValueError, match="n_train and n_test must be >= 1"):
            m.get_config(n_test=0)
        paper = m.get_config("paper")
        assert (paper.d_model, paper.n_layers, paper.size, paper.checkpoint) == (512, 6, 32, True)
    assert qk_norm.get_config("paper").steps == 10_000 and presets()["quick"] == {}
    mc = TaskConfig(symbols=5, d_model=16, n_heads=2).model_config(12, position="post")
    assert mc == TransformerConfig(6, 16, 2, 2, 12, position="post")
    assert placement.model_config(cfgs[0], "post", 3, 16) == TransformerConfig(
        9, 32, 4, 3, 16, norm="layer", position="post")


_TINY = dict(steps=2, eval_every=1, n_train=64, n_test=16, size=4, d_model=16, n_heads=2,
             n_layers=1)


def test_seeds_are_read_when_the_run_starts(monkeypatch):
    """An int ``seeds`` is the first n of the seed set in force when ``run`` starts, not when
    lnbook was imported or the config made; the results record the seeds trained."""
    cfg = rmsnorm.get_config("quick", seeds=2, norms=("rms",), **_TINY)
    monkeypatch.setenv("LNBOOK_SEED_SET", "1")
    res = rmsnorm.run(cfg, device="cpu")
    assert res.seeds == [1000, 1001] == list(verdict_seeds(2))
    assert res.config["seeds"] == [1000, 1001] and cfg.seeds == 2
    with pytest.raises(TypeError, match="unexpected keyword argument 'seeds'"):
        rmsnorm.run(cfg, seeds=(0,))  # seeds travel one way: the config


def _never(*args):
    raise AssertionError("a finished run was trained again")


def test_a_stacked_experiment_on_a_process_pool_and_resumed(tmp_path, monkeypatch):
    """The train function pickles (the standard library's ProcessPoolExecutor trains the
    jobs, same numbers as one process), and a finished run is read back, not retrained."""
    cfg = rmsnorm.get_config("quick", seeds=(0, 1), **_TINY)
    alone = rmsnorm.run(cfg, device="cpu", out=tmp_path)
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool, \
            using_executor(pool):
        pooled = rmsnorm.run(cfg, device="cpu")
    assert [r.history.losses for r in pooled.runs] == [r.history.losses for r in alone.runs]
    monkeypatch.setattr(rmsnorm, "train", _never)
    again = rmsnorm.run(cfg, device="cpu", out=tmp_path)
    assert again.to_dict() == alone.to_dict()
    assert len(list((tmp_path / "runs").rglob("*.json"))) == 4  # a file per run


def test_groups_and_job_order_of_a_stacked_job():
    from lnbook.experiments.stacked import StackedRun, groups, in_job_order

    variants = {"pre/lr0.1": ("pre", 0.1), "post/lr0.1": ("post", 0.1), "pre/lr1": ("pre", 1.0)}
    assert groups(variants) == {"pre": [0.1, 1.0], "post": [0.1]}
    job = Job(variants, (3, 5), torch.device("cpu"), None, None, "all")
    trained = {(v, s): StackedRun(History(steps=[s]), {"v": v}, None) for v, s in
               reversed(job.pairs)}
    got = in_job_order(job, trained)
    assert [(h.steps[0], i["v"]) for h, i in got] == [(s, v) for v, s in job.pairs]


def test_a_smoke_run_builds_a_short_held_out_set_only():
    cfg = rmsnorm.get_config("paper", n_train=512)
    with capped(2):
        smoke = seq_tasks.task_of(cfg)
    assert smoke.x_test.shape[0] == seq_tasks.SMOKE_HELD_OUT < cfg.n_test
    assert smoke.x.shape[0] == cfg.n_train  # the training set as a real run's
    assert seq_tasks.task_of(rmsnorm.get_config("quick", n_test=100)).x_test.shape[0] == 100
