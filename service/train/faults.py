"""Configured fault injection (``faults:`` in the config): NaN or scaled gradients, a crash."""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
import torch.nn as nn

from service.train.dtensors import is_dtensor

CRASH_EXIT_CODE = 17  # what a crash fault's process exits with (Ray Train sees a dead worker)


class FaultInjector:
    """Configured faults (``cfg.faults``) that hit this rank: off unless configured.

    - ``nan_grad``: this rank's local gradient becomes NaN at that step, *before* the
      comm hook sees it (a tensor hook on the first parameter's gradient);
    - ``scale_grad``: this rank's local gradients are multiplied by ``factor`` (large
      but finite: fp16 overflows, fp32 does not);
    - ``crash``: this rank's process dies at the start of that step, once: ``arm`` returns
      True and the loop calls ``os._exit(CRASH_EXIT_CODE)`` where it can be seen;
      ``on_fault`` records it before, and a restarted trial skips faults in ``fired`` so it
      can get past the step.
    """

    def __init__(self, faults, rank: int, fired=frozenset(), on_fault=None):
        self.faults = [(i, f) for i, f in enumerate(faults or []) if f.rank == rank and i not in fired]
        # steps where a fault fires on some rank: the same set on every rank
        self.steps = {f.step for i, f in enumerate(faults or []) if i not in fired}
        self.on_fault = on_fault
        self._handles: list = []

    def due(self, step: int) -> bool:
        """Does a fault fire at ``step`` on any rank?"""
        return step in self.steps

    def arm(self, step: int, module: torch.nn.Module) -> bool:
        """This rank's faults of ``step``, in config order: each recorded (``on_fault``), NaN or
        scaled gradients hooked onto this step's backward; True when a crash is due (the faults
        after it in the list never fire, as the process ends there)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for index, fault in self.faults:
            if fault.step != step:
                continue
            if self.on_fault:
                self.on_fault(index, fault)
            if fault.kind == "crash":
                return True
            # on the gradient the backward computes (an fsdp trial's: its gathered parameter's), before any reduction
            params = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
            if fault.kind == "nan_grad":
                self._handles.append(grad_hook(module, *params[0], _poison))
            elif fault.kind == "scale_grad":
                factor = float(fault.factor)  # the config requires one for scale_grad
                self._handles += [grad_hook(module, n, p, _scaler(factor)) for n, p in params]
        return False


def _poison(grad: torch.Tensor) -> torch.Tensor:
    return grad + float("nan")  # fills the whole gradient with NaN


def _scaler(factor: float):
    def scale(grad: torch.Tensor) -> torch.Tensor:
        return grad * factor
    return scale


# ----------------------------------------------------------------------------- gradient hooks, fsdp or not


class ForwardGradHook:
    """A gradient hook on the parameter FSDP's forward uses (its unsharded copy, which exists
    only once the block was gathered): registered from a forward pre-hook on the parameter's
    module, once per arming; :meth:`remove` takes both away."""

    def __init__(self, root: nn.Module, name: str, fn: Callable[[torch.Tensor], torch.Tensor]):
        path, _, attr = name.rpartition(".")
        owner = root.get_submodule(path) if path else root
        self._tensor_hook: Optional[Any] = None

        def register(module, args):
            if self._tensor_hook is None:  # once: the unsharded parameter persists across micro-batches
                self._tensor_hook = getattr(module, attr).register_hook(fn)

        self._pre_hook = owner.register_forward_pre_hook(register)

    def remove(self) -> None:
        self._pre_hook.remove()
        if self._tensor_hook is not None:
            self._tensor_hook.remove()


def grad_hook(module: nn.Module, name: str, param: torch.Tensor, fn: Callable) -> Any:
    """``fn`` on the gradient of parameter ``name`` as the backward computes it (before any
    reduction): on the parameter itself, or, for an FSDP shard, on what the forward gathered."""
    return ForwardGradHook(module, name, fn) if is_dtensor(param) else param.register_hook(fn)

