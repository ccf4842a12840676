"""``--workers`` reaches the sweep of the experiments that took it last (issue 34): each
config has ``workers`` and ``run`` hands it to :func:`lnbook.engine.sweep`."""

from __future__ import annotations

import pytest

import lnbook.__main__ as cli
from lnbook.experiments import EXPERIMENTS


class _Handed(Exception):
    """Raised by the stand-in sweep with what ``run`` gave it."""


def _sweep(*args, **kwargs):
    raise _Handed(kwargs.get("workers"))


def _run(config, **kwargs):
    raise _Handed(config.workers)


@pytest.mark.parametrize("name", ["convnet", "group_norm", "dyt", "removal", "dyt_regime"])
def test_workers_reach_the_sweep(name, monkeypatch):
    module = EXPERIMENTS[name]
    assert module.get_config("quick").workers == 1
    with monkeypatch.context() as patch:
        patch.setattr(module, "run", _run)
        with pytest.raises(_Handed) as handed:
            cli.main(["run", name, "--workers", "3"])
    assert handed.value.args == (3,)  # the command line's --workers is in the config
    monkeypatch.setattr(module, "sweep", _sweep)
    with pytest.raises(_Handed) as handed:
        module.run(module.get_config("quick", workers=3, seeds=(0,)), device="cpu")
    assert handed.value.args == (3,)  # and run gives it to the sweep
