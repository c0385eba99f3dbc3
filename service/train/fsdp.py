"""An fsdp trial's model: FSDP2 (``fully_shard``) on the workload's blocks, then the root, with
the trial's hook in its sharded form (hooks/fsdp.py) on every sharded module.

``ShardedModel`` stands where the DDP wrapper stands in a ddp trial, with the parts of its
interface the loop uses: ``module`` (the sharded root: its parameters are DTensor shards, what
the optimizer, the NaN checks and the faults see), ``no_sync()`` (gradient accumulation:
``set_requires_gradient_sync(False)``, the unsharded gradients accumulate locally and are
reduce-scattered once, after the last micro-batch), and a forward. What differs is here too:
the module an eval runs on (an unsharded copy given the full parameters: every rank's eval
share is its own, and FSDP's forward would all-gather a different number of times per rank),
the trainer's state as a full state dict (gathered, every rank taking part), the memory a rank
holds (a fault's gradient hook: service/train/faults.py), and a paired
window's baseline comms (``baseline_comms``: FSDP's fp32 reduce-scatter and all-gather on the
same sharded model for the window, the trial's own back after; service/train/paired_timing.py).
"""
from __future__ import annotations

import copy
from contextlib import contextmanager
from typing import Iterator

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState
from torch.distributed.tensor import DTensor

import hooks.fsdp


class ShardedModel(nn.Module):
    """The fully_shard'ed root (``module``) and an unsharded copy for evals (``eval_module()``)."""

    def __init__(self, root: nn.Module, sharded: list[nn.Module], eval_copy: nn.Module):
        super().__init__()
        self.module = root
        self.sharded = sharded  # every fully_shard'ed module, the blocks in model order, the root last
        self._eval_copy = [eval_copy]  # in a list: not a submodule (not in parameters(), state_dict())

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """As DDP's: no reduce-scatter in this backward; the next synced one reduces the sum."""
        self.module.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            self.module.set_requires_gradient_sync(True)

    @contextmanager
    def baseline_comms(self, state, form) -> Iterator["ShardedModel"]:
        """This model with every sharded module's reduce-scatter and all-gather those of ``(state,
        form)`` (hooks.fsdp.build: a paired window's baseline, FSDP's own fp32), the trial's own
        back after, whatever happens inside. Only between steps: FSDP must be idle, with no
        gradient of an unsynced micro-batch pending (it would be reduced by the baseline's comms);
        each group's gradient-sync setting is restored as it was."""
        groups = [g for m in self.sharded for g in m._get_fsdp_state()._fsdp_param_groups]
        _check_idle(groups)
        # torch 2.13: set_custom_reduce_scatter / set_custom_all_gather set these two per group
        saved = [(g._reduce_scatter_comm, g._all_gather_comm, g.reduce_grads, g.all_reduce_grads) for g in groups]
        for index, module in enumerate(self.sharded):
            hooks.fsdp.attach(state, form, module, index)
        try:
            yield self
        finally:
            for g, (reduce_scatter, all_gather, reduce_grads, all_reduce_grads) in zip(groups, saved):
                g._reduce_scatter_comm, g._all_gather_comm = reduce_scatter, all_gather
                g.reduce_grads, g.all_reduce_grads = reduce_grads, all_reduce_grads

    def eval_module(self) -> nn.Module:
        """The unsharded copy holding the current full parameters (a collective: every rank)."""
        copy_ = self._eval_copy[0]
        with torch.no_grad():
            for p, target in zip(self.module.parameters(), copy_.parameters()):
                target.copy_(p.full_tensor() if isinstance(p, DTensor) else p)
            for b, target in zip(self.module.buffers(), copy_.buffers()):
                target.copy_(b)
        return copy_


def _check_idle(groups) -> None:
    """RuntimeError unless every FSDP param group is between steps: idle, no unsynced micro-batch's
    gradient held for a later reduce-scatter, no reduce-scatter input still retained."""
    for g in groups:
        pending = [fp for fp in g.fsdp_params if fp.unsharded_accumulated_grad is not None
                   or (hasattr(fp, "_unsharded_param") and fp.unsharded_param.grad is not None)]
        if g._training_state != TrainingState.IDLE or pending or g.comm_ctx.reduce_scatter_states:
            raise RuntimeError("the sharded model's comms are swapped only between steps (FSDP idle, no gradient "
                               "of an unsynced micro-batch pending)")


def shard(model: nn.Module, names, process_group=None) -> ShardedModel:
    """``model`` fully_shard'ed on a CPU/GPU mesh over ``process_group`` (None: the default
    group): each of the blocks ``names`` selects (:func:`blocks`), then the root."""
    group = process_group if process_group is not None else dist.group.WORLD
    device_type = next(model.parameters()).device.type
    mesh = DeviceMesh.from_group(group, device_type)
    eval_copy = copy.deepcopy(model)
    chosen = blocks(model, names)
    for block in reversed(chosen):  # inner before outer, should one chosen block hold another
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return ShardedModel(model, chosen + [model], eval_copy)


def blocks(model: nn.Module, names) -> list[nn.Module]:
    """The modules to shard one by one, in model order: per name a module path (a ModuleList's or
    Sequential's children each, else the module) or a class name (every module of that class);
    no names: every direct child that holds parameters. ValueError for a name that selects nothing."""
    if not names:
        return [c for c in model.children() if _holds_parameters(c)]
    chosen: list[nn.Module] = []
    for name in names:
        found = [m for m in model.modules() if type(m).__name__ == name and m is not model]
        if not found:
            try:
                found = [model.get_submodule(name)]
            except AttributeError:
                raise ValueError(f"workload.shard: {name!r} is neither a module path nor a module class of the "
                                 f"model ({type(model).__name__})") from None
            if isinstance(found[0], (nn.ModuleList, nn.Sequential)):
                found = list(found[0].children())
        chosen += [m for m in found if _holds_parameters(m) and all(m is not c for c in chosen)]
    order = {id(m): i for i, m in enumerate(model.modules())}
    return sorted(chosen, key=lambda m: order[id(m)])


def _holds_parameters(module: nn.Module) -> bool:
    return any(p.requires_grad for p in module.parameters())


def attach_hook(model: ShardedModel, name: str, params: dict, process_group=None):
    """The trial's hook in its sharded form on every sharded module; returns its state."""
    state, form = hooks.fsdp.build(name, process_group=process_group, **params)
    for index, module in enumerate(model.sharded):
        hooks.fsdp.attach(state, form, module, index)
    return state


# ----------------------------------------------------------------------------- checkpoints


_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_state(model: ShardedModel, optimizer) -> tuple[dict, dict]:
    """(model, optimizer) full state dicts, gathered: a collective; rank 0's hold the tensors."""
    return get_state_dict(model.module, optimizer, options=_FULL)


def load_full_state(model: ShardedModel, optimizer, model_state: dict, optimizer_state: dict) -> None:
    """Every rank loads the same full state dicts; each keeps its shards. An optimizer without
    tensor state (plain SGD) keeps its own param groups: torch 2.13's full optimizer-state
    loader places the state by a tensor it holds, and raises where there is none."""
    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model.module, model_state, options=options)
    if optimizer_state.get("state"):
        set_optimizer_state_dict(model.module, optimizer, optimizer_state, options=options)
