"""docs/hooks.md's "Adding a hook" example, run as written: its module plus one registry entry is
all the rest of the code needs (validation, the sweep's config, the accounting and cost model,
a real DDP step on two gloo processes).

The example's code block is read from the docs and executed as the module ``hooks.clipped``, so
the docs cannot drift from what works.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import re
import sys
from pathlib import Path

import pytest
import torch

import hooks
import hooks.cost
import hooks.registry
from tests.dist_utils import run_distributed

DOC = Path(__file__).resolve().parents[1] / "docs" / "hooks.md"


def _example_source() -> str:
    section = DOC.read_text().split("## Adding a hook", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    return "\n".join(line[3:] if line.startswith("   ") else line for line in block.splitlines())


def _load_example():
    """The docs' module as ``hooks.clipped``, and the registry with its spec added (this process)."""
    spec = importlib.util.spec_from_loader("hooks.clipped", loader=None)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "hooks"
    sys.modules["hooks.clipped"] = module
    # dont_inherit: this file's `from __future__ import annotations` must not reach the hook (DDP refuses it)
    exec(compile(_example_source(), f"{DOC}:Adding a hook", "exec", dont_inherit=True), module.__dict__)
    hooks.registry._SPECS[module.SPEC.name] = module.SPEC
    return module


@pytest.fixture
def example():
    before = dict(hooks.registry._SPECS)
    try:
        yield _load_example()
    finally:
        hooks.registry._SPECS.clear()
        hooks.registry._SPECS.update(before)
        sys.modules.pop("hooks.clipped", None)


def test_the_example_is_validated_and_refused_in_one_line_from_its_spec(example):
    assert hooks.validate("clipped_allreduce", clip=0.5) == {"clip": 0.5}
    with pytest.raises(ValueError) as err:
        hooks.validate("clipped_allreduce", clip=0)
    assert str(err.value) == "hook 'clipped_allreduce': parameter 'clip' must be a positive number, got 0"
    assert hooks.available()["clipped_allreduce"].lossy
    # the report draws it in a pair of its own, with no row of its own in service/report/hook_styles.py
    from service.report.hook_styles import hook_style

    assert hook_style("clipped_allreduce") not in {
        hook_style(name) for name in hooks.available() if name != "clipped_allreduce"}


def test_the_example_is_a_hook_the_sweep_config_accepts(example, tmp_path):
    from service.config import load_config

    path = tmp_path / "clip.yaml"
    path.write_text("name: clip\nworkload: {name: mlp_digits, steps: 20}\n"
                    "search:\n  hooks:\n    - {name: clipped_allreduce, params: {clip: [0.5, 1.0]}}\n"
                    "  world_size: [2]\n")
    cfg, _ = load_config(path)
    assert sorted(t.hook_params["clip"] for t in cfg.trials()) == [0.5, 1.0]


def test_the_cost_model_prices_the_example_from_its_collectives(example):
    n = 1 << 20
    assert hooks.cost.hook_wire_bytes("clipped_allreduce", n, 4) == hooks.cost.hook_wire_bytes("allreduce", n, 4)


def _ddp_step_with_the_example(rank, world_size):
    _load_example()  # a spawned process: the registry entry is made here again
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1, bias=False)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    state, hook = hooks.build("clipped_allreduce", clip=0.5)
    ddp.register_comm_hook(state, hook)
    x = torch.full((1, 8), float(rank + 1))  # rank r's gradient: r + 1 everywhere
    ddp(x).sum().backward()
    return model.weight.grad.tolist(), state.stats()  # plain lists: tensors would cross by shared memory


def test_the_example_trains_under_ddp_on_two_gloo_processes():
    results = run_distributed(_ddp_step_with_the_example, world_size=2)
    expected = [[(0.5 + 0.5) / 2] * 8]  # gradients 1 and 2 clamped to 0.5, then averaged
    for grad, stats in results:
        assert grad == expected
        assert stats["calls"] == 1 and stats["payload_bytes"] == 8 * 4
