"""Tests of lnbook.recurrent_bn: batch normalization with per-step statistics, the BN-RNN of
section 3.1 and the recurrent BN-LSTM of section 6.2 (Cooijmans et al., 2016)."""

from __future__ import annotations

import pytest
import torch

from lnbook.recurrent_bn import BatchNormRNN, RecurrentBNLSTM, SequenceBatchNorm

F64 = torch.float64
I, H = 5, 6


def test_sequence_batch_norm_per_step_statistics():
    torch.manual_seed(0)
    bn = SequenceBatchNorm(4, max_steps=3, momentum=1.0).double()
    xs = [torch.randn(16, 4, dtype=F64) * (t + 1) + 3 * t for t in range(3)]
    for t, x in enumerate(xs):
        y = bn(x, t)
        assert y.mean(0).abs().max() <= 1e-12
        assert (y.var(0, unbiased=False) - 1).abs().max() <= 1e-4
        assert torch.allclose(bn.running_mean[t], x.mean(0))  # momentum 1: the last batch
        assert torch.allclose(bn.running_var[t], x.var(0, unbiased=True))
    assert int(bn.steps_seen) == 3
    bn.eval()
    x = torch.randn(5, 4, dtype=F64)
    y2, y9 = bn(x, 2), bn(x, 9)  # beyond training: the last step's statistics
    assert torch.equal(y2, y9)
    assert not torch.allclose(bn(x, 0), y2)
    bn.train()
    with pytest.raises(ValueError, match="max_steps=3"):
        bn(x, 3)


def test_sequence_batch_norm_copies_in_a_stack_each_count_their_steps():
    # under the engine's Stack (vmap) each copy keeps its own statistics and count of steps,
    # as alone, with no slow fallback (torch warns when it has no batching rule)
    import warnings

    from lnbook.engine import Stack

    torch.manual_seed(0)
    copies = [SequenceBatchNorm(4, max_steps=3).double() for _ in range(2)]
    alone = [SequenceBatchNorm(4, max_steps=3).double() for _ in range(2)]
    stack = Stack(copies)
    xs = torch.randn(2, 2, 8, 4, dtype=F64)  # (copies, steps, B, F)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for t in range(2):
            got = stack.call(lambda m, x, t=t: m(x, t), xs[:, t])
            for k, bn in enumerate(alone):
                torch.testing.assert_close(got[k], bn(xs[k, t], t), rtol=0, atol=1e-12)
    for k, bn in enumerate(stack.unstack()):
        assert int(bn.steps_seen) == 2
        torch.testing.assert_close(bn.running_mean, alone[k].running_mean, rtol=0, atol=1e-12)


def test_sequence_batch_norm_evaluates_in_a_stack_as_each_copy_alone():
    # evaluation picks step t's statistics (the last step seen beyond it, every slot's last
    # when none was seen) with a tensor index, which vmap runs: the same numbers as alone
    from lnbook.engine import Stack

    torch.manual_seed(1)
    trained = [SequenceBatchNorm(4, max_steps=4).double() for _ in range(2)]
    for k, bn in enumerate(trained):
        for t in range(2 + k):  # copy 0 sees steps 0-1, copy 1 steps 0-2
            bn(torch.randn(8, 4, dtype=F64) * (t + 1) + t, t)
    fresh = [SequenceBatchNorm(4, max_steps=4).double() for _ in range(2)]
    for copies in (trained, fresh):
        stack = Stack(copies).eval()
        x = torch.randn(2, 5, 4, dtype=F64)
        for t in range(6):  # within the steps seen, beyond them, beyond max_steps
            got = stack.call(lambda m, v, t=t: m(v, t), x)
            for k, bn in enumerate(copies):
                want = bn.eval()(x[k], t)
                assert torch.equal(got[k], want), (t, k)
    alone = trained[0].eval()
    x = torch.randn(3, 4, dtype=F64)
    assert torch.equal(alone(x, 5), alone(x, 1)) and not torch.equal(alone(x, 0), alone(x, 1))


def test_sequence_batch_norm_running_averages_are_torch_s_bit_for_bit():
    # not stacked, each step's row of the running averages is what torch's batch norm makes of
    # that row in place, bit for bit (float32, momentum 0.1, many updates)
    torch.manual_seed(0)
    bn = SequenceBatchNorm(6, max_steps=3)
    mean, var = torch.zeros(3, 6), torch.ones(3, 6)
    for _ in range(40):
        for t in range(3):
            x = torch.randn(16, 6) * (t + 2) + t
            y = bn(x, t)
            want = torch.nn.functional.batch_norm(x, mean[t], var[t], bn.weight, bn.bias, True,
                                                  0.1, 1e-5)
            assert torch.equal(y, want)
    assert torch.equal(bn.running_mean, mean) and torch.equal(bn.running_var, var)
    assert not torch.equal(mean[0], mean[1])


def test_sequence_batch_norm_rejects_bad_eps_and_momentum():
    for eps in (0.0, -1e-5, float("nan")):
        with pytest.raises(ValueError, match="eps must be"):
            SequenceBatchNorm(4, max_steps=2, eps=eps)
    with pytest.raises(TypeError, match="eps must be"):
        SequenceBatchNorm(4, max_steps=2, eps="small")
    with pytest.raises(ValueError, match=r"momentum must lie in \[0, 1\]"):
        SequenceBatchNorm(4, max_steps=2, momentum=1.5)


def test_sequence_batch_norm_mask_ignores_padding_and_gain_init():
    torch.manual_seed(0)
    bn = SequenceBatchNorm(4, max_steps=2, gain_init=0.1).double()
    assert torch.allclose(bn.weight, torch.full((4,), 0.1, dtype=F64))
    x = torch.randn(6, 4, dtype=F64)
    mask = torch.tensor([True, True, True, True, False, False])
    x2 = x.clone()
    x2[4:] = 1e6
    y1 = bn(x, 0, mask)
    y2 = bn(x2, 0, mask)
    assert (y1[:4] - y2[:4]).abs().max() <= 1e-12
    with pytest.raises(ValueError, match=r"\(B, 4\)"):
        bn(torch.randn(3, 5), 0)


def test_batch_norm_rnn_depends_on_batch_and_padding_is_ignored():
    torch.manual_seed(0)
    m = BatchNormRNN(I, H, max_steps=6).double()
    x = torch.randn(6, 5, I, dtype=F64)
    out, h = m(x)
    assert out.shape == (6, 5, H) and h.shape == (1, 5, H)
    out2, _ = m(torch.cat([x, torch.randn(6, 3, I, dtype=F64)], 1))
    assert (out2[:, :5] - out).abs().max() > 1e-3  # C03: batch-mates change the output
    lengths = [6, 4, 6, 2, 5]
    x_pad = x.clone()
    x_pad[5:, 4] = 1e3  # beyond length 5 of example 4
    a, _ = m(x, lengths=lengths)
    b, _ = m(x_pad, lengths=lengths)
    assert (a - b).abs().max() <= 1e-12


def test_batch_norm_rnn_signature_and_errors():
    m = BatchNormRNN(I, H, max_steps=4, nonlinearity="relu", batch_first=True)
    x = torch.randn(3, 4, I)
    out, h = m(input=x, hx=torch.zeros(1, 3, H))
    assert out.shape == (3, 4, H) and h.shape == (1, 3, H) and (out >= 0).all()
    with pytest.raises(ValueError, match="needs a batch"):
        m(torch.randn(4, I))
    with pytest.raises(TypeError, match="lengths="):
        m(torch.nn.utils.rnn.pack_padded_sequence(x, [4, 3, 2], batch_first=True))
    with pytest.raises(ValueError, match="max_steps=4"):
        m(torch.randn(3, 5, I))


def _bn_lstm_reference(m: RecurrentBNLSTM, x: torch.Tensor, stats=None) -> torch.Tensor:
    """Float64 loop over the equations; ``stats(t)`` gives the per-step (mean, var) triples
    for (ih, hh, c) or None for the batch statistics of step t."""
    x = x.double()
    T, B, _ = x.shape
    H = m.hidden_size
    Wi, Wh = m.weight_ih.double(), m.weight_hh.double()
    b = (m.bias_ih + m.bias_hh).double()

    def bn(z, bnm, t, which):
        if stats is None:
            mu, var = z.mean(0), z.var(0, unbiased=False)
        else:
            mu, var = stats(t)[which]
        return (z - mu) / torch.sqrt(var + bnm.eps) * bnm.weight.double() + bnm.bias.double()

    h = torch.zeros(B, H, dtype=torch.float64)
    c = torch.zeros(B, H, dtype=torch.float64)
    outs = []
    for t in range(T):
        z = bn(h @ Wh.t(), m.bn_hh, t, 1) + bn(x[t] @ Wi.t(), m.bn_ih, t, 0) + b
        i, f, g, o = z.chunk(4, 1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(bn(c, m.bn_c, t, 2))
        outs.append(h)
    return torch.stack(outs)


def test_recurrent_bn_lstm_matches_float64_equations_with_per_step_batch_statistics():
    torch.manual_seed(0)
    m = RecurrentBNLSTM(5, 6, max_steps=4)
    with torch.no_grad():  # break the symmetry of the default gains and biases
        for bn in (m.bn_ih, m.bn_hh, m.bn_c):
            bn.weight.uniform_(0.5, 1.5)
        m.bn_c.bias.uniform_(-0.5, 0.5)
    x = torch.randn(4, 7, 5) * torch.arange(1, 5).view(4, 1, 1)  # scale grows with t
    out, (h, c) = m(x)
    ref = _bn_lstm_reference(m, x)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h[0].double(), ref[-1], atol=1e-5, rtol=1e-5)
    # separate statistics per step: the running means of W_x x differ step by step
    rm = m.bn_ih.running_mean  # (max_steps, 4H)
    expect = 0.1 * (x @ m.weight_ih.t()).mean(1)  # momentum 0.1 from zero, (T, 4H)
    torch.testing.assert_close(rm, expect.detach(), atol=1e-5, rtol=1e-5)
    assert int(m.bn_ih.steps_seen) == 4


def test_recurrent_bn_eval_beyond_training_length_uses_last_step_statistics():
    torch.manual_seed(1)
    m = RecurrentBNLSTM(3, 4, max_steps=6)
    m(torch.randn(3, 8, 3))  # trains statistics for steps 0, 1, 2 only
    m.eval()
    x = torch.randn(6, 2, 3)
    out, _ = m(x)

    def stats(t):
        s = min(t, 2)  # beyond the trained steps: the statistics of the last trained step
        return [(bn.running_mean[s].double(), bn.running_var[s].double())
                for bn in (m.bn_ih, m.bn_hh, m.bn_c)]

    torch.testing.assert_close(out.double(), _bn_lstm_reference(m, x, stats), atol=1e-5,
                               rtol=1e-5)
    # and the output at a given step does not depend on the rest of the batch in eval mode
    out1, _ = m(x[:, :1])
    torch.testing.assert_close(out1, out[:, :1], atol=1e-6, rtol=1e-6)


def test_recurrent_bn_gains_start_at_0_1_and_gate_shifts_are_frozen():
    m = RecurrentBNLSTM(3, 4, max_steps=5)
    for bn in (m.bn_ih, m.bn_hh, m.bn_c):
        assert torch.all(bn.weight == 0.1)
    assert not m.bn_ih.bias.requires_grad and not m.bn_hh.bias.requires_grad
    assert m.bn_c.bias.requires_grad
    assert torch.all(RecurrentBNLSTM(3, 4, 5, gain_init=1.0).bn_c.weight == 1.0)


def test_recurrent_bn_rejects_bad_input():
    m = RecurrentBNLSTM(3, 4, max_steps=5)
    with pytest.raises(ValueError, match=r"\(T, B, 3\)"):
        m(torch.randn(5, 2, 4))
    with pytest.raises(TypeError, match="floating-point"):
        m(torch.zeros(5, 2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="max_steps"):
        m(torch.randn(6, 2, 3))  # longer than its statistics slots, in training mode
    with pytest.raises(ValueError, match="hidden_size"):
        RecurrentBNLSTM(3, 0, 5)


