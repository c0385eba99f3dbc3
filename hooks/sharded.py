"""The hooks' sharded forms: FSDP2's gradient reduce-scatter and parameter all-gather, compressed.

FSDP2 (``torch.distributed.fsdp.fully_shard``) reduce-scatters each sharded module's gradients
once per backward and all-gathers its parameters before each forward and backward; torch 2.13
lets both be replaced per module (``set_custom_reduce_scatter``, ``set_custom_all_gather``, the
``ReduceScatter`` / ``AllGather`` interfaces, hooks/fsdp_comms.py). A hook's sharded form (``HookSpec.sharded``) is a
plain function like a DDP hook, ``reduce_scatter(state, shard, output)``:

* ``shard`` (:class:`GradShard`): what FSDP hands over, the module's unsharded gradients laid
  out as W rows (row r = rank r's shard of every parameter, padded), plus the module's index and
  parameters, so HookState's per-call methods (count, NaN flag) read it as they read a bucket;
* ``output``: this rank's shard of the mean, float32, written in place.

The forms: ``fp32_reduce_scatter`` (FSDP's own collective, accounted: allreduce's form),
``cast_reduce_scatter`` (fp16/bf16: divide by W, reduce-scatter in 16 bits, as the DDP hooks
do), ``quantized_reduce_scatter`` (uint8 per chunk, each row quantized on its own, one
all_to_all, the W received rows dequantized, summed and divided: quantized_allreduce's phase 1).
With error feedback a rank carries its own contribution's rounding error to the next step; that
error is in the unsharded layout (what this rank sent to every rank), so its residual is a full
gradient of the module, not a shard.

The parameter all-gather's format is the ``all_gather`` parameter every sharded form takes:
``fp32`` (FSDP's own), ``bf16`` or ``uint8`` per chunk of ``all_gather_chunk_size`` (as ZeRO++'s
qwZ). The sharded fp32 parameters stay exact: only the gathered copy the forward and backward
compute with is rounded; its relative L2 error (this rank's own shard, gathered back) is
recorded in ``stats()["all_gather_rel_error"]``.

Both comms run synchronously and return None (FSDP then needs no Work to wait for): on CPU/gloo
FSDP calls them synchronously anyway. Wire bytes: hooks/wire.py's reduce_scatter and all_gather
kinds, (W-1)/W of the unsharded payload each. On a sampled step (``state.sampling``,
hooks/step_sampling.py) each call is stamped as a DDP bucket's is, with its kind: called, its
collective launched (``account``) and returned (``collective_done``), the call's end (``end``):
encode, comm and decode, what the step model prices FSDP's step from.
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable

import torch
import torch.distributed as dist

from . import quantize as q
from .spec import Param, choice, positive_int
from .state import HookState
from .wire import ALL_GATHER, REDUCE_SCATTER

ALL_GATHER_FORMATS = ("fp32", "bf16", "uint8")
_MEAN = dist.ReduceOp.AVG  # what FSDP asks of the reduce-scatter with no divide factor set


def all_gather_parameters() -> dict[str, Param]:
    """The parameters every sharded form takes: the parameter all-gather's format and its chunk."""
    return {"all_gather": choice("fp32", ALL_GATHER_FORMATS, "the parameter all-gather's format"),
            "all_gather_chunk_size": positive_int(512)}


class GradShard:
    """One FSDP module's reduce-scatter input, read through a DDP bucket's methods
    (``index``, ``parameters``, ``buffer``) so HookState counts and flags it like a bucket."""

    def __init__(self, index: int, parameters: list, buffer: torch.Tensor):
        self._index, self._parameters, self._buffer = index, parameters, buffer

    def index(self) -> int:
        return self._index

    def parameters(self) -> list:
        return self._parameters

    def buffer(self) -> torch.Tensor:
        return self._buffer


class ShardState(HookState):
    """A sharded form's state: the wire dtype or chunk of its reduce-scatter, the all-gather's
    format, error feedback's residual per module (module index -> the unsharded layout's residual),
    and the gathered parameters' squared error and norm, summed since the last reset."""

    def __init__(self, process_group=None, *, wire_dtype: torch.dtype = torch.float32, chunk_size: int | None = None,
                 error_feedback: bool = False, all_gather: str = "fp32", all_gather_chunk_size: int = 512):
        super().__init__(process_group, error_feedback)
        self.wire_dtype, self.chunk_size = wire_dtype, chunk_size
        self.all_gather, self.all_gather_chunk_size = all_gather, all_gather_chunk_size
        self.module_residuals: dict[int, torch.Tensor] = {}
        self._gather_error = [0.0, 0.0]  # sum of squared errors, sum of squared values

    def begin_gather(self, output: torch.Tensor) -> float:
        """An all-gather call: counted on its unsharded output, stamped on a sampled step."""
        t0 = time.perf_counter()
        self.accounting.call(output.numel() * output.element_size())
        if self.sampling is not None:
            self.sampling.called(output, t0, ALL_GATHER)
        return t0

    def collective_done(self) -> None:
        """The call's (synchronous) collective returned: on a sampled step, where its decode starts."""
        if self.sampling is not None:
            self.sampling.completed()

    def end(self, t0: float) -> None:
        """The call is done: its seconds counted (``stats()["seconds"]``: both collectives'), its end stamped."""
        self.accounting.add_seconds(time.perf_counter() - t0)
        if self.sampling is not None:
            self.sampling.returned()

    def add_module_residual(self, shard: GradShard, x: torch.Tensor) -> torch.Tensor:
        """With error feedback, the previous step's residual of this module added into ``x``."""
        r = self.module_residuals.get(shard.index()) if self.error_feedback else None
        return x.add_(r) if r is not None and r.shape == x.shape else x

    def record_gather_error(self, sent: torch.Tensor, gathered_back: torch.Tensor) -> None:
        """Add this rank's shard's error as every rank receives it (``gathered_back``)."""
        err = gathered_back.to(torch.float32) - sent.to(torch.float32)
        self._gather_error[0] += float(err.square().sum())
        self._gather_error[1] += float(sent.to(torch.float32).square().sum())

    def stats(self) -> dict[str, float]:
        out = super().stats()
        sq_err, sq_norm = self._gather_error
        out["all_gather_rel_error"] = math.sqrt(sq_err / sq_norm) if sq_norm else 0.0
        return out

    def reset_stats(self) -> None:
        super().reset_stats()
        self._gather_error = [0.0, 0.0]

    def state_dict(self) -> dict[str, Any]:
        d = super().state_dict()
        d["module_residuals"] = {i: r.detach().cpu().clone() for i, r in self.module_residuals.items()}
        d["gather_error"] = list(self._gather_error)
        return d

    def load_state_dict(self, d: dict[str, Any]) -> None:
        super().load_state_dict(d)
        self.module_residuals = {int(i): r.clone() for i, r in d.get("module_residuals", {}).items()}
        self._gather_error = list(d.get("gather_error", [0.0, 0.0]))


def state_factory(**fixed) -> Callable[..., ShardState]:
    """A ``ShardedForm.make_state``: a ShardState with ``fixed`` (the wire dtype) and the params."""
    def make_state(process_group, **params) -> ShardState:
        return ShardState(process_group, **fixed, **params)

    return make_state


# ----------------------------------------------------------------------------- reduce-scatter forms


def fp32_reduce_scatter(state: ShardState, shard: GradShard, output: torch.Tensor) -> None:
    """FSDP's own reduce-scatter (the mean, float32), counted and NaN-flagged: exact."""
    t0 = state.begin(shard, kind=REDUCE_SCATTER)
    x = shard.buffer()
    state.account(REDUCE_SCATTER, x.numel() * x.element_size())
    dist.reduce_scatter_single(output, x, op=_MEAN, group=state.group)
    state.collective_done()
    state.end(t0)


def cast_reduce_scatter(state: ShardState, shard: GradShard, output: torch.Tensor) -> None:
    """The mean in ``state.wire_dtype`` (fp16/bf16): divide by W before the sum (fp16's range, as
    the DDP cast hooks), reduce-scatter in 16 bits, widen into ``output``."""
    t0 = state.begin(shard, kind=REDUCE_SCATTER)
    w = state.world_size()
    x = state.add_module_residual(shard, shard.buffer())
    compressed = x.to(state.wire_dtype, copy=True).div_(w)
    if state.error_feedback:
        state.module_residuals[shard.index()] = x - compressed.to(x.dtype) * w
    reduced = torch.empty(output.numel(), dtype=state.wire_dtype, device=output.device)
    state.account(REDUCE_SCATTER, compressed.numel() * compressed.element_size())
    dist.reduce_scatter_single(reduced, compressed, op=dist.ReduceOp.SUM, group=state.group)
    state.collective_done()
    output.copy_(reduced)
    state.end(t0)


def quantized_reduce_scatter(state: ShardState, shard: GradShard, output: torch.Tensor) -> None:
    """uint8 per chunk: each of the W rows (row r goes to rank r) quantized on its own, one
    all_to_all, the W rows received dequantized and averaged into ``output`` in float32."""
    t0 = state.begin(shard, check_input=state.error_feedback, kind=REDUCE_SCATTER)  # without: the chunks' min/max flag it
    w, chunk, m = state.world_size(), state.chunk_size, output.numel()
    x = state.add_module_residual(shard, shard.buffer()).view(w, m)
    codes = torch.empty((w, m), dtype=torch.uint8, device=x.device)
    meta = torch.empty((w, q.num_chunks(m, chunk), 2), dtype=torch.float32, device=x.device)
    for r in range(w):
        q.quantize(x[r], chunk, codes=codes[r], meta=meta[r])
    if state.error_feedback:
        carried = torch.stack([q.dequantize(codes[r], meta[r], chunk) for r in range(w)])
        state.module_residuals[shard.index()] = (x - carried).view(-1)
    else:
        state.flag_input(shard, q.nonfinite_chunks(meta.view(-1, 2)))
    send = q.pack(codes, meta)  # (W, 8C + m)
    received = torch.empty_like(send)
    state.account(REDUCE_SCATTER, send.numel())
    dist.all_to_all_single(received.view(-1), send.view(-1), group=state.group)
    state.collective_done()
    q.mean_of_messages(received, m, chunk, output.view(-1))
    state.end(t0)


def cast_collectives(n, world_size, **_):
    return [(REDUCE_SCATTER, 2 * n)]


def fp32_collectives(n, world_size, **_):
    return [(REDUCE_SCATTER, 4 * n)]


def quantized_collectives(n, world_size, *, chunk_size, **_):
    """n: the padded unsharded count FSDP reduce-scatters (a multiple of W)."""
    return [(REDUCE_SCATTER, world_size * q.message_bytes(n // world_size, chunk_size))]


def all_gather_collectives(n, world_size, *, all_gather="fp32", all_gather_chunk_size=512, **_):
    """What one parameter all-gather of ``n`` float32 values (padded, unsharded) hands to the wire."""
    if all_gather == "uint8":
        return [(ALL_GATHER, world_size * q.message_bytes(n // world_size, all_gather_chunk_size))]
    return [(ALL_GATHER, (2 if all_gather == "bf16" else 4) * n)]


def call_collectives(kind: str, reduce_scatter_collectives: Callable, n: int, world_size: int, **params) -> list:
    """What one call of ``kind`` (REDUCE_SCATTER: the form's ``collectives``; ALL_GATHER: the
    format's) on ``n`` unsharded float32 values hands to the wire, ``[(kind, payload bytes)]``."""
    if kind == ALL_GATHER:
        return all_gather_collectives(n, world_size, **params)
    return reduce_scatter_collectives(n, world_size, **params)


# ----------------------------------------------------------------------------- all-gather formats


def fp32_all_gather(state: ShardState, output: torch.Tensor, shard: torch.Tensor) -> None:
    """FSDP's own all-gather, counted: exact."""
    t0 = state.begin_gather(output)
    state.account(ALL_GATHER, output.numel() * output.element_size())
    dist.all_gather_single(output, shard, group=state.group)
    state.collective_done()
    state.end(t0)


def bf16_all_gather(state: ShardState, output: torch.Tensor, shard: torch.Tensor) -> None:
    """The parameters gathered in bfloat16 and widened back into ``output``."""
    _float32_only(shard)
    t0 = state.begin_gather(output)
    narrow = shard.to(torch.bfloat16)
    state.record_gather_error(shard, narrow)  # now: FSDP's input is a view of output's own row
    gathered = torch.empty(output.numel(), dtype=torch.bfloat16, device=output.device)
    state.account(ALL_GATHER, gathered.numel() * gathered.element_size())
    dist.all_gather_single(gathered, narrow, group=state.group)
    state.collective_done()
    output.copy_(gathered)
    state.end(t0)


def uint8_all_gather(state: ShardState, output: torch.Tensor, shard: torch.Tensor) -> None:
    """Each rank's shard quantized per chunk (one packed message), gathered, dequantized row by row."""
    _float32_only(shard)
    w, n, chunk = state.world_size(), shard.numel(), state.all_gather_chunk_size
    t0 = state.begin_gather(output)
    message, codes, meta = q.message_views(n, chunk, device=shard.device)
    q.quantize(shard, chunk, codes=codes, meta=meta)
    state.record_gather_error(shard, q.dequantize(codes, meta, chunk))  # before output (shard's view) is written
    gathered = message.new_empty((w * message.numel(),))
    state.account(ALL_GATHER, gathered.numel())
    dist.all_gather_single(gathered, message, group=state.group)
    state.collective_done()
    g_codes, g_meta = q.unpack(gathered.view(w, -1), n, chunk)
    rows = output.view(w, n)
    for r in range(w):
        q.dequantize(g_codes[r], g_meta[r], chunk, out=rows[r])
    state.end(t0)


ALL_GATHERS: dict[str, Callable] = {"fp32": fp32_all_gather, "bf16": bf16_all_gather, "uint8": uint8_all_gather}


def _float32_only(shard: torch.Tensor) -> None:
    if shard.dtype != torch.float32:
        raise ValueError(f"a compressed parameter all-gather takes float32 parameters, got {shard.dtype} "
                         "(mixed parameter dtypes in one FSDP module, or a param_dtype policy): use all_gather: fp32")
