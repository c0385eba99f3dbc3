"""The state object every hook carries: byte accounting, timing, NaN/inf flags, error feedback.

A DDP comm hook is a plain function ``hook(state, bucket) -> Future[Tensor]`` (PyTorch's
ddp_comm_hooks shape). Everything a hook needs to remember between calls lives in its state,
an instance of :class:`HookState` (or a subclass). The hook calls, in order::

    t0 = state.begin(bucket)               # counts the call, raw bytes, flags NaN/inf (see nonfinite)
    x = state.add_residual(bucket, buf)    # error feedback, only if enabled
    state.account("allreduce", nbytes)     # once per collective, with the bytes handed to it
    return state.finish(fut, t0)           # records hook-entry -> future-completion seconds

Accounting follows the standard algorithm of each collective (see ``hooks.cost``):
ring allreduce sends 2(W-1)/W * n bytes per rank, ring allgather (W-1) * n, all_to_all (W-1)/W * n.
"""
from __future__ import annotations

import threading
import time
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from . import cost

# Collective kinds whose payload bytes and call counts are kept separately, so that the
# cost model (hooks.cost) can re-price a measured run on another network.
COLLECTIVES = ("allreduce", "allgather", "all_to_all")


class NonfiniteBucket(NamedTuple):
    """A bucket whose hook input held NaN or inf (since the last pop)."""

    bucket_index: int
    parameters: list  # list[torch.Tensor]: the model parameters whose gradients share the bucket


def nonfinite(tensors) -> torch.Tensor:
    """A 0-dim bool tensor: does any of ``tensors`` hold NaN or inf? Exact.

    On CPU, one sum per tensor first: a NaN/inf anywhere makes its sum non-finite, and a
    sum is one read (0.15 ms for 467 k float32 values, against 0.34 ms for a min/max per
    tensor, measured side by side). A non-finite sum can also be finite values that
    overflowed when added (values near 1e38), so only then the exact min/max pass decides;
    reading the sum's flag is free on CPU. On GPUs the min/max pass always runs: it needs
    no host sync there. (``torch._foreach_norm(ts, inf)`` answers the same but takes a slow
    path on CPU: 6.6 ms for those 467 k values.)
    """
    tensors = [t.detach() for t in tensors if t is not None and t.numel()]
    if not tensors:
        return torch.tensor(False)
    if tensors[0].device.type == "cpu":
        sums = torch.stack([t.sum(dtype=torch.float32) if t.dtype in _LOW_PRECISION else t.sum()
                            for t in tensors])
        if bool(sums.isfinite().all()):
            return torch.tensor(False)
    extremes = torch.stack([torch.stack(torch.aminmax(t)).float() for t in tensors])
    return extremes.isfinite().all().logical_not()


_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _param_layout(params: list) -> tuple:
    """A process-independent description of a bucket's layout: the parameter shapes in order."""
    return tuple(tuple(p.shape) for p in params)


class HookState:
    """State shared by all calls of one hook on one rank.

    Holds the process group, the cumulative statistics (:meth:`stats`), the per-bucket NaN/inf
    flags (:meth:`pop_nonfinite_buckets`) and, when ``error_feedback`` is on, the per-bucket
    residuals (what this rank meant to contribute minus what its compressed contribution carried).
    """

    def __init__(self, process_group: dist.ProcessGroup | None = None, error_feedback: bool = False):
        self.process_group = process_group
        self.error_feedback = bool(error_feedback)
        self._lock = threading.Lock()  # seconds are added from the collective's completion thread
        self.reset_stats()
        # bucket index -> 0-dim int64 tensor on the bucket's device: calls whose input was not finite.
        self._nonfinite_counts: dict[int, torch.Tensor] = {}
        self._bucket_params: dict[int, list] = {}
        self._nonfinite_popped = 0
        # error feedback: bucket index -> (parameters, flat residual); parameter ordinals (first-seen
        # order, stable across processes) key the residuals in checkpoints; restored residuals wait
        # in _restored (ordinal -> tensor) until their parameter's bucket arrives.
        self._residuals: dict[int, tuple[list, torch.Tensor]] = {}
        self._ordinals: dict[int, int] = {}
        self._orphan_key = 0  # negative keys hold residuals of a superseded layout until moved
        self._restored: dict[int, torch.Tensor] = {}
        self._fidelity: list | None = None  # [sum rel error, sum cosine, samples] once enabled

    # ---------------------------------------------------------------- group
    @property
    def group(self) -> dist.ProcessGroup:
        return self.process_group if self.process_group is not None else dist.group.WORLD

    def world_size(self) -> int:
        return dist.get_world_size(self.group)

    # ---------------------------------------------------------------- per call
    def begin(self, bucket) -> float:
        """Count the call and its raw bytes; flag a non-finite input without a host sync."""
        t0 = time.perf_counter()
        buf = bucket.buffer()
        idx = bucket.index()
        self._calls += 1
        self._raw_bytes += buf.numel() * buf.element_size()
        # One reduction over the bucket (exact, see nonfinite). The flag stays a tensor: on a
        # GPU it is read once, in pop_nonfinite_buckets()/stats(), not here.
        bad = nonfinite([buf])
        count = self._nonfinite_counts.get(idx)
        if count is None or count.device != buf.device:
            self._nonfinite_counts[idx] = bad.to(torch.int64)
        else:
            count.add_(bad)
        self._bucket_params[idx] = bucket.parameters()
        return t0

    def account(self, kind: str, nbytes: int) -> None:
        """Record one collective of ``kind`` that this rank hands ``nbytes`` bytes to."""
        w = self.world_size()
        self._payload_bytes += nbytes
        self._wire_bytes += cost.wire_bytes(kind, nbytes, w)
        self._per_kind[kind][0] += 1
        self._per_kind[kind][1] += nbytes

    def finish(self, fut: torch.futures.Future, t0: float) -> torch.futures.Future[torch.Tensor]:
        """Chain a step that records hook-entry -> completion seconds (no waiting here).

        A ``then`` step rather than a done-callback: the callback may run after ``wait()``
        returns, the ``then`` step always runs before the returned future completes.
        """

        def record_seconds(done: torch.futures.Future) -> torch.Tensor:
            elapsed = time.perf_counter() - t0
            with self._lock:
                self._seconds += elapsed
            return done.value()

        return fut.then(record_seconds)

    # ---------------------------------------------------------------- statistics
    def stats(self) -> dict[str, float]:
        """Cumulative statistics since build or the last :meth:`reset_stats`.

        calls, raw_bytes (uncompressed bucket bytes), payload_bytes (bytes handed to collectives,
        scales included), wire_bytes (bytes this rank sends under each collective's standard
        algorithm), seconds (hook entry to future completion, summed), nonfinite_inputs (calls
        whose input held NaN/inf, pending flags included), and per collective kind
        ``{kind}_calls`` / ``{kind}_bytes``. One host sync (to read the pending NaN flags).
        """
        with self._lock:
            seconds = self._seconds
        out: dict[str, float] = {
            "calls": self._calls,
            "raw_bytes": self._raw_bytes,
            "payload_bytes": self._payload_bytes,
            "wire_bytes": self._wire_bytes,
            "seconds": seconds,
            "nonfinite_inputs": self._nonfinite_popped - self._nonfinite_at_reset + self._pending_nonfinite(),
        }
        for kind in COLLECTIVES:
            out[f"{kind}_calls"] = self._per_kind[kind][0]
            out[f"{kind}_bytes"] = self._per_kind[kind][1]
        if self._fidelity is not None:
            rel_sum, cos_sum, samples = self._fidelity
            out["fidelity_samples"] = samples
            out["fidelity_rel_error"] = float(rel_sum) / samples if samples else float("nan")
            out["fidelity_cosine"] = float(cos_sum) / samples if samples else float("nan")
        return out

    # ---------------------------------------------------------------- fidelity (hooks.with_fidelity)
    def enable_fidelity(self) -> None:
        if self._fidelity is None:
            self._fidelity = [0.0, 0.0, 0]

    def record_fidelity(self, rel_error: torch.Tensor, cosine: torch.Tensor) -> None:
        """Add one sampled bucket's relative error and cosine (device tensors: no sync here)."""
        with self._lock:
            rel_sum, cos_sum, samples = self._fidelity
            self._fidelity = [rel_error.detach() + rel_sum, cosine.detach() + cos_sum, samples + 1]

    def reset_stats(self) -> None:
        self._calls = 0
        self._raw_bytes = 0
        self._payload_bytes = 0
        self._wire_bytes = 0.0
        with self._lock:
            self._seconds = 0.0
        self._per_kind = {kind: [0, 0] for kind in COLLECTIVES}
        if getattr(self, "_fidelity", None) is not None:
            self._fidelity = [0.0, 0.0, 0]
        # nonfinite_inputs restarts from zero too: remember what had been counted so far.
        popped = getattr(self, "_nonfinite_popped", 0)
        pending = self._pending_nonfinite() if hasattr(self, "_nonfinite_counts") else 0
        self._nonfinite_at_reset = popped + pending

    def _pending_nonfinite(self) -> int:
        if not self._nonfinite_counts:
            return 0
        return int(_gather_counts(list(self._nonfinite_counts.values())).sum())

    # ---------------------------------------------------------------- NaN provenance
    def pop_nonfinite_buckets(self) -> list[NonfiniteBucket]:
        """Buckets whose hook input held NaN/inf since the last pop (one host sync)."""
        if not self._nonfinite_counts:
            return []
        indices = list(self._nonfinite_counts)
        counts = _gather_counts([self._nonfinite_counts[i] for i in indices]).tolist()
        found = []
        for idx, n in zip(indices, counts):
            if n:
                self._nonfinite_popped += n
                self._nonfinite_counts[idx].zero_()
                found.append(NonfiniteBucket(idx, list(self._bucket_params.get(idx, []))))
        return found

    # ---------------------------------------------------------------- error feedback
    def add_residual(self, bucket, x: torch.Tensor) -> torch.Tensor:
        """Add this bucket's residual from the previous step into ``x`` (in place); return ``x``.

        Residuals are kept per bucket (one add per call). DDP rebuilds its buckets after the first
        iteration (new parameter order and sizes): a residual whose bucket layout changed is moved
        parameter by parameter. Checkpoints key residuals by each parameter's ordinal, the order
        in which this state first saw it; a fresh DDP over the same model presents its initial
        buckets in the same order, so a restored residual lands on the same parameter.
        """
        if not self.error_feedback:
            return x
        idx = bucket.index()
        params = bucket.parameters()
        entry = self._residuals.get(idx)
        if entry is not None and _same_params(entry[0], params):
            x.add_(entry[1].to(x.dtype))
            return x
        ordinals = [self._ordinals.setdefault(id(p), len(self._ordinals)) for p in params]
        if self._residuals:
            self._redistribute(x, params)
            left = self._residuals.pop(idx, None)
            if left is not None:  # an old layout's leftovers under this index: keep them for later buckets
                self._orphan_key -= 1
                self._residuals[self._orphan_key] = left
        if self._restored:
            off = 0
            for p, o in zip(params, ordinals):
                r = self._restored.pop(o, None)
                if r is not None and r.numel() == p.numel():
                    x[off : off + p.numel()].add_(r.to(device=x.device, dtype=x.dtype).view(-1))
                off += p.numel()
        return x

    def _redistribute(self, x: torch.Tensor, params: list) -> None:
        """Move residual slices of parameters in this bucket from older bucket layouts into ``x``."""
        wanted, off = {}, 0
        for p in params:
            wanted[id(p)] = off
            off += p.numel()
        for old_idx in list(self._residuals):
            old_params, old_res = self._residuals[old_idx]
            keep, parts, o = [], [], 0
            for p in old_params:
                if id(p) in wanted:
                    start = wanted[id(p)]
                    x[start : start + p.numel()].add_(old_res[o : o + p.numel()].to(x.dtype))
                else:
                    keep.append(p)
                    parts.append(old_res[o : o + p.numel()])
                o += p.numel()
            if len(keep) == len(old_params):
                continue
            if keep:  # the moved slices now belong to this bucket's residual
                self._residuals[old_idx] = (keep, torch.cat(parts))
            else:
                del self._residuals[old_idx]

    def store_residual(self, bucket, residual: torch.Tensor) -> None:
        """Remember ``residual`` (input minus what the compressed contribution carried)."""
        self._residuals[bucket.index()] = (bucket.parameters(), residual)

    def _residuals_by_ordinal(self) -> dict[int, torch.Tensor]:
        out = {}
        for params, res in self._residuals.values():
            o = 0
            for p in params:
                out[self._ordinals[id(p)]] = res[o : o + p.numel()].detach().cpu().clone()
                o += p.numel()
        for ordinal, res in self._restored.items():
            out.setdefault(ordinal, res.clone())
        return out

    # ---------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume exactly: plain dicts of CPU tensors and numbers (picklable)."""
        residuals = self._residuals_by_ordinal()
        with self._lock:
            seconds = self._seconds
        return {
            "residuals": residuals,
            "stats": {
                "calls": self._calls,
                "raw_bytes": self._raw_bytes,
                "payload_bytes": self._payload_bytes,
                "wire_bytes": self._wire_bytes,
                "seconds": seconds,
                "per_kind": {k: list(v) for k, v in self._per_kind.items()},
                "nonfinite_popped": self._nonfinite_popped + self._pending_nonfinite(),
                "nonfinite_at_reset": self._nonfinite_at_reset,
            },
        }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self._residuals = {}
        self._restored = {int(o): t.clone() for o, t in d.get("residuals", {}).items()}
        s = d.get("stats")
        if s:
            self._calls = s["calls"]
            self._raw_bytes = s["raw_bytes"]
            self._payload_bytes = s["payload_bytes"]
            self._wire_bytes = s["wire_bytes"]
            with self._lock:
                self._seconds = s["seconds"]
            self._per_kind = {k: list(v) for k, v in s["per_kind"].items()}
            self._nonfinite_counts = {}
            self._nonfinite_popped = s["nonfinite_popped"]
            self._nonfinite_at_reset = s["nonfinite_at_reset"]


class SeededState(HookState):
    """A hook state that counts its random draws (``draws``): the count seeds the next draw, and
    checkpoints keep it, so a resumed run draws what the uninterrupted one would have."""

    def __init__(self, process_group: dist.ProcessGroup | None = None, error_feedback: bool = False):
        super().__init__(process_group, error_feedback)
        self.draws = 0

    def state_dict(self) -> dict[str, Any]:
        d = super().state_dict()
        d["draws"] = self.draws
        return d

    def load_state_dict(self, d: dict[str, Any]) -> None:
        super().load_state_dict(d)
        self.draws = int(d.get("draws", 0))


def allgather_message(state: HookState, message: torch.Tensor) -> tuple[torch.Tensor, torch.futures.Future]:
    """Issue the allgather of this rank's uint8 ``message`` (accounted): ``(gathered, future)``,
    gathered flat (gloo wants a 1-D output), row r = rank r's message once the future is done."""
    gathered = message.new_empty((state.world_size() * message.numel(),))
    state.account("allgather", message.numel())
    return gathered, dist.all_gather_single(gathered, message, group=state.group, async_op=True).get_future()


def float32_out(buf: torch.Tensor) -> torch.Tensor:
    """Where to sum a decoded mean: the bucket itself when it is contiguous float32 (no
    temporary), else a float32 scratch to copy back."""
    if buf.dtype == torch.float32 and buf.is_contiguous():
        return buf
    return torch.empty(buf.numel(), dtype=torch.float32, device=buf.device)


def into_bucket(buf: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """The bucket holding the mean summed in ``total`` (from :func:`float32_out`)."""
    return total if total is buf else buf.copy_(total.view_as(buf))


def leading_floats(rows: torch.Tensor, count: int) -> torch.Tensor:
    """The first ``count`` float32 values of each uint8 row of a gathered message, (W, count):
    copied out, since row r's bytes start at r * row length, not always 4-byte aligned."""
    return rows.new_empty((rows.shape[0], 4 * count)).copy_(rows[:, : 4 * count]).view(torch.float32)


def _gather_counts(counts: list) -> torch.Tensor:
    """Per-bucket counters -> one CPU tensor with a single device-to-host transfer per device."""
    devices = {c.device for c in counts}
    if len(devices) == 1:
        return torch.stack(counts).cpu()
    return torch.stack([c.cpu() for c in counts])  # buckets on several devices: rare


def _same_params(a: list, b: list) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))
