"""Speed of lnbook's recurrent layers against torch's, as ratios measured in one run.

Issue 3, book chapter Supplement (section "Speed"). Forward + backward of ``lnbook.LSTM``
(with layer norm: fused with the C step kernel, fused with torch operations for each step, and
as the step-by-step loop; and without layer norm) against
:class:`torch.nn.LSTM` at the issue's sizes, and of ``lnbook.GRU`` against
:class:`torch.nn.GRU` (the per-iteration cost the paper discusses in section 6.3, claim C14).
Target: the LN-LSTM at most 2x torch.nn.LSTM. Prints a table and writes
``benchmarks/results/lstm.json`` with the machine description.

    python benchmarks/bench_lstm.py [--device auto] [--rounds 11] [--threads N] [--quick]
    OMP_WAIT_POLICY=ACTIVE python benchmarks/bench_lstm.py   # OpenMP workers spin, never sleep

With several threads, a time loop in Python leaves gaps between torch's parallel operations in
which OpenMP's idle workers may fall asleep, and waking them costs more than a small step's
work; whether they do moves the small size's ratio between runs. The machine description
records the policy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from common import machine_description, sync
from torch import nn

import lnbook

SIZES = [  # (T, B, input, hidden)
    (100, 32, 64, 256),
    (100, 64, 512, 512),
]
QUICK_SIZES = [(20, 8, 16, 32)]
TARGET = 2.0  # issue 3: LN-LSTM forward + backward at most 2x torch.nn.LSTM


def fwd_bwd(model: nn.Module, x: torch.Tensor, device: torch.device) -> float:
    """Seconds of one forward + backward pass (the sum of the outputs as the loss)."""
    sync(device)
    t0 = time.perf_counter()
    out, _ = model(x)
    out.sum().backward()
    sync(device)
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def per_round_ratio(times: dict[str, list[float]], num: str, den: str) -> float:
    """Median over rounds of time[num] / time[den], each pair measured in the same round."""
    return statistics.median(a / b for a, b in zip(times[num], times[den], strict=True))


def bench(device: torch.device, sizes: list[tuple[int, int, int, int]], rounds: int) -> list:
    """Per size: one warm-up pass per model, then ``rounds`` rounds in which every model runs
    once, in an order rotated each round (interleaved, so that all share the machine's load
    alike). Times are medians over rounds; each ratio is the median of the per-round ratios."""
    rows = []
    for T, B, I, H in sizes:
        torch.manual_seed(0)
        x = torch.randn(T, B, I, device=device)
        models = {
            "torch.nn.LSTM": nn.LSTM(I, H).to(device),
            "lnbook.LSTM(layer_norm=False)": lnbook.LSTM(I, H, layer_norm=False).to(device),
            "lnbook.LSTM(layer_norm=True)": lnbook.LSTM(I, H, layer_norm=True).to(device),
            "lnbook.LSTM(layer_norm=True, native=False)":
                lnbook.LSTM(I, H, native=False).to(device),
            "lnbook.LSTM(layer_norm=True, fused=False)": lnbook.LSTM(I, H, fused=False).to(device),
            "torch.nn.GRU": nn.GRU(I, H).to(device),
            "lnbook.GRU(layer_norm=False)": lnbook.GRU(I, H, layer_norm=False).to(device),
            "lnbook.GRU(layer_norm=True)": lnbook.GRU(I, H, layer_norm=True).to(device),
        }
        for m in models.values():
            fwd_bwd(m, x, device)
        names = list(models)
        times: dict[str, list[float]] = {k: [] for k in models}
        for r in range(rounds):
            for k in names[r % len(names) :] + names[: r % len(names)]:
                times[k].append(fwd_bwd(models[k], x, device))
        t = {k: statistics.median(v) for k, v in times.items()}
        rows.append({
            "T": T, "B": B, "input": I, "hidden": H, "seconds": t, "all_seconds": times,
            "ratio_ln_lstm_vs_torch": per_round_ratio(
                times, "lnbook.LSTM(layer_norm=True)", "torch.nn.LSTM"),
            "ratio_ln_lstm_torch_ops_vs_torch": per_round_ratio(
                times, "lnbook.LSTM(layer_norm=True, native=False)", "torch.nn.LSTM"),
            "ratio_ln_lstm_loop_vs_torch": per_round_ratio(
                times, "lnbook.LSTM(layer_norm=True, fused=False)", "torch.nn.LSTM"),
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
    p.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "lstm.json"),
                   help="JSON file to write ('' to skip writing)")
    args = p.parse_args(argv)
    device = lnbook.resolve_device(args.device)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    rows = bench(device, QUICK_SIZES if args.quick else SIZES, args.rounds)
    desc = machine_description(device)
    native = lnbook.rnn.native_status()
    print(f"device {device}, torch {torch.__version__}, {desc['torch_threads']} threads, "
          f"{desc['cpu']}\n{native}")
    print(f"{'T':>4} {'B':>4} {'in':>4} {'H':>4} | {'torch LSTM ms':>13} {'LN-LSTM ms':>10} "
          f"{'ratio':>6} {'torch-ops ratio':>15} {'loop ratio':>10} {'plain ratio':>11} | "
          f"{'GRU ratio':>9} {'LN-GRU/GRU loop':>15}")
    for r in rows:
        s = r["seconds"]
        print(f"{r['T']:>4} {r['B']:>4} {r['input']:>4} {r['hidden']:>4} | "
              f"{1e3 * s['torch.nn.LSTM']:>13.1f} {1e3 * s['lnbook.LSTM(layer_norm=True)']:>10.1f} "
              f"{r['ratio_ln_lstm_vs_torch']:>6.2f} {r['ratio_ln_lstm_torch_ops_vs_torch']:>15.2f} "
              f"{r['ratio_ln_lstm_loop_vs_torch']:>10.2f} "
              f"{r['ratio_plain_lstm_vs_torch']:>11.2f} | "
              f"{r['ratio_ln_gru_vs_torch']:>9.2f} {r['ratio_ln_gru_vs_plain_gru']:>15.2f}")
    met = all(r["ratio_ln_lstm_vs_torch"] <= TARGET for r in rows)
    print(f"meets target (LN-LSTM <= {TARGET}x torch.nn.LSTM): {met}")
    result = {"device": str(device), "machine": desc, "native": native, "rounds": args.rounds,
              "measure": "forward+backward seconds, median over interleaved rounds; "
                         "ratios are medians of the per-round ratios",
              "target": TARGET, "meets_target": met, "rows": rows}
    if not args.out:
        return result
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
