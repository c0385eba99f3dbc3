"""hooks library, single process: registry and validation, the quantization kernel, the byte
formulas, NaN flags, checkpoints, and that `import hooks` needs only torch.
Collective behaviour on real process groups: tests/test_hooks_dist.py."""
import math
import pickle
import subprocess
import sys

import pytest
import torch

import hooks
from hooks import quantize as q
from hooks.state import HookState
from tests.hooks_checks import Bucket, layered

NAMES = {
    "allreduce",
    "allgather_then_aggregate",
    "fp16_compress",
    "bf16_compress",
    "quantization_pertensor",
    "quantization_perchannel",
    "powersgd",
}


def test_available_lists_every_hook_with_its_defaults():
    specs = hooks.available()
    assert NAMES <= set(specs)
    assert specs["quantization_perchannel"].params["chunk_size"] == 512
    ps = specs["powersgd"].params
    assert (ps["rank"], ps["start_iter"], ps["error_feedback"], ps["warm_start"]) == (1, 10, True, True)
    assert ps["orthogonalization_epsilon"] > 0
    assert not specs["allreduce"].lossy and specs["quantization_pertensor"].lossy
    for name, spec in specs.items():
        assert spec.name == name and spec.doc


def test_validate_fills_defaults_without_a_process_group():
    assert hooks.validate("quantization_perchannel") == {"chunk_size": 512, "error_feedback": False}
    assert hooks.validate("quantization_perchannel", chunk_size=64)["chunk_size"] == 64
    assert hooks.validate("allreduce") == {}


@pytest.mark.parametrize(
    "name, params, words",
    [
        ("nope", {}, ["unknown hook 'nope'", "allreduce", "powersgd"]),
        ("quantization_perchannel", {"chunk_size": 0}, ["chunk_size", "positive integer"]),
        ("quantization_perchannel", {"chunk_size": 1.5}, ["chunk_size", "positive integer"]),
        ("quantization_perchannel", {"chunk_size": True}, ["chunk_size"]),
        ("quantization_perchannel", {"chunk_sise": 64}, ["chunk_sise", "chunk_size (default 512)"]),
        ("allreduce", {"chunk_size": 64}, ["no parameter 'chunk_size'", "none"]),
        ("powersgd", {"rank": -1}, ["rank", "positive integer"]),
        ("powersgd", {"start_iter": 1}, ["start_iter", ">= 2"]),
        ("powersgd", {"warm_start": "yes"}, ["warm_start", "true or false"]),
        ("fp16_compress", {"error_feedback": 1}, ["error_feedback", "true or false"]),
    ],
)
def test_validate_rejects_bad_input_in_one_line(name, params, words):
    with pytest.raises(ValueError) as err:
        hooks.validate(name, **params)
    message = str(err.value)
    assert "\n" not in message
    for word in words:
        assert word in message
    with pytest.raises(ValueError):
        hooks.build(name, **params)  # build validates first


def test_powersgd_without_memory_may_start_at_once():
    assert hooks.validate("powersgd", start_iter=0, error_feedback=False, warm_start=False)["start_iter"] == 0


def test_build_gives_named_hooks_for_every_name():
    for name in hooks.available():
        state, hook = hooks.build(name)
        assert isinstance(state, HookState) and hook.__name__ and callable(hook)
        assert state.params == hooks.validate(name)


def test_import_hooks_needs_only_torch():
    code = (
        "import sys\n"
        "for blocked in ('numpy', 'ray', 'mlflow', 'pydantic', 'yaml'):\n"
        "    sys.modules[blocked] = None\n"
        "import hooks\n"
        "state, hook = hooks.build('quantization_perchannel', chunk_size=8)\n"
        "print(sorted(hooks.available()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "quantization_perchannel" in out.stdout


# ------------------------------------------------------------------ quantization kernel
@pytest.mark.parametrize("n, chunk", [(1, 512), (511, 512), (512, 512), (5037, 64), (1000, 1000), (7, 3)])
def test_quantize_roundtrip_within_half_a_step(n, chunk):
    x = layered(seed=n, sizes=(n,), scales=(3.0,))
    codes, meta = q.quantize(x, chunk)
    c = math.ceil(n / chunk)
    assert codes.dtype == torch.uint8 and codes.shape == (c, chunk) and meta.shape == (c, 2)
    back = q.dequantize(codes, meta).reshape(-1)[:n]
    for i in range(c):  # a plain per-chunk reference for the vectorised kernel
        part = x[i * chunk : (i + 1) * chunk]
        step = (part.max() - part.min()) / 255
        err = (back[i * chunk : (i + 1) * chunk] - part).abs()
        assert bool((err <= 0.5 * step + 1e-6 * part.abs().max()).all())


def test_quantize_constant_and_zero_chunks_are_exact_and_finite():
    x = torch.cat([torch.zeros(100), torch.full((100,), -2.5), torch.linspace(-1, 1, 100)])
    codes, meta = q.quantize(x, 100)
    back = q.dequantize(codes, meta).reshape(-1)
    assert bool(torch.isfinite(back).all())
    assert torch.equal(back[:200], x[:200])
    assert meta[0, 1] == 0 and meta[1, 1] == 0


def test_quantize_padding_does_not_widen_the_last_chunk():
    x = torch.cat([torch.zeros(8), torch.full((3,), 5.0)])  # last chunk [5, 5, 5] + padding
    codes, meta = q.quantize(x, 8)
    assert meta[1].tolist() == [5.0, 0.0]


def test_pack_unpack_roundtrip():
    x = layered(seed=1, sizes=(1001,), scales=(1.0,))
    codes, meta = q.quantize(x, 64)
    msg = q.pack(codes, meta, 1001)
    assert msg.dtype == torch.uint8 and msg.numel() == q.message_bytes(1001, 64) == 1001 + 8 * 16
    codes2, meta2 = q.unpack(torch.stack([msg, msg]), 1001, 64)
    assert torch.equal(meta2[1], meta)
    assert torch.equal(codes2[0].reshape(-1)[:1001], codes.reshape(-1)[:1001])


# ------------------------------------------------------------------ byte formulas
def test_wire_bytes_follow_the_standard_algorithms():
    for w in (1, 2, 3, 4, 8):
        assert hooks.cost.wire_bytes("allreduce", 1000, w) == pytest.approx(2 * (w - 1) / w * 1000)
        assert hooks.cost.wire_bytes("allgather", 1000, w) == (w - 1) * 1000
        assert hooks.cost.wire_bytes("all_to_all", 1000, w) == pytest.approx((w - 1) / w * 1000)
    with pytest.raises(ValueError):
        hooks.cost.wire_bytes("broadcast", 1, 2)


# ------------------------------------------------------------------ NaN flags and checkpoints
def test_nonfinite_flags_are_counted_then_popped_once():
    state = HookState()
    clean = Bucket(torch.ones(10), index=0)
    nan = torch.ones(10)
    nan[3] = float("nan")
    inf = torch.ones(10)
    inf[0] = float("-inf")
    state.begin(clean)
    state.begin(Bucket(nan, index=1))
    state.begin(Bucket(inf, index=2))
    state.begin(Bucket(inf.clone(), index=2))
    assert state.stats()["nonfinite_inputs"] == 3  # pending flags included
    popped = state.pop_nonfinite_buckets()
    assert sorted(b.bucket_index for b in popped) == [1, 2]
    assert all(isinstance(b.parameters, list) for b in popped)
    assert state.pop_nonfinite_buckets() == []
    assert state.stats()["nonfinite_inputs"] == 3
    state.reset_stats()
    assert state.stats()["nonfinite_inputs"] == 0
    state.begin(Bucket(nan.clone(), index=1))
    assert state.stats()["nonfinite_inputs"] == 1


def test_nonfinite_pending_state_is_bounded_by_the_bucket_count():
    state = HookState()
    bad = torch.full((4,), float("nan"))
    for _ in range(1000):
        state.begin(Bucket(bad, index=0))
    assert len(state._nonfinite_counts) == 1
    assert state.stats()["nonfinite_inputs"] == 1000
    assert len(state.pop_nonfinite_buckets()) == 1


def test_huge_finite_values_are_not_flagged():
    state = HookState()
    state.begin(Bucket(torch.full((1000,), 3e38), index=0))
    assert state.stats()["nonfinite_inputs"] == 0


@pytest.mark.parametrize("name", sorted(NAMES))
def test_state_dict_is_plain_and_loads_into_a_fresh_state(name):
    state, _ = hooks.build(name)
    state.begin(Bucket(torch.ones(4)))
    d = state.state_dict()
    blob = pickle.dumps(d)
    buf = __import__("io").BytesIO()
    torch.save(d, buf)
    buf.seek(0)
    d2 = torch.load(buf, weights_only=True)  # checkpoint loaders default to weights_only
    fresh, _ = hooks.build(name)
    fresh.load_state_dict(pickle.loads(blob))
    fresh.load_state_dict(d2)
    assert fresh.stats()["calls"] == 1
