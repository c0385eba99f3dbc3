"""GPU check: every hook, the quantize kernels and one sweep trial on one CUDA device.

    scripts/gpu_check.sh                  # one CUDA device, a few minutes (exit 2 without one)
    scripts/gpu_check.sh --dry-run        # the same code paths on CPU tensors and gloo, small buckets

What it checks (one table, one row per check; exit 1 if any result is wrong):

1. hooks: each hook of ``hooks.available()`` (default parameters) on buckets of 1 M, 4 M, 16 M
   and 64 M floats, its result against the exact mean of every rank's input (exact hooks within
   float32 rounding, lossy ones within their documented per-element bound, the bounds of
   tests/hooks_checks.py; a periodic hook, post_local_sgd or diloco, by its exchange after the
   optimizer step, whose average is exact), at world size 1 with NCCL and at world size 2 with gloo over CUDA
   tensors (NCCL refuses two ranks on one device). A collective that gloo does not offer for
   CUDA tensors is probed first and every hook that needs it is listed as skipped, with gloo's
   own one-line reason; that is not a failure.
2. kernels: the quantize + dequantize kernels (``hooks.quantize``, the path CUDA tensors take)
   on a 64 M-float bucket against a device-to-device copy of it (target >= 60 % of copy), and
   their codes against the CPU kernels' codes on the same input (bit-identical by design).
3. sweep: ``python -m service.sweep`` on a one-trial config with ``resources.use_gpu: true``
   (NCCL through Ray Train, one GPU). Not in --dry-run unless ``--sweep`` (a Ray sweep costs
   30 s+ on a laptop, and the test suite already runs the CPU sweep); ``--dry-run --sweep`` runs
   it with ``use_gpu: false``.

Wrong results exit 1; below the bandwidth target is reported in the table and does not change
the exit status (it is a speed, not a wrong result). JSON in bench/results/gpu_check.json.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, Rendezvous, join_group, load_average, machine, median, table, write_json  # noqa: E402

M = 1 << 20
GPU_SIZES = (1 * M, 4 * M, 16 * M, 64 * M)
# odd lengths (not multiples of a chunk) so the tail chunk is exercised, as on the GPU sizes' ragged buckets
DRY_SIZES = (4096 + 37, 65536 + 5)
GPU_KERNEL_FLOATS, DRY_KERNEL_FLOATS = 64 * M, 1 * M
BANDWIDTH_TARGET = 0.60  # quantize + dequantize over a device-to-device copy of the same bucket
CHUNK = 512
# input "layers" of very different scales, as gradients are (tests/hooks_checks.py: layered)
SCALES = (1e-4, 1e-1, 1.0, 30.0)
NEEDS_CUDA = ("this check needs a CUDA device: torch.cuda.is_available() is False here (torch {version}); "
              "install a CUDA build of torch==2.13.0 (e.g. pip install torch==2.13.0 --index-url "
              "https://download.pytorch.org/whl/cu128) on a machine with an NVIDIA GPU, or run --dry-run")


def one_line(exc: BaseException) -> str:
    from service.text import one_line as _one_line

    return _one_line(exc)


# --------------------------------------------------------------------------- inputs and bounds


def gradient(n: int, seed: int, device) -> "torch.Tensor":
    """A gradient-like float32 vector on ``device``: four consecutive layers of SCALES."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(n, generator=g, device=device)
    edges = [n * i // len(SCALES) for i in range(len(SCALES) + 1)]
    for s, a, b in zip(SCALES, edges, edges[1:]):
        x[a:b] *= s
    return x


def per_chunk(x: "torch.Tensor", chunk: int, fn) -> "torch.Tensor":
    """fn(values (rows, len)) -> (rows,) per chunk of ``chunk`` consecutive elements of each row of
    x (W, n), expanded back to every element: (W, n). Vectorised (the tail chunk separately)."""
    import torch

    w, n = x.shape
    full = n // chunk
    parts = []
    if full:
        parts.append(fn(x[:, : full * chunk].reshape(w * full, chunk)).reshape(w, full, 1).expand(w, full, chunk)
                     .reshape(w, full * chunk))
    if n > full * chunk:
        tail = x[:, full * chunk:]
        parts.append(fn(tail).reshape(w, 1).expand(w, tail.shape[1]))
    return torch.cat(parts, dim=1)


def _span(v):
    lo, hi = v.aminmax(dim=1)
    return hi - lo


def quant_bound(inputs, chunk: int):
    """Allgather quantizers: mean over ranks of half a step per chunk (+ float32 rounding)."""
    step = per_chunk(inputs, chunk, _span) / 255
    amax = per_chunk(inputs, chunk, lambda v: v.abs().amax(dim=1))
    return (0.5 * step + 1e-6 * amax).sum(0) / inputs.shape[0]


def qar_bound(inputs, chunk: int):
    """quantized_allreduce: the first quantization's bound plus half a step of the reduced chunk."""
    first = quant_bound(inputs, chunk)
    mean = (inputs.sum(0) / inputs.shape[0])[None]
    widened = per_chunk(mean, chunk, _span)[0] + 2 * per_chunk(first[None], chunk, lambda v: v.amax(dim=1))[0]
    return first + widened / 510 + 1e-6 * per_chunk(mean, chunk, lambda v: v.abs().amax(dim=1))[0]


def bound(name: str, inputs, params: dict):
    """Per-element bound on |hook result - exact mean| given every rank's input (W, n)."""
    import torch

    import hooks

    w, n = inputs.shape
    abs_sum = inputs.abs().sum(0)
    if name == hooks.plan.NAME:  # the check's one bucket (index 0) runs its configuration: that one's bound
        import hooks.plan

        text = hooks.plan.PlanText(hooks.validate)
        inner, inner_params = text.buckets(params["buckets"]).get(0, text.config(params["default"]))
        return bound(inner, inputs, inner_params)
    if name in ("allreduce", "allgather_then_aggregate", "powersgd"):
        # powersgd with its defaults: plain allreduces before start_iter (no elementwise bound after)
        return 2e-7 * abs_sum + 1e-30
    if name in ("fp16_compress", "bf16_compress"):
        unit = 2.0**-11 if name == "fp16_compress" else 2.0**-8
        return unit * (w + 1) * abs_sum / w + w * 6e-8
    if name == "quantization_pertensor":
        return quant_bound(inputs, n)
    if name == "quantization_perchannel":
        return quant_bound(inputs, params["chunk_size"])
    if name == "quantized_allreduce":
        return qar_bound(inputs, params["chunk_size"])
    if name == "topk":
        k = hooks.sparsify.num_selected(n, params["ratio"])
        tau = inputs.abs().topk(k, dim=1).values[:, k - 1:k]
        return torch.minimum(inputs.abs(), tau).sum(0) / w + 2e-7 * abs_sum
    if name == "randomk":  # the exact mean on the kept indices, 0 elsewhere
        return (inputs.sum(0) / w).abs() + 2e-7 * abs_sum
    if name == "signsgd":
        scales = per_chunk(inputs, params["chunk_size"], lambda v: v.abs().mean(dim=1))
        if params["majority_vote"]:
            return scales.mean(0) + (inputs.sum(0) / w).abs() + 1e-6
        return (scales - inputs.abs()).abs().sum(0) / w + 1e-6 * (scales + inputs.abs()).sum(0) / w
    if name == "qsgd":
        norms = per_chunk(inputs, params["chunk_size"], lambda v: v.norm(dim=1))
        return norms.sum(0) / w / params["levels"] * (1 + 1e-5) + 1e-6 * abs_sum
    raise ValueError(f"no bound for hook {name!r}: add one to bench/gpu_check.py")


class Bucket:
    """What a hook reads from DDP's GradBucket, around one flat gradient tensor."""

    def __init__(self, tensor):
        import torch

        self._buffer = tensor
        self._params = [torch.zeros_like(tensor)]

    def buffer(self):
        return self._buffer

    def index(self):
        return 0

    def is_last(self):
        return True

    def parameters(self):
        return self._params

    def gradients(self):
        return [self._buffer]


# --------------------------------------------------------------------------- hooks, in W processes


def probe_collectives(device) -> dict[str, str | None]:
    """{collective: None if the group runs it on ``device`` tensors, else the one-line reason}."""
    import torch
    import torch.distributed as dist

    from hooks.wire import KINDS

    w = dist.get_world_size()
    x = torch.ones(4 * w, device=device)
    calls = {"allreduce": lambda: dist.all_reduce(x.clone()),
             "allgather": lambda: dist.all_gather_single(torch.empty(w * x.numel(), device=device), x),
             "all_to_all": lambda: dist.all_to_all_single(torch.empty_like(x), x)}
    out = {}
    for kind in KINDS:
        try:
            calls[kind]()
            out[kind] = None
        except Exception as exc:  # e.g. gloo: no CUDA all_to_all
            out[kind] = one_line(exc)
    return out


def needed_collectives(name: str, n: int, w: int, params: dict) -> set[str]:
    import hooks

    kinds = {c.kind for c in hooks.cost.hook_collectives(name, n, w, **params)}
    spec = hooks.available()[name]
    if spec.periodic:  # its exchange: one call of its sync hook on every parameter
        sync, sync_params = spec.sync(params)
        kinds |= {c.kind for c in hooks.cost.hook_collectives(sync, n, w, **sync_params)}
    return kinds


def check_hooks(rank: int, w: int, device_kind: str, sizes: list[int]) -> list[dict]:
    """Every hook on every size in this rank (group initialised); rank 0's rows are the result."""
    import torch
    import torch.distributed as dist

    import hooks

    device = torch.device("cuda", 0) if device_kind == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = dist.get_backend()
    unsupported = {k: v for k, v in probe_collectives(device).items() if v}
    rows = []
    for n in sizes:
        inputs = torch.stack([gradient(n, seed=100 + r, device=device) for r in range(w)])
        exact = inputs.sum(0) / w
        for name, spec in hooks.available().items():
            params = hooks.validate(name)
            row = {"check": "hook", "case": name, "world_size": w, "backend": backend, "device": device.type,
                   "floats": n}
            missing = sorted(needed_collectives(name, n, w, params) & set(unsupported))
            if missing:
                rows.append({**row, "result": "skipped",
                             "detail": f"{backend} has no {missing[0]} for {device.type} tensors: "
                                       f"{unsupported[missing[0]]}"})
                continue
            try:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                state, out = (exchanged(name, inputs[rank]) if spec.periodic
                              else called(name, inputs[rank]))
                if device.type == "cuda":
                    torch.cuda.synchronize()
                seconds = time.perf_counter() - t0
                err = (out.reshape(-1).float() - exact).abs()
                limit = bound("allreduce" if spec.periodic else name, inputs, params)
                ratio = float((err / limit).max())
                ok = (out.device == device and bool(torch.isfinite(out).all()) and ratio <= 1.0
                      and state.stats()["nonfinite_inputs"] == 0)
                rows.append({**row, "result": "ok" if ok else "WRONG", "ms": 1e3 * seconds,
                             "max_err_over_bound": ratio,
                             "detail": "" if ok else f"max |result - exact mean| / bound = {ratio:.3g}, "
                                                     f"result on {out.device}"})
            except Exception as exc:
                rows.append({**row, "result": "WRONG", "detail": f"raised {one_line(exc)}"})
            # every rank must reach the next hook together (a rank that raised did not communicate)
            dist.barrier()
        del inputs, exact
    return rows


def called(name: str, x):
    """(state, result) of one call of hook ``name`` on a bucket holding ``x``."""
    import hooks

    state, hook = hooks.build(name, process_group=None)
    return state, hook(state, Bucket(x.clone())).wait()


def exchanged(name: str, x):
    """(state, parameters after one exchange) of periodic hook ``name`` (its exchange follows the
    optimizer step, not its DDP call): a parameter holding ``x`` averaged by post_local_sgd; for
    diloco (outer lr 1, no momentum) an anchor of zeros moved by the mean pseudo-gradient -x, so
    both give the ranks' mean of ``x``."""
    import torch

    import hooks

    extra = {"outer_lr": 1.0, "outer_momentum": 0.0} if name == "diloco" else {}
    state, _ = hooks.build(name, process_group=None, period=1, **extra)
    module = torch.nn.Linear(1, 1, bias=False).to(x.device)
    module.weight = torch.nn.Parameter(torch.zeros_like(x))
    state.bind(module)
    with torch.no_grad():
        module.weight.copy_(x)
    state.after_step(1)
    return state, module.weight.detach()


def _rank_entry(rank, w, port, backend, device_kind, sizes, queue):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        if device_kind == "cuda":
            torch.cuda.set_device(0)
        kwargs = {"device_id": torch.device("cuda", 0)} if backend == "nccl" else {}
        join_group(port, rank, w, backend, timeout_s=120, **kwargs)
        rows = check_hooks(rank, w, device_kind, sizes)
        queue.put((rank, True, rows))
        dist.destroy_process_group()
    except BaseException:
        queue.put((rank, False, traceback.format_exc()))


def run_hook_checks(w: int, backend: str, device_kind: str, sizes: list[int], timeout_s: float) -> list[dict]:
    """check_hooks on ``w`` spawned processes; rank 0's rows, or one WRONG row naming what broke."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    meet = Rendezvous(w)
    procs = [ctx.Process(target=_rank_entry, args=(r, w, meet.port, backend, device_kind, sizes, queue), daemon=True)
             for r in range(w)]
    for p in procs:
        p.start()
    results, deadline = {}, time.monotonic() + timeout_s
    while len(results) < w and time.monotonic() < deadline:
        if not queue.empty():
            rank, ok, value = queue.get()
            results[rank] = (ok, value)
        elif not any(p.is_alive() for p in procs) and queue.empty():
            break
        else:
            time.sleep(0.05)
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
    row = {"check": "hook", "case": "(all)", "world_size": w, "backend": backend, "device": device_kind}
    failed = [f"rank {r}: {v.strip().splitlines()[-1]}" for r, (ok, v) in sorted(results.items()) if not ok]
    if failed or 0 not in results:
        why = "; ".join(failed) or f"no result within {timeout_s:.0f} s (a rank crashed or hung)"
        return [{**row, "result": "WRONG", "detail": why}]
    return results[0][1]


# --------------------------------------------------------------------------- kernels


def _timed(fn, device, repeats: int) -> float:
    """Median seconds of one call of fn (after one warm-up), device-synchronised."""
    import torch

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return median(times)


def check_kernels(device_kind: str, n: int, rounds: int = 5, repeats: int = 5) -> list[dict]:
    """quantize + dequantize of one n-float bucket against a copy of it, interleaved rounds;
    and the device's codes against the CPU kernels' codes (bit-identical by design)."""
    import torch

    from hooks import quantize as q

    device = torch.device("cuda", 0) if device_kind == "cuda" else torch.device("cpu")
    x = gradient(n, seed=7, device=device)
    out = torch.empty_like(x)
    backend = "torch" if device.type == "cuda" else q.kernel_backend()

    def roundtrip(chunk):
        codes, meta = q.quantize(x, chunk, backend=backend)

        def run():
            q.quantize(x, chunk, codes=codes, meta=meta, backend=backend)
            q.dequantize(codes, meta, chunk, out=out, backend=backend)

        return run

    cases = {"copy": lambda: out.copy_(x), f"per channel (chunk {CHUNK})": roundtrip(CHUNK), "per tensor": roundtrip(n)}
    times: dict[str, list[float]] = {k: [] for k in cases}
    for r in range(rounds):
        for label in (list(cases) if r % 2 == 0 else list(cases)[::-1]):
            times[label].append(_timed(cases[label], device, repeats))
    copy_s = median(times["copy"])
    rows = []
    for label in cases:
        s = median(times[label])
        row = {"check": "kernel", "case": f"quantize + dequantize, {label}" if label != "copy" else
               "device-to-device copy" if device.type == "cuda" else "copy", "device": device.type,
               "backend": backend if label != "copy" else "", "floats": n, "ms": 1e3 * s,
               "gb_per_s": 4 * n / s / 1e9, "pct_of_copy": 100 * copy_s / s}
        if label == "copy":
            row["result"] = "ok"
        else:
            met = copy_s / s >= BANDWIDTH_TARGET
            row["result"] = "ok" if met else "slow"
            row["detail"] = f"target >= {100 * BANDWIDTH_TARGET:.0f}% of copy: {'met' if met else 'not met'}"
        rows.append(row)
    # the device kernels' codes and meta against the CPU kernels' on the same input
    ref_backend = q.kernel_backend() if device.type == "cuda" else "torch"
    sample = x[: min(n, M + 37)]
    for chunk, label in ((CHUNK, f"chunk {CHUNK}"), (sample.numel(), "per tensor")):
        row = {"check": "kernel", "case": f"codes vs CPU {ref_backend} kernels, {label}", "device": device.type,
               "backend": backend, "floats": sample.numel()}
        try:
            codes, meta = q.quantize(sample, chunk, backend=backend)
            ref_codes, ref_meta = q.quantize(sample.cpu(), chunk, backend=ref_backend)
            deq = q.dequantize(codes, meta, chunk, backend=backend)
            differ = int((codes.cpu() != ref_codes).sum())
            meta_same = torch.equal(meta.cpu(), ref_meta)
            err_ok = bool(((deq - sample).abs().cpu() <= per_chunk(sample.cpu()[None], chunk, _span)[0] / 510 * 1.0001
                           + 1e-6 * sample.abs().max().cpu()).all())
            ok = differ == 0 and meta_same and err_ok
            row.update(result="ok" if ok else "WRONG",
                       detail="" if ok else f"{differ} codes differ, meta {'same' if meta_same else 'differs'}, "
                                            f"round trip within half a step: {err_ok}")
        except Exception as exc:
            row.update(result="WRONG", detail=f"raised {one_line(exc)}")
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- one sweep trial


def sweep_yaml(storage: str, use_gpu: bool) -> str:
    return f"""
name: gpu-check
storage_path: {storage}
workload: {{name: mlp_digits, steps: 20, global_batch_size: 64, lr: 0.05, optimizer: sgd,
           eval_every: 20, warmup_steps: 2}}
search: {{hooks: [quantization_perchannel], world_size: [1], seed: [0]}}
resources: {{cpus_per_worker: 1, use_gpu: {str(use_gpu).lower()}, max_concurrent_trials: 1}}
tracking: {{flush_seconds: 2.0}}
"""


def check_sweep(use_gpu: bool, timeout_s: float) -> dict:
    """``python -m service.sweep`` on a one-trial config, in a temporary directory and store."""
    work = Path(tempfile.mkdtemp(prefix="gpu-check-sweep-"))
    config = work / "gpu_check.yaml"
    config.write_text(sweep_yaml(str(work / "ray"), use_gpu))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{work / 'mlflow.db'}"
    row = {"check": "sweep", "case": f"one trial, use_gpu: {str(use_gpu).lower()}", "world_size": 1,
           "backend": "nccl" if use_gpu else "gloo", "device": "cuda" if use_gpu else "cpu"}
    t0 = time.time()
    try:
        proc = subprocess.run([sys.executable, "-m", "service.sweep", str(config)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {**row, "result": "WRONG", "detail": f"no end within {timeout_s:.0f} s"}
    ok = proc.returncode == 0 and "1 trial, 0 failed" in proc.stdout
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    err = (proc.stderr.strip().splitlines() or [""])[-1]
    return {**row, "result": "ok" if ok else "WRONG", "ms": 1e3 * (time.time() - t0),
            "detail": "" if ok else f"exit {proc.returncode}: {err or last} (log: {work})"}


# --------------------------------------------------------------------------- main


def parse_sizes(values: list[str]) -> list[int]:
    out = []
    for v in values:
        s = v.strip().upper()
        mult = M if s.endswith("M") else 1024 if s.endswith("K") else 1
        try:
            n = int(float(s.rstrip("MK")) * mult)
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad size {v!r}: a number of floats, e.g. 4096, 64K or 16M") from None
        if n <= 0:
            raise argparse.ArgumentTypeError(f"bad size {v!r}: must be positive")
        out.append(n)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/gpu_check.sh", description=__doc__,
        epilog="Exit status: 0 every result right, 1 a wrong result (table row WRONG), 2 no CUDA device "
               "(without --dry-run) or bad arguments. Needs a CUDA build of torch 2.13.0.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true",
                        help="CPU tensors, gloo at W=1 and W=2, buckets of 4133 and 65541 floats, 1 M-float "
                             "kernel bucket, no sweep unless --sweep: checks the script itself in seconds")
    parser.add_argument("--sizes", nargs="+", metavar="FLOATS",
                        help="bucket sizes in floats for the hook checks (default 1M 4M 16M 64M; "
                             "dry run 4133 65541); K and M suffixes = 2^10, 2^20")
    parser.add_argument("--kernel-floats", metavar="FLOATS",
                        help="bucket of the kernel bandwidth check (default 64M; dry run 1M)")
    parser.add_argument("--sweep", action=argparse.BooleanOptionalAction, default=None,
                        help="run the one-trial sweep (default: yes on a GPU, no in --dry-run)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per group of checks (default 600)")
    parser.add_argument("--out", help="JSON path (default bench/results/gpu_check.json)")
    args = parser.parse_args(argv)
    try:
        sizes = parse_sizes(args.sizes) if args.sizes else list(DRY_SIZES if args.dry_run else GPU_SIZES)
        kernel_n = (parse_sizes([args.kernel_floats])[0] if args.kernel_floats
                    else DRY_KERNEL_FLOATS if args.dry_run else GPU_KERNEL_FLOATS)
    except argparse.ArgumentTypeError as exc:
        parser.exit(2, f"gpu_check: {exc}\n")

    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print(NEEDS_CUDA.format(version=torch.__version__), file=sys.stderr)
        return 2
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    load_before = load_average()
    device_kind = "cpu" if args.dry_run else "cuda"
    gpu = None if args.dry_run else torch.cuda.get_device_name(0)
    print(f"gpu check on {gpu or 'CPU (dry run)'}, torch {torch.__version__}, load average {load_before}", flush=True)

    rows: list[dict] = []
    started = time.time()
    for w, backend in ((1, "gloo" if args.dry_run else "nccl"), (2, "gloo")):
        t0 = time.time()
        rows += run_hook_checks(w, backend, device_kind, sizes, args.timeout)
        print(f"hooks at W={w} ({backend}): {time.time() - t0:.1f} s", flush=True)
    t0 = time.time()
    rows += check_kernels(device_kind, kernel_n)
    print(f"kernels: {time.time() - t0:.1f} s", flush=True)
    run_sweep = (not args.dry_run) if args.sweep is None else args.sweep
    if run_sweep:
        rows.append(check_sweep(use_gpu=not args.dry_run, timeout_s=args.timeout))
    else:
        rows.append({"check": "sweep", "case": "one trial", "result": "skipped",
                     "detail": "dry run: a Ray sweep costs 30 s+ and the test suite runs the CPU sweep; "
                               "--sweep runs it here with use_gpu: false" if args.dry_run else "--no-sweep"})

    wrong = [r for r in rows if r["result"] == "WRONG"]
    print()
    print(table(["check", "case", "W", "backend", "device", "floats", "result", "ms", "err/bound", "GB/s",
                 "% of copy", "detail"],
                [[r["check"], r["case"], r.get("world_size"), r.get("backend"), r.get("device"),
                  _size(r.get("floats")), r["result"], r.get("ms"), r.get("max_err_over_bound"), r.get("gb_per_s"),
                  r.get("pct_of_copy"), r.get("detail", "")] for r in rows]))
    print(f"\n{len(rows)} checks in {time.time() - started:.0f} s: {len(wrong)} wrong, "
          f"{sum(r['result'] == 'skipped' for r in rows)} skipped, {sum(r['result'] == 'slow' for r in rows)} "
          f"below the bandwidth target (err/bound: max |result - exact mean| over the hook's bound, <= 1 is right; "
          f"GB/s: input bytes per second)")
    path = write_json("gpu_check", {
        "settings": {"dry_run": args.dry_run, "sizes": sizes, "kernel_floats": kernel_n, "sweep": run_sweep,
                     "bandwidth_target": BANDWIDTH_TARGET},
        "machine": {**machine(), "gpu": gpu, "cuda": torch.version.cuda},
        "load_average_before": load_before, "load_average_after": load_average(),
        "rows": rows, "wrong": len(wrong)}, args.out)
    print(f"wrote {path}")
    return 1 if wrong else 0


def _size(n):
    if n is None:
        return None
    return f"{n // M}M" if n % M == 0 else str(n)


if __name__ == "__main__":
    sys.exit(main())
