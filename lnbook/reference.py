"""Plain numpy references: layer normalization and the paper's recurrent cells, in its notation.

No autograd, no dtype tricks, float64:

- :func:`layer_norm_numpy`: the three lines of eq. 3 and the gain and bias of eq. 4 (chapter 3).
  The package's :func:`lnbook.layer_norm` and :class:`lnbook.LayerNorm` are tested against it.
  It is the one layer norm of the package that does not call :mod:`lnbook.functional`, on
  purpose: a check that shared the code it checks would share its mistakes, so this stays an
  independent computation (numpy, float64, the formula as the paper writes it).
- The recurrent cells of the supplement written literally in the paper's order and notation
  (Supplement chapter): :func:`lstm_step_paper` (eqs. 20-22, and 29-31 or 17-19 without some
  LNs), :func:`gru_step_paper` (eqs. 26-28) and :func:`rnn_step_paper` (eq. 4). The functions
  ``*_params_paper`` build the paper's parameters from the state dict of the torch-form cell
  (:class:`lnbook.LNLSTMCell`, :class:`lnbook.LNGRUCell`, :class:`lnbook.LNRNNCell`) by
  reordering gates and folding biases, so that the two can be compared number for number (the
  supplement chapter and ``tests/test_rnn.py`` both do).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

__all__ = [
    "layer_norm_numpy",
    "lstm_params_paper",
    "lstm_step_paper",
    "gru_params_paper",
    "gru_step_paper",
    "rnn_params_paper",
    "rnn_step_paper",
]

_Params = dict[str, np.ndarray]


def layer_norm_numpy(
    x: np.ndarray,
    weight: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    eps: float = 1e-5,
) -> np.ndarray:
    """Layer-normalize ``x`` over its trailing ``weight.ndim`` axes (eq. 3; chapter 3).

    Args:
        x: array ``(*, *S)``.
        weight: gain of shape ``S``; None means S is the last axis and the gain is 1.
        bias: bias of shape ``S``, or None for 0.
        eps: added to the variance inside the square root.

    Returns:
        ``(x - mu) / sqrt(sigma^2 + eps) * weight + bias``, the same shape as ``x``.

    Example::

        >>> layer_norm_numpy(np.array([[1.0, 2.0, 3.0]])).round(3)
        array([[-1.225,  0.   ,  1.225]])
    """
    x = np.asarray(x)
    k = 1 if weight is None else np.ndim(weight)
    axes = tuple(range(x.ndim - k, x.ndim))
    mu = x.mean(axis=axes, keepdims=True)  # eq. 3, left
    sigma2 = ((x - mu) ** 2).mean(axis=axes, keepdims=True)  # eq. 3, right (squared)
    y = (x - mu) / np.sqrt(sigma2 + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def _sigmoid(v: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-v))


def _ln(z: np.ndarray, alpha: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    """Eqs. 15-16 over the last axis (eps inside the root, as the package)."""
    return layer_norm_numpy(z, alpha, beta, eps)


def _get(sd: Mapping[str, object], name: str, size: int) -> np.ndarray:
    """``sd[name]`` as float64, or zeros where the cell has no such bias (``bias=False``)."""
    v = sd.get(name)
    return np.zeros(size) if v is None else np.asarray(v, dtype=np.float64)


def lstm_params_paper(sd: Mapping[str, object], hidden_size: int) -> _Params:
    """The paper's LSTM parameters from a torch-form state dict (Supplement chapter).

    torch stacks the gates (i, f, g, o), the paper (f, i, o, g): the rows of every 4H array are
    permuted (layer normalization does not care about the order of the units). The two biases
    ``bias_ih + bias_hh`` become the paper's b. Keys ``a1, b1`` (LN of W_h h), ``a2, b2`` (LN of
    W_x x) exist only if the state dict has ``ln_hh``/``ln_ih``, ``a3, b3`` (LN of c_t) only if
    it has ``ln_c``.

    Args:
        sd: ``cell.state_dict()`` of :class:`lnbook.LNLSTMCell` or
            :class:`lnbook.DRAWLSTMCell` (torch tensors or arrays).
        hidden_size: H.

    Example::

        >>> p = lstm_params_paper(lnbook.LNLSTMCell(3, 4).state_dict(), 4)
        >>> sorted(p)
        ['W_h', 'W_x', 'a1', 'a2', 'a3', 'b', 'b1', 'b2', 'b3']
    """
    H = hidden_size
    i, f, g, o = (np.arange(k * H, (k + 1) * H) for k in range(4))
    perm = np.concatenate([f, i, o, g])  # torch rows -> paper rows

    def arr(name: str, size: int) -> np.ndarray:
        return _get(sd, name, size)

    p = {"W_h": arr("weight_hh", 0)[perm], "W_x": arr("weight_ih", 0)[perm],
         "b": (arr("bias_ih", 4 * H) + arr("bias_hh", 4 * H))[perm]}
    if "ln_hh.weight" in sd:
        p |= {"a1": arr("ln_hh.weight", 0)[perm], "b1": arr("ln_hh.bias", 4 * H)[perm],
              "a2": arr("ln_ih.weight", 0)[perm], "b2": arr("ln_ih.bias", 4 * H)[perm]}
    if "ln_c.weight" in sd:
        p |= {"a3": arr("ln_c.weight", 0), "b3": arr("ln_c.bias", H)}
    return p


def lstm_step_paper(
    p: _Params, x: np.ndarray, h: np.ndarray, c: np.ndarray, eps: float = 1e-5
) -> tuple[np.ndarray, np.ndarray]:
    """One step of the layer-normalized LSTM, literally eqs. 20-22 (Supplement chapter).

    Without ``a1`` in ``p`` the gates are not normalized (eq. 29, the DRAW cell); without
    ``a3`` neither is the cell state (eqs. 17-19, the plain LSTM). Gates in the paper's order
    (f, i, o, g); the c_t carried on is the un-normalized one of eq. 21.

    Args:
        p: from :func:`lstm_params_paper`.
        x: ``(B, input_size)``; h, c: ``(B, H)``.
        eps: inside the root of eq. 16.

    Returns:
        ``(h_t, c_t)``, each ``(B, H)``.
    """
    if "a1" in p:  # eq. 20
        pre = (_ln(h @ p["W_h"].T, p["a1"], p["b1"], eps)
               + _ln(x @ p["W_x"].T, p["a2"], p["b2"], eps))
    else:  # eq. 29 (or 17)
        pre = h @ p["W_h"].T + x @ p["W_x"].T
    f, i, o, g = np.split(pre + p["b"], 4, axis=1)
    c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)  # eq. 21
    cn = _ln(c, p["a3"], p["b3"], eps) if "a3" in p else c
    return _sigmoid(o) * np.tanh(cn), c  # eq. 22


def gru_params_paper(sd: Mapping[str, object], hidden_size: int) -> _Params:
    """The paper's GRU parameters (eqs. 26-28) from an :class:`lnbook.LNGRUCell` state dict.

    torch computes ``h_t = (1 - z) n + z h_{t-1}`` with gates (r, z, n); the paper's eq. 28
    reads ``h_t = (1 - sigma(z_p)) h_{t-1} + sigma(z_p) h^_t``, so its pre-activation z_p is
    minus torch's. Since ``-LN(v; alpha, beta) = LN(v; -alpha, -beta)``, the sign moves into the
    LN gains and biases of the z half. The (z, r) rows of W_h, W_x are torch's z and r rows;
    the betas take the LN biases plus torch's biases (negated on the z half); W, U are torch's
    n rows.

    Args:
        sd: ``cell.state_dict()`` of a layer-normalized :class:`lnbook.LNGRUCell`.
        hidden_size: H.
    """
    H = hidden_size
    r, z, n = (slice(k * H, (k + 1) * H) for k in range(3))
    sign = np.concatenate([-np.ones(H), np.ones(H)])  # negate the z half

    def swap(v: np.ndarray) -> np.ndarray:  # torch's 2H LN vectors are (r, z): make them (z, r)
        return np.concatenate([v[H:], v[:H]])

    def arr(name: str, size: int) -> np.ndarray:
        return _get(sd, name, size)

    wih, whh = arr("weight_ih", 0), arr("weight_hh", 0)
    bih, bhh = arr("bias_ih", 3 * H), arr("bias_hh", 3 * H)
    b_zr = np.concatenate([bih[z] + bhh[z], bih[r] + bhh[r]])
    return {"W_h": np.concatenate([whh[z], whh[r]]), "W_x": np.concatenate([wih[z], wih[r]]),
            "a1": sign * swap(arr("ln_hh.weight", 0)),
            "b1": sign * swap(arr("ln_hh.bias", 2 * H)),
            "a2": sign * swap(arr("ln_ih.weight", 0)),
            "b2": sign * (swap(arr("ln_ih.bias", 2 * H)) + b_zr),
            "W": wih[n], "a3": arr("ln_in.weight", 0), "b3": arr("ln_in.bias", H) + bih[n],
            "U": whh[n], "a4": arr("ln_hn.weight", 0), "b4": arr("ln_hn.bias", H) + bhh[n]}


def gru_step_paper(p: _Params, x: np.ndarray, h: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """One step of the layer-normalized GRU, literally eqs. 26-28 (Supplement chapter).

    Args:
        p: from :func:`gru_params_paper`.
        x: ``(B, input_size)``; h: ``(B, H)``.
        eps: inside the root of eq. 16.

    Returns:
        h_t, ``(B, H)``.
    """
    H = h.shape[1]
    zr = _ln(h @ p["W_h"].T, p["a1"], p["b1"], eps) + _ln(x @ p["W_x"].T, p["a2"], p["b2"], eps)
    z, r = zr[:, :H], zr[:, H:]  # eq. 26
    h_hat = np.tanh(_ln(x @ p["W"].T, p["a3"], p["b3"], eps)
                    + _sigmoid(r) * _ln(h @ p["U"].T, p["a4"], p["b4"], eps))  # eq. 27
    return (1 - _sigmoid(z)) * h + _sigmoid(z) * h_hat  # eq. 28


def rnn_params_paper(sd: Mapping[str, object], hidden_size: int) -> _Params:
    """Eq. 4's parameters from an :class:`lnbook.LNRNNCell` state dict: W_x, W_h, the gain g
    and the bias b (LN's bias plus torch's two biases); without ``ln`` no gain.

    Args:
        sd: ``cell.state_dict()``.
        hidden_size: H.
    """
    H = hidden_size
    b = _get(sd, "bias_ih", H) + _get(sd, "bias_hh", H) + _get(sd, "ln.bias", H)
    p = {"W_x": _get(sd, "weight_ih", 0), "W_h": _get(sd, "weight_hh", 0), "b": b}
    if "ln.weight" in sd:
        p["g"] = _get(sd, "ln.weight", 0)
    return p


def rnn_step_paper(
    p: _Params, x: np.ndarray, h: np.ndarray, eps: float = 1e-5, f=np.tanh
) -> np.ndarray:
    """One step of eq. 4: ``h_t = f(g / sigma_t (a_t - mu_t) + b)`` with ``a_t = W_x x_t +
    W_h h_{t-1}`` (chapter 3.1); ``f(a_t + b)`` without a gain in ``p``.

    Args:
        p: from :func:`rnn_params_paper`.
        x: ``(B, input_size)``; h: ``(B, H)``.
        eps: inside the root of eq. 16.
        f: the non-linearity. Default: tanh.

    Returns:
        h_t, ``(B, H)``.
    """
    a = x @ p["W_x"].T + h @ p["W_h"].T  # summed inputs
    return f(_ln(a, p["g"], p["b"], eps) if "g" in p else a + p["b"])
