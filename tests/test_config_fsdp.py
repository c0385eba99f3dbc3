"""search.parallelism: the fsdp axis, its trials' names, keys and parameters, and what fsdp
refuses at validation, one line each (service/config/sharding.py)."""
from __future__ import annotations

import copy

import pytest

from service.config import load_config
from service.tracking.runs import trial_params
from tests.test_config import BASE, changed, load_error, write

FSDP = {**BASE, "search": {"hooks": ["allreduce", {"name": "quantized_allreduce", "chunk_size": 64,
                                                   "all_gather": ["fp32", "uint8"]}],
                           "world_size": [2], "seed": [0], "parallelism": ["ddp", "fsdp"]}}


def test_default_is_ddp_and_keeps_every_name_and_key(tmp_path):
    cfg = load_config(str(write(tmp_path, BASE)))[0]
    assert cfg.search.parallelism == ["ddp"]
    assert {t.parallelism for t in cfg.trials()} == {"ddp"}
    assert [t.run_name for t in cfg.trials()][:2] == ["allreduce-w1-s0", "quantization_perchannel-c128-w1-s0"]
    assert all("fsdp" not in t.key and "fsdp" not in t.run_name for t in cfg.trials())
    # a sweep recorded before the axis existed resumes: the fingerprint did not change
    assert cfg.fingerprint() == load_config(str(write(tmp_path, changed("search.parallelism", ["ddp"]),
                                                      "b.yaml")))[0].fingerprint()


def test_fsdp_trials_are_named_keyed_and_logged_apart(tmp_path):
    cfg = load_config(str(write(tmp_path, FSDP)))[0]
    names = sorted(t.run_name for t in cfg.trials())
    # all_gather is the sharded form's: uint8 runs under fsdp only (ddp gathers no parameters); fp32,
    # its default, under both
    assert names == ["allreduce-fsdp-w2-s0", "allreduce-w2-s0", "quantized_allreduce-c64-all_gatheruint8-fsdp-w2-s0",
                     "quantized_allreduce-c64-fsdp-w2-s0", "quantized_allreduce-c64-w2-s0"]
    by_name = {t.run_name: t for t in cfg.trials()}
    ddp, fsdp = by_name["allreduce-w2-s0"], by_name["allreduce-fsdp-w2-s0"]
    assert ddp.hook_params == {} and fsdp.hook_params == {"all_gather": "fp32", "all_gather_chunk_size": 512}
    assert ddp.key != fsdp.key and fsdp.key.endswith("-fsdp-w2-s0")
    assert trial_params(fsdp, cfg)["parallelism"] == "fsdp" and trial_params(ddp, cfg)["parallelism"] == "ddp"
    assert by_name["quantized_allreduce-c64-w2-s0"].hook_params == {"chunk_size": 64, "error_feedback": False}


@pytest.mark.parametrize("path, value, fragments", [
    ("search.bucket_cap_mb", [4], ["search.bucket_cap_mb", "DDP's", "fsdp"]),
    ("search.static_graph", [True], ["search.static_graph", "fsdp"]),
    ("search.gradient_as_bucket_view", [True, False], ["search.gradient_as_bucket_view", "fsdp"]),
    ("search.compile", [True], ["search.compile", "fsdp"]),
    ("search.hooks", ["allreduce", "powersgd"], ["search.hooks[1]", "powersgd", "no sharded form",
                                                  "allreduce, fp16_compress, bf16_compress, quantized_allreduce"]),
    ("search.parallelism", ["fsdp", "zero3"], ["search.parallelism", "zero3"]),
])
def test_what_fsdp_cannot_run_is_refused_in_one_line(tmp_path, path, value, fragments):
    line = load_error(write(tmp_path, changed(path, value, base=FSDP)))
    assert "\n" not in line.strip()
    for fragment in fragments:
        assert fragment in line, line


def test_a_sharded_parameter_without_fsdp_is_refused(tmp_path):
    line = load_error(write(tmp_path, changed("search.parallelism", ["ddp"], base=FSDP)))
    assert "all_gather" in line and "fsdp" in line and "\n" not in line.strip()


def test_workload_shard_without_fsdp_is_refused_and_with_it_kept(tmp_path):
    line = load_error(write(tmp_path, changed("workload.shard", ["0"])))
    assert "workload.shard" in line and "fsdp" in line
    cfg = load_config(str(write(tmp_path, changed("workload.shard", ["0"], base=FSDP), "b.yaml")))[0]
    assert cfg.workload.shard == ["0"]


def test_a_bad_all_gather_format_is_refused(tmp_path):
    cfg = copy.deepcopy(FSDP)
    cfg["search"]["hooks"][1]["all_gather"] = "int4"
    line = load_error(write(tmp_path, cfg))
    assert "all_gather" in line and "fp32, bf16, uint8" in line
