"""An fsdp trial's DTensors read without making a DDP trial import DTensor's module.

``torch.distributed.tensor`` pulls in sympy and torch's symbolic shapes (~0.5 CPU-s in each
process). A tensor can be a DTensor only once that module is imported (FSDP2 imports it), so
the checks below look it up in ``sys.modules`` rather than import it: a process that imports the
training code without sharding (the sweep's driver, a Tune trial) never pays for it. (A DDP rank
does anyway: DDP's constructor imports torch._dynamo, which imports it.)
"""
from __future__ import annotations

import sys
from typing import Optional

import torch


def is_dtensor(t) -> bool:
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(t, module.DTensor)


def local(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """This rank's shard of a DTensor, read without a collective (else the tensor itself)."""
    return t.to_local() if is_dtensor(t) else t
