"""Checks that run inside real gloo processes (spawned by tests/test_hooks_dist.py).

Every function here is ``check(rank, world_size, ...)`` and raises AssertionError on failure;
the pytest side only spawns them. Buckets are either real DDP buckets (DDP models) or a
:class:`Bucket` input container holding a chosen tensor, so exact inputs (zeros, constants,
NaN, huge values, layers of very different scales) reach the hooks through real collectives.
"""

import contextlib
import copy
import math

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import hooks

ALL_HOOKS = list(hooks.available())
QUANT_HOOKS = ("quantization_pertensor", "quantization_perchannel")
# Small chunks so test buckets span many chunks (and, for quantized_allreduce, many shards).
TEST_PARAMS = {"quantization_perchannel": {"chunk_size": 64}, "quantized_allreduce": {"chunk_size": 64}}


class Bucket:
    """What a hook reads from DDP's GradBucket, around a tensor we choose.

    ``shapes`` splits the buffer into per-parameter gradient views (PowerSGD compresses per matrix).
    """

    def __init__(self, tensor: torch.Tensor, index: int = 0, shapes=None):
        self._buffer = tensor
        self._index = index
        shapes = shapes or [tuple(tensor.shape)]
        self._params = [torch.zeros(s) for s in shapes]
        self._grads, off = [], 0
        for s in shapes:
            n = math.prod(s)
            self._grads.append(tensor[off : off + n].view(s))
            off += n
        assert off == tensor.numel()

    def buffer(self):
        return self._buffer

    def index(self):
        return self._index

    def is_last(self):
        return self._index == 0

    def parameters(self):
        return self._params

    def gradients(self):
        return self._grads


def layered(seed: int, sizes=(3000, 1537, 400, 100), scales=(1e-4, 1e-1, 1.0, 30.0)) -> torch.Tensor:
    """A gradient-like vector: consecutive 'layers' whose values have very different scales."""
    g = torch.Generator().manual_seed(seed)
    return torch.cat([torch.randn(n, generator=g) * s for n, s in zip(sizes, scales)])


def run_hook(name: str, tensor: torch.Tensor, process_group=None, shapes=None, index=0, **params):
    state, hook = hooks.build(name, process_group=process_group, **params)
    out = hook(state, Bucket(tensor, index=index, shapes=shapes)).wait()
    return state, out


def quant_bound(inputs: torch.Tensor, chunk: int | None) -> torch.Tensor:
    """Per-element error bound of the allgather quantizers: mean over ranks of half a step (+ rounding).

    Written plainly (a loop over chunks) as an independent reference for the vectorised kernel.
    """
    w, n = inputs.shape
    chunk = chunk or n
    bound = torch.zeros(n)
    for r in range(w):
        for start in range(0, n, chunk):
            part = inputs[r, start : start + chunk]
            step = (part.max() - part.min()) / 255
            amax = part.abs().max()
            bound[start : start + chunk] += 0.5 * step + 1e-6 * amax
    return bound / w


def qar_bound(inputs: torch.Tensor, chunk: int) -> torch.Tensor:
    """quantized_allreduce: phase-1 bound plus half a step of the reduced (mean) chunk."""
    w, n = inputs.shape
    first = quant_bound(inputs, chunk)
    mean = inputs.sum(0) / w
    second = torch.zeros(n)
    for start in range(0, n, chunk):
        part = mean[start : start + chunk]
        widened = part.max() - part.min() + 2 * first[start : start + chunk].max()
        second[start : start + chunk] = widened / 510 + 1e-6 * part.abs().max()
    return first + second


def expected_bytes(name: str, n: int, w: int, params: dict, shapes=None) -> tuple[float, float]:
    """(payload_bytes, wire_bytes) of one call on n float32s, from the formulas in docs/hooks.md."""
    ring = 2 * (w - 1) / w
    if name == "allreduce":
        return 4 * n, ring * 4 * n
    if name == "allgather_then_aggregate":
        return 4 * n, (w - 1) * 4 * n
    if name in ("fp16_compress", "bf16_compress"):
        return 2 * n, ring * 2 * n
    if name in QUANT_HOOKS:
        chunk = params.get("chunk_size") or n
        payload = n + 8 * math.ceil(n / chunk)
        return payload, (w - 1) * payload
    if name == "quantized_allreduce":  # all_to_all of W shards, allgather of one, padded to W*S chunks
        chunk = params["chunk_size"]
        shards = math.ceil(math.ceil(n / chunk) / w)
        shard = 8 * shards + shards * chunk
        return w * shard + shard, (w - 1) / w * w * shard + (w - 1) * shard
    if name == "powersgd":  # called past start_iter: uncompressed + P + Q, three ring allreduces
        elems = 0
        for s in shapes:
            rows, cols = s[0], math.prod(s) // s[0]
            r = min(rows, cols, params["rank"])
            elems += (rows + cols) * r if (rows + cols) * r * 2 < rows * cols else rows * cols
        return 4 * elems, ring * 4 * elems
    raise AssertionError(name)


# --------------------------------------------------------------------------- direct buckets
def check_buckets(rank: int, w: int) -> dict:
    """Accounting, error bounds, zero/constant buckets, odd lengths, NaN/inf, at world size w."""
    results = {}
    n = 5037  # not a multiple of 512 nor of 64
    inputs = torch.stack([layered(seed=10 + r) for r in range(w)])
    assert inputs.shape[1] == n
    exact_mean = inputs.sum(0) / w

    # --- accounting against the formulas, and every hook's result close to the exact mean
    shapes = [(48, 64), (64,), (20, 98)]  # n = 3072 + 64 + 1960 = 5096 for powersgd
    for name in ALL_HOOKS:
        params = TEST_PARAMS.get(name, {})
        if name == "powersgd":
            params = {"start_iter": 2}
            xs = torch.stack([layered(seed=10 + r, sizes=(5096,), scales=(1.0,)) for r in range(w)])
            state, hook = hooks.build(name, **params)
            for it in range(3):  # two plain allreduces, then one PowerSGD step
                hook(state, Bucket(xs[rank].clone(), shapes=shapes)).wait()
            s = state.stats()
            full = hooks.validate(name, **params)
            p3, w3 = expected_bytes(name, 5096, w, full, shapes)
            assert s["calls"] == 3 and s["raw_bytes"] == 3 * 4 * 5096
            assert s["allreduce_calls"] == 2 + 3, s
            assert s["payload_bytes"] == 2 * 4 * 5096 + p3, (s, p3)
            assert math.isclose(s["wire_bytes"], 2 * 2 * (w - 1) / w * 4 * 5096 + w3), s
            # the cost model, fed the compressed fraction, prices the same bytes
            assert math.isclose(hooks.cost.hook_wire_bytes(name, 5096, w, compressed_fraction=p3 / (4 * 5096)), w3, rel_tol=1e-9)
            continue
        state, out = run_hook(name, inputs[rank].clone(), **params)
        s = state.stats()
        payload, wire = expected_bytes(name, n, w, params)
        assert s["calls"] == 1 and s["raw_bytes"] == 4 * n, (name, s)
        assert s["payload_bytes"] == payload, (name, s["payload_bytes"], payload)
        assert math.isclose(s["wire_bytes"], wire, rel_tol=1e-12), (name, s["wire_bytes"], wire)
        assert s["seconds"] > 0 and s["nonfinite_inputs"] == 0, (name, s)
        assert math.isclose(hooks.cost.hook_wire_bytes(name, n, w, **params), s["wire_bytes"], rel_tol=1e-12), name
        if name == "quantized_allreduce":
            bound = qar_bound(inputs, params["chunk_size"])
            err = (out - exact_mean).abs()
            assert bool((err <= bound).all()), (name, float((err - bound).max()))
        elif name in QUANT_HOOKS:
            bound = quant_bound(inputs, params.get("chunk_size"))
            err = (out - exact_mean).abs()
            assert bool((err <= bound).all()), (name, float((err - bound).max()))
            results[f"{name}_max_err_over_bound"] = float((err / bound).max())
        elif name in ("allreduce", "allgather_then_aggregate"):
            rounding = 2e-7 * w * inputs.abs().sum(0) / w  # a sum of w float32s, in another order
            assert bool(((out - exact_mean).abs() <= rounding).all()), name
        else:
            unit = 2.0**-11 if name == "fp16_compress" else 2.0**-8
            bound = unit * (w + 1) * inputs.abs().sum(0) / w + w * 6e-8
            err = (out - exact_mean).abs()
            i = int((err - bound).argmax())
            assert bool((err <= bound).all()), (name, i, float(err[i]), float(bound[i]), inputs[:, i].tolist(), float(out[i]))
        state.reset_stats()
        assert state.stats()["calls"] == 0 and state.stats()["wire_bytes"] == 0

    # --- all-zero and constant buckets (min == max): exact mean, never NaN/inf
    for name in QUANT_HOOKS + ("quantized_allreduce",):
        for label, x in {
            "zeros": torch.zeros(n),
            "constant": torch.full((n,), 0.37 * (rank + 1)),
            "constant_chunks": torch.arange(n).div(64, rounding_mode="floor").float() * (rank + 1),
        }.items():
            xs = [torch.zeros(n)] * w if label == "zeros" else None
            _, out = run_hook(name, x.clone(), **TEST_PARAMS.get(name, {}))
            all_x = [torch.empty(n) for _ in range(w)]
            dist.all_gather(all_x, x)
            mean = torch.stack(xs or all_x).sum(0) / w
            assert bool(torch.isfinite(out).all()), (name, label)
            if label == "constant_chunks" and name == "quantization_pertensor":
                continue  # not constant per tensor: covered by the bound check above
            torch.testing.assert_close(out, mean, rtol=1e-6, atol=0, msg=f"{name} {label}")

    # --- world size 1 through a one-rank group: the result is the input, nothing on the wire
    solo = [dist.new_group([r]) for r in range(w)][rank]
    for name in ALL_HOOKS:
        if name == "powersgd":
            continue  # plain allreduce before start_iter, covered by allreduce
        params = TEST_PARAMS.get(name, {})
        state, out = run_hook(name, inputs[rank].clone(), process_group=solo, **params)
        assert state.stats()["wire_bytes"] == 0, name
        if name in ("allreduce", "allgather_then_aggregate"):
            assert torch.equal(out, inputs[rank]), name
        elif name in QUANT_HOOKS:
            bound = quant_bound(inputs[rank : rank + 1], params.get("chunk_size"))
            assert bool(((out - inputs[rank]).abs() <= bound).all()), name
        elif name == "quantized_allreduce":
            bound = qar_bound(inputs[rank : rank + 1], params["chunk_size"])
            assert bool(((out - inputs[rank]).abs() <= bound).all()), name

    # --- quantized_allreduce sends about a quarter of fp32 allreduce's bytes, at every world size
    if w > 1:
        big = layered(seed=rank, sizes=(100_000,), scales=(1.0,))
        qar, _ = run_hook("quantized_allreduce", big.clone())
        ref, _ = run_hook("allreduce", big.clone())
        ratio = qar.stats()["wire_bytes"] / ref.stats()["wire_bytes"]
        assert ratio <= 0.27, ratio
        results["quantized_allreduce_wire_ratio"] = ratio

    # --- NaN in one rank's input: counted on that rank only, popped once with the bucket's params
    for name in ALL_HOOKS:
        x = inputs[rank].clone()
        if rank == 0:
            x[17] = float("nan")
        state, hook = hooks.build(name)
        bucket = Bucket(x, index=3)
        hook(state, bucket).wait()
        expect = 1 if rank == 0 else 0
        assert state.stats()["nonfinite_inputs"] == expect, (name, state.stats())
        popped = state.pop_nonfinite_buckets()
        if rank == 0:
            assert len(popped) == 1 and popped[0].bucket_index == 3, popped
            assert popped[0].parameters[0] is bucket.parameters()[0]
        else:
            assert popped == []
        assert state.pop_nonfinite_buckets() == []
        assert state.stats()["nonfinite_inputs"] == expect  # cumulative after the pop

    # --- fp16 beyond float16's range (|g| > 65504) turns into inf, flagged in nothing (input finite)
    x = torch.full((64,), 1.0e5)
    state, out = run_hook("fp16_compress", x)
    assert bool(torch.isinf(out).all()) and state.stats()["nonfinite_inputs"] == 0
    _, out_bf16 = run_hook("bf16_compress", torch.full((64,), 1.0e5))
    assert bool(torch.isfinite(out_bf16).all())
    return results


def check_perchannel_beats_pertensor(rank: int, w: int) -> dict:
    """The seed's claim: on a ~6M-float bucket of layers with very different scales, per-channel
    (chunk 512) quantization error is far lower, per layer and relative, than per-tensor."""
    sizes = (2_000_000, 2_000_000, 1_500_000, 500_000)
    scales = (1e-3, 1e-2, 1e-1, 1.0)
    x = layered(seed=100 + rank, sizes=sizes, scales=scales)
    all_x = [torch.empty_like(x) for _ in range(w)]
    dist.all_gather(all_x, x)
    mean = torch.stack(all_x).sum(0) / w
    _, per_tensor = run_hook("quantization_pertensor", x.clone())
    _, per_channel = run_hook("quantization_perchannel", x.clone(), chunk_size=512)
    errors, start = [], 0
    for n in sizes:
        sl = slice(start, start + n)
        ref = mean[sl].norm()
        errors.append(((per_tensor[sl] - mean[sl]).norm() / ref, (per_channel[sl] - mean[sl]).norm() / ref))
        start += n
    for layer, (e_tensor, e_channel) in enumerate(errors):
        assert e_channel < 0.02, (layer, float(e_channel))
        if scales[layer] < max(scales):  # layers the largest one dwarfs: per-tensor loses them
            assert e_channel * 10 < e_tensor, (layer, float(e_tensor), float(e_channel))
        else:  # the largest layer sets the per-tensor range: per-channel is still no worse
            assert e_channel <= e_tensor, (layer, float(e_tensor), float(e_channel))
    return {"relative_errors": [(float(a), float(b)) for a, b in errors]}


# --------------------------------------------------------------------------- DDP models
def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 48), nn.Tanh(), nn.Linear(48, 48), nn.Tanh(), nn.Linear(48, 4))


def _batch(step: int, rank: int, per_rank: int = 8):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(per_rank, 16, generator=g), torch.randint(0, 4, (per_rank,), generator=g)


def check_bit_exact_vs_torch(rank: int, w: int) -> None:
    """allreduce == torch's allreduce_hook and fp16_compress == torch's fp16_compress_hook, bit for bit."""
    for ours, theirs in (("allreduce", default_hooks.allreduce_hook), ("fp16_compress", default_hooks.fp16_compress_hook)):
        grads = []
        for use_ours in (True, False):
            torch.manual_seed(0)
            model = DDP(_mlp(), bucket_cap_mb=0.004)
            if use_ours:
                model.register_comm_hook(*hooks.build(ours))
            else:
                model.register_comm_hook(None, theirs)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for step in range(4):
                x, y = _batch(step, rank)
                opt.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
            grads.append([p.grad.clone() for p in model.parameters()])
        for a, b in zip(*grads):
            assert torch.equal(a, b), ours


def _fresh_result(hook):
    """The other hook shape: the result is a new tensor and the bucket buffer is left scribbled on,
    so DDP must copy the future's value into the gradients."""

    def fresh_result_hook(state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        def detach_result(fut):
            result = fut.value().clone()
            bucket.buffer().fill_(float("nan"))
            return result

        return hook(state, bucket).then(detach_result)

    return fresh_result_hook


def _capturing(hook, seen: dict):
    """Record every bucket's input (before the hook) and the hook's result, by bucket index."""

    def capturing_hook(state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        entry = {"input": bucket.buffer().clone(), "params": bucket.parameters()}
        seen[bucket.index()] = entry

        def keep(fut):
            entry["output"] = fut.value().clone()
            return fut.value()

        return hook(state, bucket).then(keep)

    return capturing_hook


def _bound(name: str, inputs: torch.Tensor, params: dict, sync_index: int) -> torch.Tensor | None:
    """Allowed |DDP grad - exact mean| per element given every rank's bucket input; None = no bound."""
    w = inputs.shape[0]
    mean_abs = inputs.abs().sum(0) / w
    rounding = 1e-5 * mean_abs + 1e-7  # the local model sums the global batch in another order
    if name in ("allreduce", "allgather_then_aggregate") or (name == "powersgd" and sync_index < params["start_iter"]):
        return rounding
    if name == "fp16_compress":
        return 2.0**-11 * (w + 1) * mean_abs + w * 6e-8 + rounding
    if name == "bf16_compress":
        return 2.0**-8 * (w + 1) * mean_abs + rounding
    if name in QUANT_HOOKS:
        return quant_bound(inputs, params.get("chunk_size")) + rounding
    if name == "quantized_allreduce":
        return qar_bound(inputs, params["chunk_size"]) + rounding
    return None  # powersgd after start_iter: a low-rank approximation, no elementwise bound


def check_accumulation(rank: int, w: int, names=None, iterations: int = 8) -> dict:
    """The seed regression: gradient accumulation with no_sync() over alternating iterations.

    A DDP model and a local copy fed the whole global batch train side by side; after every
    synced iteration the DDP gradients must (a) be the hook's result (copied back into the
    gradients), (b) agree across ranks, and (c) match the local model's gradients exactly (exact
    hooks) or within the hook's bound. For every hook, gradient_as_bucket_view False/True and
    both hook shapes (result = bucket buffer, result = new tensor).
    """
    checked = most_buckets = 0
    for name in names or ALL_HOOKS:
        params = TEST_PARAMS.get(name, {})
        if name == "powersgd":
            params = {"start_iter": 2}
        for as_view in (False, True):
            for shape in ("bucket_buffer", "new_tensor"):
                torch.manual_seed(0)
                local = _mlp()
                ddp = DDP(copy.deepcopy(local), bucket_cap_mb=0.004, gradient_as_bucket_view=as_view)
                state, hook = hooks.build(name, **params)
                full = hooks.validate(name, **params)
                if shape == "new_tensor":
                    hook = _fresh_result(hook)
                seen: dict = {}
                ddp.register_comm_hook(state, _capturing(hook, seen))
                ddp_opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
                index_of = {id(p): i for i, p in enumerate(ddp.module.parameters())}
                sync_index = 0
                for it in range(iterations):
                    batches = [_batch(it, r) for r in range(w)]
                    x, y = batches[rank]
                    if it % 2 == 0:
                        with ddp.no_sync():
                            nn.functional.cross_entropy(ddp(x), y).backward()
                    else:
                        seen.clear()
                        nn.functional.cross_entropy(ddp(x), y).backward()
                    gx = torch.cat([b[0] for b in batches])
                    gy = torch.cat([b[1] for b in batches])
                    nn.functional.cross_entropy(local(gx), gy).backward()
                    if it % 2 == 0:
                        continue
                    ddp_params = list(ddp.module.parameters())
                    local_params = list(local.parameters())
                    for idx, entry in sorted(seen.items()):
                        ps = entry["params"]
                        ddp_grad = torch.cat([p.grad.reshape(-1) for p in ps])
                        local_grad = torch.cat([local_params[index_of[id(p)]].grad.reshape(-1) for p in ps])
                        tag = (name, as_view, shape, it, idx)
                        assert torch.equal(ddp_grad, entry["output"]), ("result not in the grads", tag)
                        assert bool(torch.isfinite(ddp_grad).all()), tag
                        others = [torch.empty_like(ddp_grad) for _ in range(w)]
                        dist.all_gather(others, ddp_grad)
                        assert all(torch.equal(o, ddp_grad) for o in others), ("ranks disagree", tag)
                        inputs = [torch.empty_like(entry["input"]) for _ in range(w)]
                        dist.all_gather(inputs, entry["input"])
                        inputs = torch.stack(inputs)
                        # the bucket inputs are the locally accumulated gradients: their mean is the global one
                        torch.testing.assert_close(inputs.sum(0) / w, local_grad, rtol=1e-5, atol=1e-6, msg=str(tag))
                        bound = _bound(name, inputs, full, sync_index)
                        if bound is not None:
                            err = (ddp_grad - local_grad).abs()
                            assert bool((err <= bound).all()), (tag, float((err - bound).max()))
                        checked += 1
                    most_buckets = max(most_buckets, len(seen))
                    ddp_opt.step()
                    ddp_opt.zero_grad()
                    with torch.no_grad():  # keep the local copy on the DDP weights (lossy hooks drift)
                        for lp, dp in zip(local_params, ddp_params):
                            lp.copy_(dp)
                    local.zero_grad()
                    sync_index += 1
                assert sync_index >= 4
    assert most_buckets >= 2, "the model should span several DDP buckets"
    return {"checked_buckets": checked}


# --------------------------------------------------------------------------- issue 8
LOSSY_WITH_FEEDBACK = ("fp16_compress", "bf16_compress", "quantization_pertensor", "quantization_perchannel", "quantized_allreduce")


def check_error_feedback(rank: int, w: int, steps: int = 30) -> dict:
    """The same gradient every step: without feedback a biased compressor's error adds up step
    after step; with feedback the accumulated error stays within about one step's error (for the
    quantizers; for the 16-bit casts only the cast error is fed back, see below)."""
    x = layered(seed=50 + rank)
    all_x = [torch.empty_like(x) for _ in range(w)]
    dist.all_gather(all_x, x)
    mean = torch.stack(all_x).sum(0) / w
    out = {}
    for name in LOSSY_WITH_FEEDBACK:
        accumulated, first = {}, {}
        for feedback in (False, True):
            state, hook = hooks.build(name, error_feedback=feedback, **TEST_PARAMS.get(name, {}))
            bucket = Bucket(x.clone())
            total = torch.zeros_like(x, dtype=torch.float64)
            for t in range(steps):
                bucket._buffer = x.clone()  # same parameters, fresh gradient: what DDP hands over
                result = hook(state, bucket).wait()
                total += (result - mean).double()
                if t == 0:
                    first[feedback] = float((result - mean).norm())
            accumulated[feedback] = float(total.norm())
        single = first[False]
        assert single > 0, name
        assert accumulated[False] >= steps / 2 * single, (name, accumulated, single)
        if name in ("fp16_compress", "bf16_compress"):
            # Feedback removes this rank's cast error; the rounding of the 16-bit sums inside the
            # allreduce is nobody's contribution and still adds up, so the drift only shrinks.
            assert accumulated[True] <= 0.7 * accumulated[False], (name, accumulated, single)
        else:
            assert accumulated[True] <= 3 * single, (name, accumulated, single)
        out[name] = {"single_step": single, "accumulated_without": accumulated[False], "accumulated_with": accumulated[True]}
    return out


def check_fidelity(rank: int, w: int) -> dict:
    """with_fidelity: exact hooks score 0 error / cosine 1; a lossy hook's sampled figures equal a
    direct comparison with the exact mean; every=N samples calls 0, N, 2N, ...; DDP accepts it."""
    x = layered(seed=70 + rank)
    all_x = [torch.empty_like(x) for _ in range(w)]
    dist.all_gather(all_x, x)
    mean = torch.stack(all_x).sum(0) / w

    state, hook = hooks.with_fidelity(*hooks.build("allreduce"), every=1)
    hook(state, Bucket(x.clone())).wait()
    s = state.stats()
    assert s["fidelity_samples"] == 1 and s["fidelity_rel_error"] < 1e-6 and s["fidelity_cosine"] > 1 - 1e-6, s

    state, hook = hooks.with_fidelity(*hooks.build("quantization_pertensor"), every=2)
    rels, coss = [], []
    for call in range(3):
        result = hook(state, Bucket(x.clone())).wait()
        if call % 2 == 0:
            rels.append(float((result - mean).norm() / mean.norm()))
            coss.append(float(torch.dot(result, mean) / (result.norm() * mean.norm())))
    s = state.stats()
    assert s["fidelity_samples"] == 2, s
    assert math.isclose(s["fidelity_rel_error"], sum(rels) / 2, rel_tol=1e-4), (s, rels)
    assert math.isclose(s["fidelity_cosine"], sum(coss) / 2, rel_tol=1e-6), (s, coss)
    assert 0 < s["fidelity_rel_error"] < 0.5
    # the reference allreduce is a diagnostic: not in the hook's own bytes
    payload, _ = expected_bytes("quantization_pertensor", x.numel(), w, {})
    assert s["payload_bytes"] == 3 * payload
    state.reset_stats()
    assert state.stats()["fidelity_samples"] == 0

    torch.manual_seed(0)
    model = DDP(_mlp(), bucket_cap_mb=0.004)
    state, hook = hooks.with_fidelity(*hooks.build("fp16_compress"), every=1)
    model.register_comm_hook(state, hook)
    for step in range(3):
        xb, yb = _batch(step, rank)
        nn.functional.cross_entropy(model(xb), yb).backward()
    s = state.stats()
    assert s["fidelity_samples"] == s["calls"] > 0 and s["fidelity_rel_error"] < 1e-2 and s["fidelity_cosine"] > 0.999, s
    return {"pertensor_rel_error": rels, "fp16_ddp": s["fidelity_rel_error"]}


def check_resume(rank: int, w: int) -> dict:
    """state_dict()/load_state_dict() resume exactly: a fresh state loaded from a checkpoint
    (through torch.save/torch.load(weights_only=True)) continues bit for bit like the original,
    on buckets (several, fixed layout) and under DDP (a one-parameter model, whose initial and
    rebuilt bucket layouts coincide); not loading it gives different results, so the state matters."""
    import io

    def roundtrip(d):
        buf = io.BytesIO()
        torch.save(d, buf)
        buf.seek(0)
        return torch.load(buf, weights_only=True)

    cases = [(n, {"error_feedback": True, **TEST_PARAMS.get(n, {})}) for n in LOSSY_WITH_FEEDBACK]
    cases.append(("powersgd", {"start_iter": 2}))
    shapes = [[(40, 30), (30,)], [(20, 50)], [(50,), (25, 40)]]
    for name, params in cases:
        # --- buckets: three buckets of fixed layout, 6 steps, checkpoint after 3
        def grads(step, idx):
            n = sum(math.prod(s) for s in shapes[idx])
            g = torch.Generator().manual_seed(1000 * step + 10 * idx + rank)
            return torch.randn(n, generator=g) * (idx + 1)

        state, hook = hooks.build(name, **params)
        buckets = [Bucket(grads(0, i), index=i, shapes=shapes[i]) for i in range(3)]

        def run(st, bks, step_range):
            outs = []
            for step in step_range:
                for i in reversed(range(3)):  # DDP calls bucket 0 last
                    b = bks[i]
                    b._buffer.copy_(grads(step, i))
                    outs.append(hook(st, b).wait().clone())
            return outs

        run(state, buckets, range(3))
        saved = roundtrip(state.state_dict())
        expected = run(state, buckets, range(3, 6))
        fresh, _ = hooks.build(name, **params)
        fresh.load_state_dict(saved)
        fresh_buckets = [Bucket(grads(0, i), index=i, shapes=shapes[i]) for i in range(3)]  # new parameter objects
        got = run(fresh, fresh_buckets, range(3, 6))
        assert all(torch.equal(a, b) for a, b in zip(expected, got)), ("bucket resume", name)
        control, _ = hooks.build(name, **params)
        unrestored = run(control, [Bucket(grads(0, i), index=i, shapes=shapes[i]) for i in range(3)], range(3, 6))
        assert not all(torch.equal(a, b) for a, b in zip(expected, unrestored)), ("state had no effect", name)

        # --- DDP: one bucket, 8 steps, checkpoint (model + hook state) after 4
        def make(model_state=None, hook_state=None):
            torch.manual_seed(0)
            # One parameter: a fresh DDP's initial bucket (parameter order) equals the rebuilt one
            # (gradient-ready order). With several, a resumed first step sees a permuted bucket that
            # chunked quantization rounds differently (per-parameter residuals still land right).
            module = nn.Sequential(nn.Linear(16, 200, bias=False))
            if model_state is not None:
                module.load_state_dict(model_state)
            ddp = DDP(module)
            st, hk = hooks.build(name, **params)
            if hook_state is not None:
                st.load_state_dict(hook_state)
            ddp.register_comm_hook(st, hk)
            return ddp, st, torch.optim.SGD(ddp.parameters(), lr=0.05)

        def train(ddp, opt, step_range):
            outs = []
            for step in step_range:
                xb, yb = _batch(step, rank)
                opt.zero_grad()
                nn.functional.cross_entropy(ddp(xb), yb).backward()
                outs.append([p.grad.clone() for p in ddp.parameters()])
                opt.step()
            return outs

        ddp, st, opt = make()
        train(ddp, opt, range(4))
        model_state = copy.deepcopy(ddp.module.state_dict())
        hook_state = roundtrip(st.state_dict())
        expected = train(ddp, opt, range(4, 8))
        ddp2, st2, opt2 = make(model_state, hook_state)
        got = train(ddp2, opt2, range(4, 8))
        for step, (a, b) in enumerate(zip(expected, got)):
            diff = max(float((x - y).abs().max()) for x, y in zip(a, b))
            assert diff == 0, ("DDP resume", name, "step", 4 + step, diff)
    return {}


# --------------------------------------------------------------------------- failed collectives
INJECTED = "injected collective failure"
_COLLECTIVES = ("all_reduce", "all_gather_single", "all_to_all_single")


class _FailingWork:
    """The real collective's work, whose completion fails: the bytes really travel (ranks stay
    in step, as when a peer's data arrives corrupt or a link drops mid-call), then the future
    carries an error, as gloo's and NCCL's do when a collective fails."""

    def __init__(self, work):
        def fail(fut):
            fut.wait()
            raise RuntimeError(INJECTED)

        self._fut = work.get_future().then(fail)

    def get_future(self):
        return self._fut

    def wait(self, timeout=None):
        self._fut.wait()
        return True

    def is_completed(self):
        return self._fut.done()


@contextlib.contextmanager
def failing_collectives():
    """Every async collective issued through torch.distributed (ours and torch's hooks) fails."""
    real = {name: getattr(dist, name) for name in _COLLECTIVES}

    def wrap(fn):
        def failing(*args, **kwargs):
            work = fn(*args, **kwargs)
            return _FailingWork(work) if kwargs.get("async_op") else work
        return failing

    for name, fn in real.items():
        setattr(dist, name, wrap(fn))
    try:
        yield
    finally:
        for name, fn in real.items():
            setattr(dist, name, fn)


@contextlib.contextmanager
def failing_hook_collectives():
    """Only the collectives a hook issues fail (hooks.build hands out hooks that run under
    failing_collectives): DDP's own broadcasts and the service's NaN agreement stay real."""
    real_build = hooks.build

    def build(*args, **kwargs):
        state, hook = real_build(*args, **kwargs)

        def failing_hook(st, bucket):
            with failing_collectives():
                return hook(st, bucket)

        return state, failing_hook

    hooks.build = build
    try:
        yield
    finally:
        hooks.build = real_build


def _expect_injected(fn, what) -> None:
    try:
        fn()
    except RuntimeError as exc:
        assert INJECTED in str(exc), (what, str(exc))
        return
    raise AssertionError(f"{what}: a failed collective was swallowed (the hook returned a result)")


def check_collective_failure_propagates(rank: int, w: int) -> dict:
    """Every registered hook re-raises a failed collective, on every rank, both for a bare call
    and inside DDP's backward (where the reducer reads the hook's future): none returns this
    rank's own bucket or uninitialised memory as the mean. PowerSGD in both of its phases."""
    checked = []
    cases = [(name, dict(TEST_PARAMS.get(name, {}))) for name in ALL_HOOKS]
    cases.append(("powersgd", {"start_iter": 2}))  # 2 exact calls first, then the compressing phase
    for name, params in cases:
        state, hook = hooks.build(name, **params)
        shapes = [(40, 30), (300,)]
        tensor = layered(rank, sizes=(1200, 300), scales=(1.0, 0.1))
        for call in range(params.get("start_iter", 0)):  # reach PowerSGD's compressing phase
            hook(state, Bucket(tensor.clone(), shapes=shapes)).wait()
        with failing_collectives():
            _expect_injected(lambda: hook(state, Bucket(tensor.clone(), shapes=shapes)).wait(), name)
        fid_state, fid_hook = hooks.with_fidelity(*hooks.build(name, **dict(TEST_PARAMS.get(name, {}))))
        with failing_collectives():
            _expect_injected(lambda: fid_hook(fid_state, Bucket(tensor.clone(), shapes=shapes)).wait(),
                             f"{name} with fidelity")
        torch.manual_seed(0)
        model = DDP(_mlp(), bucket_cap_mb=0.004)
        model.register_comm_hook(*hooks.build(name, **dict(TEST_PARAMS.get(name, {}))))
        x, y = _batch(0, rank)
        with failing_collectives():
            _expect_injected(lambda: nn.functional.cross_entropy(model(x), y).backward(), f"{name} in DDP")
        checked.append(name if not params.get("start_iter") else f"{name}(compressing)")
    return {"checked": checked}


def check_accumulation_quantized_allreduce(rank: int, w: int) -> dict:
    return check_accumulation(rank, w, names=["quantized_allreduce"])


def run_checks(rank: int, w: int, checks: list) -> dict:
    """Run several checks in one set of processes (spawning costs seconds on a small machine)."""
    import time

    out = {}
    for check in checks:
        t0 = time.perf_counter()
        out[check] = globals()[check](rank, w)
        out[f"{check}_seconds"] = time.perf_counter() - t0
    return out
