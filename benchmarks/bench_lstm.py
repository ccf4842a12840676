"""Speed of lnbook's recurrent layers against torch's, as ratios measured in one run.

Issue 13, book chapter Supplement (section "Speed"). Forward + backward of ``lnbook.LSTM`` with
layer normalization, through autograd's step-by-step loop (the default, ``bptt="autograd"``)
and through the hand-derived backpropagation through time of :mod:`lnbook.bptt`
(``bptt="hand"``), and without layer norm, against :class:`torch.nn.LSTM` (oneDNN's fused
LSTM on a CPU, cuDNN's on a GPU); and ``lnbook.GRU`` against :class:`torch.nn.GRU` (the
per-iteration cost the paper discusses in section 6.3, claim C14). Targets, from the issue:
the LN-LSTM (as built by default) at most 2x torch.nn.LSTM at T=100, B=32, 64->256 and at
most 1.5x at B=64, 512->512. Prints a table and writes ``lnbook/benchmark_results/lstm.json``
(package data: the chapters read it with ``lnbook.resources.benchmark_result("lstm")``) with
the machine's description.

    python benchmarks/bench_lstm.py [--device auto] [--rounds 11] [--threads N] [--clock wall]
                                    [--quick]

Every model runs once per round, in an order rotated from round to round, so that all share the
machine's load alike; each ratio is the median over rounds of the ratio within a round.
``--clock cpu`` times the process's CPU time instead of the wall clock: on a machine shared with
other work and one thread (``--threads 1``), time spent waiting for a core then does not count.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from common import RESULTS, machine_description, sync
from torch import nn

import lnbook

SIZES = [  # (T, B, input, hidden) and the target ratio LN-LSTM / torch.nn.LSTM
    ((100, 32, 64, 256), 2.0),
    ((100, 64, 512, 512), 1.5),
]
QUICK_SIZES = [((20, 8, 16, 32), 2.0)]
LN_HAND, LN_LOOP = "lnbook.LSTM(bptt='hand')", "lnbook.LSTM(bptt='autograd')"


def fwd_bwd(model: nn.Module, x: torch.Tensor, device: torch.device, clock) -> float:
    """Seconds of one forward + backward pass (the sum of the outputs as the loss)."""
    sync(device)
    t0 = clock()
    out, _ = model(x)
    out.sum().backward()
    sync(device)
    t = clock() - t0
    model.zero_grad(set_to_none=True)
    return t


def per_round_ratio(times: dict[str, list[float]], num: str, den: str) -> float:
    """Median over rounds of time[num] / time[den], each pair measured in the same round."""
    return statistics.median(a / b for a, b in zip(times[num], times[den], strict=True))


def models_for(I: int, H: int, device: torch.device) -> dict[str, nn.Module]:
    """The models timed at one size, by name."""
    models: dict[str, nn.Module] = {
        "torch.nn.LSTM": nn.LSTM(I, H),
        LN_HAND: lnbook.LSTM(I, H, bptt="hand"),
        LN_LOOP: lnbook.LSTM(I, H),  # the default
        "lnbook.LSTM(layer_norm=False)": lnbook.LSTM(I, H, layer_norm=False),
        "torch.nn.GRU": nn.GRU(I, H),
        "lnbook.GRU(layer_norm=True)": lnbook.GRU(I, H),
        "lnbook.GRU(layer_norm=False)": lnbook.GRU(I, H, layer_norm=False),
    }
    return {k: m.to(device) for k, m in models.items()}


def bench(device: torch.device, sizes: list, rounds: int, clock) -> list[dict]:
    """Per size: one warm-up pass per model, then ``rounds`` interleaved rounds."""
    rows = []
    for (T, B, I, H), target in sizes:
        torch.manual_seed(0)
        x = torch.randn(T, B, I, device=device)
        models = models_for(I, H, device)
        for m in models.values():
            fwd_bwd(m, x, device, clock)
        names = list(models)
        times: dict[str, list[float]] = {k: [] for k in models}
        for r in range(rounds):
            for k in names[r % len(names) :] + names[: r % len(names)]:
                times[k].append(fwd_bwd(models[k], x, device, clock))
        t = {k: statistics.median(v) for k, v in times.items()}
        ratio = per_round_ratio(times, LN_LOOP, "torch.nn.LSTM")  # the default LN-LSTM
        rows.append({
            "T": T, "B": B, "input": I, "hidden": H, "target": target,
            "seconds": t, "all_seconds": times,
            "ratio_ln_lstm_vs_torch": ratio,
            "meets_target": ratio <= target,
            "ratio_ln_lstm_hand_vs_torch": per_round_ratio(times, LN_HAND, "torch.nn.LSTM"),
            "ratio_hand_vs_loop": per_round_ratio(times, LN_HAND, LN_LOOP),
            "ratio_plain_lstm_vs_torch": per_round_ratio(
                times, "lnbook.LSTM(layer_norm=False)", "torch.nn.LSTM"),
            "ratio_ln_gru_vs_torch": per_round_ratio(
                times, "lnbook.GRU(layer_norm=True)", "torch.nn.GRU"),
            "ratio_ln_gru_vs_plain_gru": per_round_ratio(
                times, "lnbook.GRU(layer_norm=True)", "lnbook.GRU(layer_norm=False)"),
            "ms_per_step_ln_gru": 1e3 * t["lnbook.GRU(layer_norm=True)"] / T,
            "ms_per_step_plain_gru": 1e3 * t["lnbook.GRU(layer_norm=False)"] / T,
            "ms_per_step_torch_gru": 1e3 * t["torch.nn.GRU"] / T,
        })
    return rows


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto")
    p.add_argument("--rounds", type=int, default=11)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="wall: time.perf_counter; cpu: this process's CPU time")
    p.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test)")
    p.add_argument("--out", default=str(RESULTS / "lstm.json"),
                   help="JSON file to write ('' to skip writing)")
    args = p.parse_args(argv)
    if args.rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {args.rounds}")
    device = lnbook.resolve_device(args.device)
    if args.clock == "cpu" and device.type != "cpu":
        raise ValueError("--clock cpu measures CPU time: use it with --device cpu")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    rows = bench(device, QUICK_SIZES if args.quick else SIZES, args.rounds, clock)
    desc = {**machine_description(device), "clock": args.clock}
    print(f"device {device}, torch {torch.__version__}, {desc['torch_threads']} threads, "
          f"{desc['cpu']}, {args.clock} clock, load average {desc['load_average_1min']}")
    print(f"{'T':>4} {'B':>4} {'in':>4} {'H':>4} | {'torch LSTM ms':>13} {'LN-LSTM ms':>10} "
          f"{'ratio':>6} {'target':>6} {'hand ratio':>10} {'hand/loop':>9} {'noLN ratio':>10} | "
          f"{'GRU ratio':>9}")
    for r in rows:
        s = r["seconds"]
        print(f"{r['T']:>4} {r['B']:>4} {r['input']:>4} {r['hidden']:>4} | "
              f"{1e3 * s['torch.nn.LSTM']:>13.1f} {1e3 * s[LN_LOOP]:>10.1f} "
              f"{r['ratio_ln_lstm_vs_torch']:>6.2f} {r['target']:>6.1f} "
              f"{r['ratio_ln_lstm_hand_vs_torch']:>10.2f} {r['ratio_hand_vs_loop']:>9.2f} "
              f"{r['ratio_plain_lstm_vs_torch']:>10.2f} | {r['ratio_ln_gru_vs_torch']:>9.2f}")
    met = all(r["meets_target"] for r in rows)
    print(f"meets every target: {met}")
    result = {"device": str(device), "machine": desc, "rounds": args.rounds,
              "measure": f"forward+backward seconds ({args.clock} clock), median over "
                         "interleaved rounds; ratios are medians of the per-round ratios",
              "meets_targets": met, "rows": rows}
    if not args.out:
        return result
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
