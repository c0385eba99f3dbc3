"""FSDP2's comm interfaces (``ReduceScatter``, ``AllGather``) carrying a hook's sharded form.

A module of its own because importing ``torch.distributed.fsdp`` pulls in DTensor, sympy and
torch's symbolic shapes (~0.5 CPU-s in each process): only a process that shards a model imports
it (hooks/fsdp.py's ``attach``), never a DDP trial's ranks or the sweep's driver. The forms
themselves are plain functions in hooks/sharded.py.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

from .sharded import _MEAN, ALL_GATHERS, GradShard, ShardState


class ShardedReduceScatter(ReduceScatter):
    """One FSDP module's reduce-scatter: ``form(state, GradShard(index, parameters, input), output)``."""

    def __init__(self, state: ShardState, form: Callable, index: int, parameters: list):
        self.state, self.form, self.index, self.parameters = state, form, index, parameters

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op: bool = False):
        _same_group(self.state, group)
        if op != _MEAN:  # a gradient divide factor or a forced sum reduction: not the mean the forms compute
            raise ValueError(f"the sharded hooks compute FSDP's mean reduce-scatter (ReduceOp.AVG), got {op}: "
                             "leave FSDP's gradient divide factor and sum reduction unset")
        self.form(self.state, GradShard(self.index, self.parameters, input_tensor), output_tensor)
        return None


class ShardedAllGather(AllGather):
    """Every FSDP module's parameter all-gather in the state's format."""

    def __init__(self, state: ShardState):
        self.state, self.form = state, ALL_GATHERS[state.all_gather]

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, async_op: bool = False):
        _same_group(self.state, group)
        self.form(self.state, output_tensor, input_tensor)
        return None


def _same_group(state: ShardState, group) -> None:
    if group is not state.group and dist.get_world_size(group) != state.world_size():
        raise ValueError("the sharded hook's state was built on another process group than FSDP's mesh")
