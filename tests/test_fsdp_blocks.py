"""Which modules an fsdp trial shards one by one (service/train/fsdp.py's blocks): the built-ins'
declared blocks, workload.shard's paths and class names, every direct child with parameters by
default, and a name that selects nothing refused in one line."""
import pytest
import torch.nn as nn

from service.train.fsdp import blocks
from service.workloads import build_workload


def test_the_built_ins_declare_their_blocks():
    lm = build_workload("char_lm", 0)
    assert [type(m).__name__ for m in blocks(lm.model, lm.shard)] == ["Block"] * len(lm.model.blocks)
    mlp = build_workload("mlp_digits", 0)
    assert [type(m).__name__ for m in blocks(mlp.model, mlp.shard)] == ["Linear"] * 4


def test_hf_gpt2_shards_each_transformer_block():
    pytest.importorskip("transformers")
    gpt2 = build_workload("hf_gpt2", 0)
    chosen = blocks(gpt2.model, gpt2.shard)
    assert chosen == list(gpt2.model.transformer.h)


def test_a_users_model_names_paths_or_classes_or_gets_its_children():
    model = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1)))
    assert blocks(model, None) == [model[0], model[2]]  # the children holding parameters
    assert blocks(model, ["2"]) == [model[2][0], model[2][1]]  # a Sequential's path: each child
    assert blocks(model, ["Linear"]) == [model[0], model[2][0], model[2][1]]  # a class: every module of it
    assert blocks(model, ["2.1", "0"]) == [model[0], model[2][1]]  # in model order
    with pytest.raises(ValueError, match="'Conv2d' is neither a module path nor a module class"):
        blocks(model, ["Conv2d"])
