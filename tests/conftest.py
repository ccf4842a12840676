"""What every test shares: the same random state at its start, and one torch thread.

Many tests draw their inputs from torch's (or numpy's) global generator. Without this, what
they draw depends on which tests ran before them in the same pytest-xdist worker, so a test
could pass or fail with the order. Seeding before each test makes every test's inputs fixed.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator

import numpy as np
import pytest
import torch

# torch.compile's inductor would start a pool of compile workers in every pytest-xdist worker;
# the compiled graphs of the tests are tiny, so compiling in-process is cheaper on 2 cores
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")


@pytest.fixture(autouse=True)
def fixed_random_state() -> None:
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """One torch CPU thread in every test, restored afterwards. The tests train tiny models,
    for which extra threads only add overhead, and on a machine busy with other jobs (or
    pytest-xdist's other workers) each small operation would wait for the other threads."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
