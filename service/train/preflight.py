"""Checks at the start of a trial, before DDP wraps the model and the first step runs.

A workload that cannot train is stopped here with one line naming it and the problem
(``WorkloadError``), on every rank alike, instead of failing mid-run with a traceback (or,
worse, training silently wrong):

- ``check_items``: the datasets' items all have the same structure (the same dict keys, or
  tuples of the same length), sampled at a few indices of both sets; the ``loss_fn`` form
  needs ``(x, y)`` items;
- ``check_loss``: the loss of a 2-sample training batch, computed on the bare model (eval
  mode, no_grad: no weight, buffer or RNG changes), is a scalar floating tensor; an
  exception raised by the user's code is reported as one line too;
- ``unused_parameters``: one training-mode forward and backward of that batch on the bare model
  (``torch.autograd.grad``, so no ``.grad`` is written; RNG forked; buffers and train/eval
  modes put back) names the parameters that get no gradient: an eval-only head, a branch the
  batch did not take, an expert no sample was routed to. DDP without
  ``find_unused_parameters`` fails on them at its second step; the worker turns it on, or
  refuses when the config says ``find_unused_parameters: false``;
- ``check_same_on_every_rank``: a digest of the initial weights (and of a few data items),
  compared across ranks with one all-reduce. DDP would broadcast rank 0's weights and hide
  a non-deterministic build, but not a data split drawn differently per rank; the digest
  is of the exact bytes (blake2b), so equal builds on different CPUs still agree.
"""

from __future__ import annotations

import hashlib
from typing import Any, Mapping, Optional

import torch
import torch.distributed as dist

from service.text import count, one_line
from service.workloads import Workload, to_device


class WorkloadError(ValueError):
    """A workload that cannot be trained as given: one line, ``workload 'NAME': problem``."""

    def __init__(self, name: str, problem: str):
        self.name, self.problem = name, problem
        super().__init__(f"workload {name!r}: {one_line(problem)}")

    def __reduce__(self):  # Ray pickles it to the driver: rebuilt from both arguments, not args
        return type(self), (self.name, self.problem)


# ----------------------------------------------------------------------------- items


def item_structure(item: Any) -> str:
    """A short description of a dataset item's shape of container: what batches must share."""
    if isinstance(item, Mapping):
        return "a dict with keys " + ", ".join(sorted(map(str, item)))
    if isinstance(item, (tuple, list)):
        return f"a {len(item)}-item {type(item).__name__}"
    return f"a {type(item).__name__}"


def _sample_indices(n: int) -> list[int]:
    return sorted({0, 1 % n, n // 2, n - 1})


def check_items(name: str, wl: Workload) -> None:
    """Every sampled item of train_set and eval_set has the structure of train_set[0]."""
    first = None
    for field in ("train_set", "eval_set"):
        dataset = getattr(wl, field)
        for i in _sample_indices(len(dataset)):
            try:
                item = dataset[i]
            except Exception as err:  # a user's dataset may fail any way
                raise WorkloadError(name, f"{field}[{i}] failed: {one_line(err, every_line=True)}") from None
            shape = item_structure(item)
            if first is None:
                first = ("train_set[0]", shape)
                if wl.batch_loss is None and not (isinstance(item, (tuple, list)) and len(item) == 2):
                    raise WorkloadError(name, f"loss_fn takes (x, y) items but train_set[0] is {shape}; "
                                              "give batch_loss(model, batch) for other batches")
            elif shape != first[1]:
                raise WorkloadError(name, f"inconsistent batches: {first[0]} is {first[1]} but "
                                          f"{field}[{i}] is {shape}")


# ----------------------------------------------------------------------------- the loss


def _probe_batch(wl: Workload, device, precision):
    return to_device(wl.fetch(wl.train_set, torch.arange(min(2, len(wl.train_set)))), device,
                     precision.input_dtype)


def _form(wl: Workload) -> str:
    return "batch_loss" if wl.batch_loss is not None else "loss_fn"


@torch.no_grad()
def check_loss(name: str, wl: Workload, model: torch.nn.Module, device, precision) -> None:
    """The loss of train_set[:2] on the bare model is a scalar floating tensor."""
    batch = _probe_batch(wl, device, precision)
    form = _form(wl)
    was_training = model.training
    model.eval()
    try:
        with precision.autocast():
            loss = wl.step_loss(model, batch)
    except Exception as err:  # the user's model or loss: one line, at the start
        raise WorkloadError(name, f"{form} failed on a batch of 2 training samples: {one_line(err, every_line=True)}") from None
    finally:
        model.train(was_training)
    if not isinstance(loss, torch.Tensor):
        raise WorkloadError(name, f"{form} returned {type(loss).__name__}; expected a scalar tensor")
    if loss.dim() != 0:
        raise WorkloadError(name, f"{form} returned a tensor of shape {tuple(loss.shape)}; expected a "
                                  "scalar (0-dim) tensor: reduce it, e.g. with .mean()")
    if not loss.is_floating_point():
        raise WorkloadError(name, f"{form} returned a {loss.dtype} tensor; expected a floating-point scalar")


# ----------------------------------------------------------------------------- unused parameters


def unused_parameters(name: str, wl: Workload, model: torch.nn.Module, device, precision) -> list[str]:
    """The trainable parameters that get no gradient from a training-mode loss of train_set[:2].

    Leaves no trace: ``autograd.grad`` writes no ``.grad``, the RNG (dropout) is forked, every
    buffer (BatchNorm's running statistics, a user's counters) gets its tensor and values back,
    and every module its own train/eval mode. Call it after ``check_loss`` (the loss is known
    to be a floating scalar). One batch: a branch that this batch takes is not found here.
    """
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not params:
        return []
    batch = _probe_batch(wl, device, precision)
    modes = [(m, m.training) for m in model.modules()]
    buffers = [(m, key, b, b.detach().clone()) for m in model.modules()
               for key, b in m._buffers.items() if b is not None]
    device = torch.device(device)
    try:
        with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
            model.train()
            with precision.autocast():
                loss = wl.step_loss(model, batch)
            if not loss.requires_grad:
                raise WorkloadError(name, f"{_form(wl)}'s loss does not depend on any trainable parameter "
                                          "(it has no grad_fn): nothing would train")
            grads = torch.autograd.grad(loss, [p for _, p in params], allow_unused=True)
    except WorkloadError:
        raise
    except Exception as err:  # the user's model in training mode, or its backward
        raise WorkloadError(name, f"{_form(wl)} failed in a training-mode step on 2 training samples: "
                                  f"{one_line(err, every_line=True)}") from None
    finally:
        for module, training in modes:
            module.training = training  # each module's own flag: train() would recurse
        with torch.no_grad():
            for module, key, tensor, saved in buffers:
                tensor.copy_(saved)
                module._buffers[key] = tensor  # a forward that rebinds a buffer gets the original back
    return [n for (n, _), g in zip(params, grads) if g is None]


def find_unused_setting(name: str, unused: list[str], setting) -> bool:
    """DDP's ``find_unused_parameters`` for this model: the config's ``true``/``false``, or with
    ``auto`` on exactly when a parameter got no gradient. A model with such parameters and the
    setting ``false`` is refused here: DDP would fail at its second step."""
    if setting == "auto":
        return bool(unused)
    if not setting and unused:
        shown = ", ".join(unused[:5]) + (", ..." if len(unused) > 5 else "")
        raise WorkloadError(name, f"{count(len(unused), 'parameter')} {'gets' if len(unused) == 1 else 'get'} no gradient in a training step "
                                  f"({shown}) but workload.find_unused_parameters is false: DDP would fail "
                                  "at the second step; set it to auto or true")
    return bool(setting)


# ----------------------------------------------------------------------------- ranks agree


def _digest(chunks) -> int:
    h = hashlib.blake2b(digest_size=8)
    for t in chunks:
        h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy())  # no copy
    return int.from_bytes(h.digest(), "little", signed=True)


def _item_tensors(item: Any):
    if isinstance(item, torch.Tensor):
        yield item
    elif isinstance(item, Mapping):
        for key in sorted(item, key=str):
            yield from _item_tensors(item[key])
    elif isinstance(item, (tuple, list)):
        for value in item:
            yield from _item_tensors(value)
    elif isinstance(item, (int, float, bool)):
        yield torch.tensor(item)


def fingerprints(wl: Workload) -> tuple[list[tuple[str, int]], int]:
    """(per-tensor digests of the weights and buffers by name, one digest of sampled items)."""
    weights = [(n, _digest([t])) for n, t in
               [*wl.model.named_parameters(), *wl.model.named_buffers()]]
    items = []
    for field in ("train_set", "eval_set"):
        dataset = getattr(wl, field)
        for i in _sample_indices(len(dataset)):
            items.extend(_item_tensors(dataset[i]))
    return weights, _digest(items)


def check_same_on_every_rank(name: str, wl: Workload, *, rank: int, world_size: int, device,
                             process_group=None) -> None:
    """Every rank built the same weights and data (one all-reduce of a [W, 2] digest table;
    at a mismatch one more exchange to name the first differing tensor). Call it on every
    rank, before DDP (whose constructor broadcasts rank 0's weights)."""
    if world_size < 2 or not (dist.is_available() and dist.is_initialized()):
        return
    table = torch.zeros(world_size, 3, dtype=torch.int64, device=torch.device(device))
    failure = None
    try:
        weights, items = fingerprints(wl)
        table[rank, 0], table[rank, 1] = _digest_of_list(weights), items
    except Exception as err:  # reading a user's dataset failed here: every rank must still join
        failure = err
        table[rank, 2] = 1
    dist.all_reduce(table, group=process_group)
    rows = table.tolist()
    failed = [r for r in range(world_size) if rows[r][2]]
    if failed:
        what = one_line(failure, every_line=True) if failure is not None else "see that rank's error"
        raise WorkloadError(name, f"reading its weights or data failed on rank {failed[0]}: {what}")
    bad = [r for r in range(world_size) if rows[r] != rows[0]]
    if not bad:
        return
    other = bad[0]
    if rows[other][0] != rows[0][0]:
        everyone: list[Optional[list]] = [None] * world_size
        dist.all_gather_object(everyone, weights, group=process_group)
        differing = [n for (n, a), (_, b) in zip(everyone[0], everyone[other]) if a != b]
        first = differing[0] if differing else "?"
        raise WorkloadError(name, f"not deterministic for seed: rank {other}'s initial weights differ from rank "
                                  f"0's ({len(differing)} tensors, first {first}); build the model from torch's "
                                  "RNG only (the seed is set for you; seed numpy/random yourself)")
    raise WorkloadError(name, f"not deterministic for seed: rank {other}'s training or eval data differ from "
                              "rank 0's; split and shuffle the data from the seed only")


def _digest_of_list(named: list[tuple[str, int]]) -> int:
    h = hashlib.blake2b(digest_size=8)
    for n, d in named:
        h.update(n.encode())
        h.update(d.to_bytes(8, "little", signed=True))
    return int.from_bytes(h.digest(), "little", signed=True)
