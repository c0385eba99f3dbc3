"""Benchmark the hooks library: quantization kernel throughput and DDP step time per hook.

    .venv/bin/python bench/hooks_bench.py            # full (a few minutes on 2 cores)
    .venv/bin/python bench/hooks_bench.py --quick    # small sizes, for a smoke run
    .venv/bin/python bench/hooks_bench.py --kernels-only   # section 1 alone (~1 minute)

1. A 25 MB float32 bucket: quantize + dequantize GB/s (input bytes / seconds) of our per-tensor
   and per-channel (chunk 512) kernels on each backend (native C and the torch fallback, into
   preallocated outputs as the hooks use them), of torch's own per-channel helpers from
   torch.distributed.algorithms.ddp_comm_hooks.quantization_hooks called directly (a Python loop
   over channels), of ATen's torch.quantize_per_channel + dequantize, and of a plain copy (the
   memory-bandwidth roof). One thread; the kernels run round-robin in every repeat (median), and
   each row gives % of the copy's speed and the speed-up over torch's helpers and over ATen.
   Issue 7's targets: >= 50% of copy, >= 10x torch's helpers.
   The issue-18 compressors' kernels (encode + decode of one rank's contribution, no
   collective) on the same bucket, against the same copy: signsgd's bit packing (ours: bytes
   of 0/1 read as int64 and gathered by one multiply, against a multiply-and-sum over each
   byte's 8 bits) and sign table unpacking, signsgd and qsgd encode + decode (chunk 512), topk
   1% select + densify, randomk 1% index draw (one per stratum, against torch.randperm) + densify.
2. DDP step time (forward + backward + hook + SGD step) at world size 2 on gloo (127.0.0.1) for
   every hook, relative to allreduce: same model and data; hooks interleaved per repeat so machine
   noise hits them alike; median over repeats.

Prints a table and writes bench/results/hooks.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import hooks  # noqa: E402
from hooks import quantize as q  # noqa: E402


def _interleaved_medians(cases: list[tuple[str, object, int]], repeats: int) -> dict[str, float]:
    """Median seconds per case, the cases run round-robin (copy, ours, torch's, ...) in every
    repeat so that load changes on a shared machine hit them alike. A case with a repeat cap
    (torch's Python-loop helpers take seconds) joins only the first ``cap`` rounds."""
    for _, fn, _ in cases:
        fn()  # warm up: page-in, first-call builds
    times: dict[str, list[float]] = {label: [] for label, _, _ in cases}
    for i in range(repeats):
        for label, fn, cap in cases:
            if i >= cap:
                continue
            t0 = time.perf_counter()
            fn()
            times[label].append(time.perf_counter() - t0)
    return {label: statistics.median(ts) for label, ts in times.items()}


COPY = "plain copy (bandwidth roof)"
TORCH_HELPERS = "torch quantization_hooks helpers, per channel (Python loop)"
ATEN = "ATen quantize_per_channel + dequantize"


def kernel_throughput(nbytes: int, repeats: int) -> dict:
    """quantize + dequantize of one float32 bucket of ``nbytes``: every kernel against a copy."""
    from torch.distributed.algorithms.ddp_comm_hooks import quantization_hooks as tq

    n = nbytes // 4
    x = torch.randn(n)
    out = torch.empty_like(x)

    def ours(chunk, backend):
        # Preallocated outputs, as the hooks use them: codes/meta are views into the message
        # buffer and dequantize writes into the bucket.
        codes, meta = q.quantize(x, chunk, backend=backend)

        def run():
            q.quantize(x, chunk, codes=codes, meta=meta, backend=backend)
            q.dequantize(codes, meta, chunk, out=out, backend=backend)

        return run

    chunks = x[: n - n % 512].view(-1, 512)
    scale = (chunks.amax(1) - chunks.amin(1)).clamp_min(1e-12) / 255
    zero = (-chunks.amin(1) / scale).round().clamp(0, 255)

    def torch_hook_helpers():
        y = tq._quantize_per_channel_backend(chunks, scale, zero)
        tq._dequantize_per_channel_backend(y, scale, zero)

    def aten_per_channel():
        y = torch.quantize_per_channel(chunks, scale.double(), zero.long(), 0, torch.quint8)
        y.dequantize()

    backend = q.kernel_backend()
    cases = [(COPY, lambda: out.copy_(x), repeats)]
    if backend == "native":
        cases += [
            ("ours native, per tensor", ours(n, "native"), repeats),
            ("ours native, per channel (chunk 512)", ours(512, "native"), repeats),
        ]
    cases += [
        ("ours torch path, per tensor", ours(n, "torch"), repeats),
        ("ours torch path, per channel (chunk 512)", ours(512, "torch"), repeats),
        (TORCH_HELPERS, torch_hook_helpers, min(repeats, 3)),
        (ATEN, aten_per_channel, repeats),
    ]
    medians = _interleaved_medians(cases, repeats)
    rows = []
    for label, s in medians.items():
        rows.append(
            {
                "kernel": label,
                "seconds": s,
                "gb_per_s": nbytes / s / 1e9,
                "pct_of_copy": 100 * medians[COPY] / s,
                "speedup_vs_torch_helpers": medians[TORCH_HELPERS] / s,
                "speedup_vs_aten": medians[ATEN] / s,
            }
        )
    return {"backend": backend, "native_unavailable_reason": q.native_unavailable_reason(), "repeats": repeats, "rows": rows}


def compressor_kernels(nbytes: int, repeats: int) -> dict:
    """Encode + decode of the issue-18 compressors on one float32 bucket of ``nbytes``, one rank's
    share (no collective), every kernel round-robin with a copy."""
    from hooks import chunks, qsgd, sign, sparsify

    n = nbytes // 4
    x = torch.randn(n)
    out = torch.empty_like(x)
    chunk = 512
    c = chunks.num_chunks(n, chunk)
    nb = -(-n // 8)
    packed = torch.empty(nb, dtype=torch.uint8)
    weights = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8)

    def pack_mul_sum():  # the plain alternative: multiply each byte's 8 bits by 2^j and sum
        bits = torch.zeros(8 * nb, dtype=torch.bool)
        torch.lt(x, 0, out=bits[:n])
        torch.sum(bits.view(torch.uint8).view(nb, 8) * weights, dim=1, dtype=torch.uint8, out=packed)

    def sign_roundtrip():
        scales = chunks.reduce(x, chunk, sign._mean_abs)
        sign.pack_signs(x, out=packed)
        chunks.scale(sign.unpack_signs(packed, n), scales, chunk, out=out)

    codes, norms = torch.empty(n, dtype=torch.int8), torch.empty(c)
    gen = torch.Generator().manual_seed(0)

    def qsgd_roundtrip():
        qsgd.encode(x, 127, chunk, gen, codes, norms)
        qsgd.decode(codes, norms, 127, chunk, out=out)

    k = sparsify.num_selected(n, 0.01)

    def topk_roundtrip():
        idx = x.abs().topk(k, sorted=False).indices
        values = x.index_select(0, idx)
        out.zero_()
        out.index_add_(0, idx, values)

    def randomk_roundtrip():
        idx = sparsify.strata_indices(n, k, gen)
        values = x.index_select(0, idx)
        out.zero_()
        out.index_copy_(0, idx, values)

    cases = [
        (COPY, lambda: out.copy_(x), repeats),
        ("sign bits: pack (ours, int64 gather-multiply)", lambda: sign.pack_signs(x, out=packed), repeats),
        ("sign bits: pack (multiply-and-sum per byte)", pack_mul_sum, repeats),
        ("sign bits: unpack to +-1 floats (table lookup)", lambda: sign.unpack_signs(packed, n), repeats),
        ("signsgd encode + decode (chunk 512)", sign_roundtrip, repeats),
        ("qsgd encode + decode (levels 127, chunk 512)", qsgd_roundtrip, repeats),
        ("topk 1%: select + densify", topk_roundtrip, repeats),
        ("randomk 1%: draw (strata) + densify", randomk_roundtrip, repeats),
        ("randomk 1%: torch.randperm(N)[:k] draw alone", lambda: torch.randperm(n, generator=gen)[:k], min(repeats, 3)),
    ]
    medians = _interleaved_medians(cases, repeats)
    rows = [{"kernel": label, "seconds": sec, "gb_per_s": nbytes / sec / 1e9, "pct_of_copy": 100 * medians[COPY] / sec}
            for label, sec in medians.items()]
    return {"repeats": repeats, "rows": rows}


def print_compressor_kernels(kernels: dict, nbytes: int) -> None:
    print(f"\ncompressor kernels on a {nbytes / 1e6:g} MB float32 bucket, one rank, no collective "
          f"(1 thread, median of {kernels['repeats']} interleaved rounds; GB/s = bucket bytes / s)")
    print(f"{'kernel':52s} {'ms':>9s} {'GB/s':>8s} {'% copy':>7s}")
    for r in kernels["rows"]:
        print(f"{r['kernel']:52s} {r['seconds'] * 1e3:9.2f} {r['gb_per_s']:8.3f} {r['pct_of_copy']:7.1f}")
    print(f"load average: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


def print_kernels(kernels: dict, nbytes: int) -> None:
    print(f"\nquantize + dequantize of a {nbytes / 1e6:g} MB float32 bucket (1 thread, median of {kernels['repeats']} interleaved rounds)")
    print(f"default backend: {kernels['backend']}" + (f" ({kernels['native_unavailable_reason']})" if kernels["native_unavailable_reason"] else ""))
    print(f"{'kernel':62s} {'ms':>9s} {'GB/s':>8s} {'% copy':>7s} {'x helpers':>10s} {'x ATen':>7s}")
    for r in kernels["rows"]:
        print(
            f"{r['kernel']:62s} {r['seconds'] * 1e3:9.2f} {r['gb_per_s']:8.3f} {r['pct_of_copy']:7.1f} "
            f"{r['speedup_vs_torch_helpers']:10.1f} {r['speedup_vs_aten']:7.2f}"
        )
    print(f"load average: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


# ----------------------------------------------------------------------------- DDP step time
def _ddp_worker(rank: int, world_size: int, names: list, width: int, steps: int, repeats: int) -> dict:
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(32, width, generator=g), torch.randint(0, 10, (32,), generator=g)
    models = {}
    for name in names:
        params = {"start_iter": 2} if name == "powersgd" else {}
        model = DDP(nn.Sequential(*[m for m in __import__("copy").deepcopy(base)]))
        state, hook = hooks.build(name, **params)
        model.register_comm_hook(state, hook)
        models[name] = (model, torch.optim.SGD(model.parameters(), lr=1e-3), state)

    def run(name, k):
        model, opt, _ = models[name]
        for _ in range(k):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

    for name in names:  # warm up: bucket rebuild, PowerSGD past start_iter
        run(name, 4)
    times = {name: [] for name in names}
    for _ in range(repeats):
        for name in names:
            torch.distributed.barrier()
            t0 = time.perf_counter()
            run(name, steps)
            times[name].append((time.perf_counter() - t0) / steps)
    stats = {name: models[name][2].stats() for name in names}
    return {"times": times, "stats": stats}


def ddp_step_times(width: int, steps: int, repeats: int) -> list[dict]:
    from tests.dist_utils import run_distributed

    names = list(hooks.available())
    results = run_distributed(_ddp_worker, world_size=2, args=(names, width, steps, repeats), timeout_s=1800)
    rank0 = results[0]
    # A step ends when the slowest rank ends it: take the max over ranks per repeat, then the median.
    medians = {
        name: statistics.median(max(r["times"][name][i] for r in results) for i in range(repeats)) for name in names
    }
    base = medians["allreduce"]
    rows = []
    for name in names:
        s = rank0["stats"][name]
        rows.append(
            {
                "hook": name,
                "step_ms": medians[name] * 1e3,
                "relative_to_allreduce": medians[name] / base,
                "wire_bytes_per_call": s["wire_bytes"] / max(s["calls"], 1),
                "hook_ms_per_call": s["seconds"] / max(s["calls"], 1) * 1e3,
                "payload_over_raw": s["payload_bytes"] / max(s["raw_bytes"], 1),
            }
        )
    return rows


def projections(ddp_rows: list[dict], n: int = 25_000_000 // 4) -> list[dict]:
    """hooks.cost: projected communication of one 25 MB bucket at W = 8, 64, 512 on 10/100 Gbit/s."""
    fraction = {r["hook"]: r["payload_over_raw"] for r in ddp_rows}
    rows = []
    for name in hooks.available():
        params = {"compressed_fraction": fraction.get(name, 1.0)} if name == "powersgd" else {}
        row = {"hook": name}
        for w in (8, 64, 512):
            for gbps in (10, 100):
                row[f"w{w}_{gbps}gbps_ms"] = hooks.cost.hook_seconds(name, n, w, gbps, **params) * 1e3
        rows.append(row)
    return rows


def _machine() -> dict:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg(),
        "torch": torch.__version__,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes and few repeats (a smoke run)")
    ap.add_argument("--kernels-only", action="store_true", help="only section 1 (kernel throughput)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "hooks.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"

    nbytes = 2_500_000 if args.quick else 25_000_000
    load_before = os.getloadavg()
    kernels = kernel_throughput(nbytes, repeats=3 if args.quick else 9)
    kernels["load_average_before"] = load_before
    kernels["load_average_after"] = os.getloadavg()
    print_kernels(kernels, nbytes)
    load_before = os.getloadavg()
    compressors = compressor_kernels(nbytes, repeats=3 if args.quick else 9)
    compressors["load_average_before"] = load_before
    compressors["load_average_after"] = os.getloadavg()
    print_compressor_kernels(compressors, nbytes)
    if args.kernels_only:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"quick": args.quick, "machine": _machine(), "kernels": kernels,
                                   "compressor_kernels": compressors}, indent=2))
        print(f"\nwrote {out}")
        return

    width, steps, repeats = (256, 3, 3) if args.quick else (1024, 5, 7)
    ddp = ddp_step_times(width, steps, repeats)
    params = 2 * width * width + width * 10
    print(f"\nDDP step at world size 2, gloo on 127.0.0.1, MLP of {params / 1e6:.2f} M params (median of {repeats})")
    print(f"{'hook':28s} {'step ms':>9s} {'vs allreduce':>13s} {'wire B/call':>12s} {'hook ms/call':>13s}")
    for r in ddp:
        print(
            f"{r['hook']:28s} {r['step_ms']:9.2f} {r['relative_to_allreduce']:13.2f} "
            f"{r['wire_bytes_per_call']:12.0f} {r['hook_ms_per_call']:13.2f}"
        )

    proj = projections(ddp)
    print("\nhooks.cost: projected communication of one 25 MB bucket, ms (alpha = 5 us; PowerSGD at its measured fraction)")
    cols = [f"w{w}_{g}gbps_ms" for w in (8, 64, 512) for g in (10, 100)]
    print(f"{'hook':28s} " + " ".join(f"{c.replace('_ms', ''):>12s}" for c in cols))
    for r in proj:
        print(f"{r['hook']:28s} " + " ".join(f"{r[c]:12.1f}" for c in cols))

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"quick": args.quick, "machine": _machine(), "kernels": kernels,
                               "compressor_kernels": compressors, "ddp_world_size_2": ddp, "projections_25mb_bucket": proj}, indent=2))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
