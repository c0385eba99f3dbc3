"""The state object every hook carries, made of three parts: accounting, non-finite input flags,
error-feedback residuals.

A DDP comm hook is a plain function ``hook(state, bucket) -> Future[Tensor]`` (PyTorch's
ddp_comm_hooks shape). Everything a hook needs to remember between calls lives in its state,
an instance of :class:`HookState` (or a subclass). The hook calls, in order::

    t0 = state.begin(bucket)               # counts the call and raw bytes, flags NaN/inf in the input
    x = state.add_residual(bucket, buf)    # error feedback, only if enabled
    state.account("allreduce", nbytes)     # once per collective, with the bytes handed to it
    return state.finish(fut, t0, done)     # runs done(fut) on completion, records hook-entry -> completion seconds

A hook whose own work already tells whether its input was finite (allreduce's divide, the
quantizers' per-chunk min/max) calls ``state.begin(bucket, check_input=False)`` and hands that
answer to ``state.flag_input(bucket, bad)`` instead of paying a second read of the bucket.

The parts, each usable and tested through HookState's methods:

* :class:`Accounting`: calls, raw/payload/wire bytes, seconds, per-collective counts, sampled
  fidelity; ``stats()``;
* :class:`NonfiniteFlags`: per bucket, how many calls saw a NaN/inf input; ``pop()`` reads them
  with one host sync;
* :class:`Residuals`: error feedback's per-bucket residuals, moved across DDP's bucket rebuild
  and keyed by parameter ordinal in checkpoints.

Accounting follows the standard algorithm of each collective (``hooks.wire``):
ring allreduce sends 2(W-1)/W * n bytes per rank, ring allgather (W-1) * n, all_to_all (W-1)/W * n.
The helpers hooks are written with (``start_call``, ``allgather_message``, ...) are in hooks/_helpers.py.
"""
from __future__ import annotations

import threading
import time
from typing import Any, NamedTuple, Optional, Union

import torch
import torch.distributed as dist

from .finite import nonfinite
from .wire import ALL_KINDS, wire_bytes


class NonfiniteBucket(NamedTuple):
    """A bucket whose hook input held NaN or inf (since the last pop)."""

    bucket_index: int
    parameters: list  # list[torch.Tensor]: the model parameters whose gradients share the bucket


class Accounting:
    """Cumulative statistics of one hook on one rank: calls, bytes, seconds, sampled fidelity."""

    def __init__(self):
        self._lock = threading.Lock()  # seconds and fidelity are added from the collective's completion thread
        self._fidelity: Optional[list] = None  # [sum rel error, sum cosine, samples] once enabled
        self.reset()

    def reset(self) -> None:
        self.calls = 0
        self.raw_bytes = 0
        self.payload_bytes = 0
        self.wire_bytes = 0.0
        with self._lock:
            self._seconds = 0.0
            if self._fidelity is not None:
                self._fidelity = [0.0, 0.0, 0]
        self.per_kind = {kind: [0, 0] for kind in ALL_KINDS}

    def call(self, raw_bytes: int) -> None:
        self.calls += 1
        self.raw_bytes += raw_bytes

    def collective(self, kind: str, nbytes: int, world_size: int) -> None:
        self.payload_bytes += nbytes
        self.wire_bytes += wire_bytes(kind, nbytes, world_size)
        self.per_kind[kind][0] += 1
        self.per_kind[kind][1] += nbytes

    def add_seconds(self, seconds: float) -> None:
        with self._lock:
            self._seconds += seconds

    def enable_fidelity(self) -> None:
        with self._lock:
            if self._fidelity is None:
                self._fidelity = [0.0, 0.0, 0]

    def record_fidelity(self, rel_error: torch.Tensor, cosine: torch.Tensor) -> None:
        with self._lock:
            rel_sum, cos_sum, samples = self._fidelity
            self._fidelity = [rel_error.detach() + rel_sum, cosine.detach() + cos_sum, samples + 1]

    def stats(self) -> dict[str, float]:
        with self._lock:
            seconds, fidelity = self._seconds, self._fidelity
        out: dict[str, float] = {
            "calls": self.calls,
            "raw_bytes": self.raw_bytes,
            "payload_bytes": self.payload_bytes,
            "wire_bytes": self.wire_bytes,
            "seconds": seconds,
        }
        for kind in ALL_KINDS:
            out[f"{kind}_calls"] = self.per_kind[kind][0]
            out[f"{kind}_bytes"] = self.per_kind[kind][1]
        if fidelity is not None:
            rel_sum, cos_sum, samples = fidelity
            out["fidelity_samples"] = samples
            out["fidelity_rel_error"] = float(rel_sum) / samples if samples else float("nan")
            out["fidelity_cosine"] = float(cos_sum) / samples if samples else float("nan")
        return out

    def state_dict(self) -> dict[str, Any]:
        with self._lock:
            seconds = self._seconds
        return {"calls": self.calls, "raw_bytes": self.raw_bytes, "payload_bytes": self.payload_bytes,
                "wire_bytes": self.wire_bytes, "seconds": seconds,
                "per_kind": {k: list(v) for k, v in self.per_kind.items()}}

    def load_state_dict(self, s: dict[str, Any]) -> None:
        self.calls = s["calls"]
        self.raw_bytes = s["raw_bytes"]
        self.payload_bytes = s["payload_bytes"]
        self.wire_bytes = s["wire_bytes"]
        with self._lock:
            self._seconds = s["seconds"]
        # a checkpoint from before FSDP's kinds existed lacks them: they start at zero
        self.per_kind = {kind: [0, 0] for kind in ALL_KINDS} | {k: list(v) for k, v in s["per_kind"].items()}


class NonfiniteFlags:
    """Per bucket index, the number of calls whose input held NaN/inf, not yet popped.

    A count is a Python int when the flag came as one (CPU: reading a flag costs nothing), else
    a 0-dim int64 tensor on the bucket's device, read only in :meth:`pop` / :meth:`pending`
    (on a GPU the hook never waits for it). One entry per bucket index, whatever the step count.
    """

    def __init__(self):
        self.counts: dict[int, Union[int, torch.Tensor]] = {}
        self.parameters: dict[int, list] = {}  # bucket index -> its parameters at the last call
        self.popped = 0
        self.at_reset = 0  # popped + pending at the last reset_stats (nonfinite_inputs counts from there)

    def record(self, index: int, parameters: list, bad: Union[bool, torch.Tensor]) -> None:
        self.parameters[index] = parameters
        if isinstance(bad, torch.Tensor) and bad.device.type == "cpu":
            bad = bool(bad)
        count = self.counts.get(index, 0)
        if isinstance(bad, bool):
            if isinstance(count, torch.Tensor):
                count.add_(int(bad))
            else:
                self.counts[index] = count + bad
        elif isinstance(count, torch.Tensor) and count.device == bad.device:
            count.add_(bad)
        else:
            self.counts[index] = bad.to(torch.int64) + (count if isinstance(count, int) else count.to(bad.device))

    def _read(self, indices: list[int]) -> list[int]:
        tensors = [i for i in indices if isinstance(self.counts[i], torch.Tensor)]
        read = dict(zip(tensors, _gather_counts([self.counts[i] for i in tensors]).tolist())) if tensors else {}
        return [read[i] if i in read else self.counts[i] for i in indices]

    def pending(self) -> int:
        return sum(self._read(list(self.counts)))

    def since_reset(self) -> int:
        return self.popped - self.at_reset + self.pending()

    def reset(self) -> None:
        self.at_reset = self.popped + self.pending()

    def pop(self) -> list[NonfiniteBucket]:
        indices = list(self.counts)
        found = []
        for idx, n in zip(indices, self._read(indices)):
            if n:
                self.popped += n
                self.counts[idx] = 0
                found.append(NonfiniteBucket(idx, list(self.parameters.get(idx, []))))
        return found

    def state_dict(self) -> dict[str, int]:
        return {"nonfinite_popped": self.popped + self.pending(), "nonfinite_at_reset": self.at_reset}

    def load_state_dict(self, s: dict[str, Any]) -> None:
        self.counts = {}
        self.popped = s["nonfinite_popped"]
        self.at_reset = s["nonfinite_at_reset"]


class Residuals:
    """Error feedback: per bucket index, (parameters, flat residual) of the last call.

    Parameter ordinals (the order in which this state first saw each parameter, stable across
    processes) key the residuals in checkpoints; restored residuals wait in ``restored``
    (ordinal -> tensor) until their parameter's bucket arrives.
    """

    def __init__(self):
        self.by_bucket: dict[int, tuple[list, torch.Tensor]] = {}
        self.ordinals: dict[int, int] = {}  # id(parameter) -> ordinal
        self._orphan_key = 0  # negative keys hold residuals of a superseded layout until moved
        self.restored: dict[int, torch.Tensor] = {}

    def add(self, bucket, x: torch.Tensor) -> torch.Tensor:
        """Add this bucket's residual from the previous step into ``x`` (in place); return ``x``.

        Residuals are kept per bucket (one add per call). DDP rebuilds its buckets after the first
        iteration (new parameter order and sizes): a residual whose bucket layout changed is moved
        parameter by parameter. Checkpoints key residuals by each parameter's ordinal, the order
        in which this state first saw it; a fresh DDP over the same model presents its initial
        buckets in the same order, so a restored residual lands on the same parameter.
        """
        idx = bucket.index()
        params = bucket.parameters()
        entry = self.by_bucket.get(idx)
        if entry is not None and _same_params(entry[0], params):
            x.add_(entry[1].to(x.dtype))
            return x
        ordinals = [self.ordinals.setdefault(id(p), len(self.ordinals)) for p in params]
        if self.by_bucket:
            self._redistribute(x, params)
            left = self.by_bucket.pop(idx, None)
            if left is not None:  # an old layout's leftovers under this index: keep them for later buckets
                self._orphan_key -= 1
                self.by_bucket[self._orphan_key] = left
        if self.restored:
            off = 0
            for p, o in zip(params, ordinals):
                r = self.restored.pop(o, None)
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
        for old_idx in list(self.by_bucket):
            old_params, old_res = self.by_bucket[old_idx]
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
                self.by_bucket[old_idx] = (keep, torch.cat(parts))
            else:
                del self.by_bucket[old_idx]

    def store(self, bucket, residual: torch.Tensor) -> None:
        self.by_bucket[bucket.index()] = (bucket.parameters(), residual)

    def by_ordinal(self) -> dict[int, torch.Tensor]:
        """Every residual as CPU tensors keyed by parameter ordinal (the checkpoint's form)."""
        out = {}
        for params, res in self.by_bucket.values():
            o = 0
            for p in params:
                out[self.ordinals[id(p)]] = res[o : o + p.numel()].detach().cpu().clone()
                o += p.numel()
        for ordinal, res in self.restored.items():
            out.setdefault(ordinal, res.clone())
        return out

    def load(self, by_ordinal: dict) -> None:
        self.by_bucket = {}
        self.restored = {int(o): t.clone() for o, t in by_ordinal.items()}


class HookState:
    """State shared by all calls of one hook on one rank: the process group and three parts,
    ``accounting`` (:meth:`stats`), ``flags`` (:meth:`pop_nonfinite_buckets`) and, when
    ``error_feedback`` is on, ``residuals`` (what this rank meant to contribute minus what its
    compressed contribution carried). ``sampling``: None, or on a sampled step the recorder
    (hooks/step_sampling.py) that ``begin``, ``account`` and ``finish`` stamp each call into.
    """

    def __init__(self, process_group: dist.ProcessGroup | None = None, error_feedback: bool = False):
        self.process_group = process_group
        self.error_feedback = bool(error_feedback)
        self.accounting = Accounting()
        self.flags = NonfiniteFlags()
        self.residuals = Residuals()
        # On a sampled step, a hooks.step_sampling.StepRecorder: each call's timestamps (no syncs)
        self.sampling = None

    # ---------------------------------------------------------------- group
    @property
    def group(self) -> dist.ProcessGroup:
        return self.process_group if self.process_group is not None else dist.group.WORLD

    def world_size(self) -> int:
        return dist.get_world_size(self.group)

    # ---------------------------------------------------------------- per call
    def begin(self, bucket, check_input: bool = True, kind: str = "") -> float:
        """Count the call and its raw bytes; flag a non-finite input without a host sync.

        ``check_input=False``: the hook flags its input itself with :meth:`flag_input`, from
        work it does anyway (it must, on every call). ``kind``: the call's collective kind on a
        sampled step's stamp (hooks/wire.py; "" for a DDP bucket's)."""
        t0 = time.perf_counter()
        buf = bucket.buffer()
        self.accounting.call(buf.numel() * buf.element_size())
        if self.sampling is not None:
            self.sampling.called(buf, t0, kind)
        if check_input:
            # One exact read of the bucket (hooks.finite.nonfinite). On a GPU the flag stays a
            # tensor, read once in pop_nonfinite_buckets()/stats(), not here.
            self.flag_input(bucket, nonfinite([buf]))
        return t0

    def flag_input(self, bucket, bad: Union[bool, torch.Tensor]) -> None:
        """Record whether this call's input held NaN/inf (a bool, or a 0-dim bool tensor)."""
        self.flags.record(bucket.index(), bucket.parameters(), bad)

    def bucket_parameters(self, index: int) -> list:
        """The parameters of bucket ``index`` at its last call (empty before any)."""
        return self.flags.parameters.get(index, [])

    def account(self, kind: str, nbytes: int) -> None:
        """Record one collective of ``kind`` that this rank hands ``nbytes`` bytes to."""
        self.accounting.collective(kind, nbytes, self.world_size())
        if self.sampling is not None:  # every hook accounts each collective just before launching it
            self.sampling.launched()

    def finish(self, fut: torch.futures.Future, t0: float, then=None) -> torch.futures.Future[torch.Tensor]:
        """Chain one step that runs ``then(fut)`` (the hook's completion work; default: the
        future's value) and records hook-entry -> completion seconds (no waiting here).

        A ``then`` step rather than a done-callback: the callback may run after ``wait()``
        returns, the ``then`` step always runs before the returned future completes. One step
        for both, not two: each step is a future and a trip through the GIL per bucket.
        """

        sampled = self.sampling.returned() if self.sampling is not None else None

        def complete(done: torch.futures.Future) -> torch.Tensor:
            if sampled is not None:
                sampled.completed = time.perf_counter()
            result = done.value() if then is None else then(done)
            now = time.perf_counter()
            self.accounting.add_seconds(now - t0)
            if sampled is not None:
                sampled.decoded = now
            return result

        return fut.then(complete)

    # ---------------------------------------------------------------- statistics
    def stats(self) -> dict[str, float]:
        """Cumulative statistics since build or the last :meth:`reset_stats`.

        calls, raw_bytes (uncompressed bucket bytes), payload_bytes (bytes handed to collectives,
        scales included), wire_bytes (bytes this rank sends under each collective's standard
        algorithm), seconds (hook entry to future completion, summed), nonfinite_inputs (calls
        whose input held NaN/inf, pending flags included), and per collective kind
        ``{kind}_calls`` / ``{kind}_bytes``. One host sync (to read the pending NaN flags).
        """
        out = self.accounting.stats()
        out["nonfinite_inputs"] = self.flags.since_reset()
        return out

    def reset_stats(self) -> None:
        self.accounting.reset()
        self.flags.reset()  # nonfinite_inputs restarts from zero too

    def enable_fidelity(self) -> None:
        self.accounting.enable_fidelity()

    def record_fidelity(self, rel_error: torch.Tensor, cosine: torch.Tensor) -> None:
        """Add one sampled bucket's relative error and cosine (device tensors: no sync here)."""
        self.accounting.record_fidelity(rel_error, cosine)

    # ---------------------------------------------------------------- NaN provenance
    def pop_nonfinite_buckets(self) -> list[NonfiniteBucket]:
        """Buckets whose hook input held NaN/inf since the last pop (one host sync)."""
        return self.flags.pop()

    # ---------------------------------------------------------------- error feedback
    def add_residual(self, bucket, x: torch.Tensor) -> torch.Tensor:
        """With error feedback, add this bucket's residual from the previous step into ``x`` (in
        place; see :meth:`Residuals.add`); return ``x``."""
        return self.residuals.add(bucket, x) if self.error_feedback else x

    def store_residual(self, bucket, residual: torch.Tensor) -> None:
        """Remember ``residual`` (input minus what the compressed contribution carried)."""
        self.residuals.store(bucket, residual)

    # ---------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume exactly: plain dicts of CPU tensors and numbers (picklable)."""
        return {"residuals": self.residuals.by_ordinal(),
                "stats": {**self.accounting.state_dict(), **self.flags.state_dict()}}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.residuals.load(d.get("residuals", {}))
        s = d.get("stats")
        if s:
            self.accounting.load_state_dict(s)
            self.flags.load_state_dict(s)


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


def _gather_counts(counts: list) -> torch.Tensor:
    """Per-bucket counters -> one CPU tensor with a single device-to-host transfer per device."""
    devices = {c.device for c in counts}
    if len(devices) == 1:
        return torch.stack(counts).cpu()
    return torch.stack([c.cpu() for c in counts])  # buckets on several devices: rare


def _same_params(a: list, b: list) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))
