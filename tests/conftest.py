"""What every test shares: the same random state at its start.

Many tests draw their inputs from torch's (or numpy's) global generator. Without this, what
they draw depends on which tests ran before them in the same pytest-xdist worker, so a test
could pass or fail with the order. Seeding before each test makes every test's inputs fixed.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch


@pytest.fixture(autouse=True)
def fixed_random_state() -> None:
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
