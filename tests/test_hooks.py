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
    "quantized_allreduce",
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
@pytest.mark.parametrize("backend", ["native", "torch"])
@pytest.mark.parametrize("n, chunk", [(1, 512), (511, 512), (512, 512), (5037, 64), (1000, 1000), (7, 3)])
def test_quantize_roundtrip_within_half_a_step(n, chunk, backend):
    x = layered(seed=n, sizes=(n,), scales=(3.0,))
    codes, meta = q.quantize(x, chunk, backend=backend)
    c = math.ceil(n / chunk)
    assert codes.dtype == torch.uint8 and codes.shape == (n,) and meta.shape == (c, 2)
    back = q.dequantize(codes, meta, chunk, backend=backend)
    assert back.shape == (n,)
    for i in range(c):  # a plain per-chunk reference for the vectorised kernel
        part = x[i * chunk : (i + 1) * chunk]
        step = (part.max() - part.min()) / 255
        err = (back[i * chunk : (i + 1) * chunk] - part).abs()
        assert bool((err <= 0.5 * step + 1e-6 * part.abs().max()).all())


@pytest.mark.parametrize("backend", ["native", "torch"])
def test_quantize_constant_and_zero_chunks_are_exact_and_finite(backend):
    x = torch.cat([torch.zeros(100), torch.full((100,), -2.5), torch.linspace(-1, 1, 100)])
    codes, meta = q.quantize(x, 100, backend=backend)
    back = q.dequantize(codes, meta, 100, backend=backend)
    assert bool(torch.isfinite(back).all())
    assert torch.equal(back[:200], x[:200])
    assert meta[0, 1] == 0 and meta[1, 1] == 0


@pytest.mark.parametrize("backend", ["native", "torch"])
def test_quantize_short_last_chunk_keeps_its_own_range(backend):
    x = torch.cat([torch.zeros(8), torch.full((3,), 5.0)])  # last chunk [5, 5, 5], nothing padded
    codes, meta = q.quantize(x, 8, backend=backend)
    assert codes.numel() == 11 and meta[1].tolist() == [5.0, 0.0]


def test_pack_unpack_roundtrip():
    x = layered(seed=1, sizes=(1001,), scales=(1.0,))
    codes, meta = q.quantize(x, 64)
    msg = q.pack(codes, meta)
    assert msg.dtype == torch.uint8 and msg.numel() == q.message_bytes(1001, 64) == 1001 + 8 * 16
    codes2, meta2 = q.unpack(torch.stack([msg, msg]), 1001, 64)
    assert torch.equal(meta2[1], meta)
    assert torch.equal(codes2[0], codes)
    # quantizing straight into a message buffer gives the same bytes as packing afterwards
    message, c_view, m_view = q.message_views(1001, 64)
    q.quantize(x, 64, codes=c_view, meta=m_view)
    assert torch.equal(message, msg)


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


# ------------------------------------------------------------------ cost model (hooks.cost)
def test_alpha_beta_collective_times():
    gbps, alpha = 10.0, 5e-6
    beta = gbps * 1e9 / 8
    n = 1_000_000
    assert hooks.cost.collective_seconds("allreduce", n, 4, gbps, alpha) == pytest.approx(2 * 3 * (alpha + n / 4 / beta))
    assert hooks.cost.collective_seconds("allgather", n, 4, gbps, alpha) == pytest.approx(3 * (alpha + n / beta))
    assert hooks.cost.collective_seconds("all_to_all", n, 4, gbps, alpha) == pytest.approx(3 * (alpha + n / 4 / beta))
    assert hooks.cost.collective_seconds("allreduce", n, 1, gbps, alpha) == 0


def test_hook_collectives_match_the_documented_wire_formulas():
    n, c = 100_000, 512
    for w in (2, 3, 4, 8, 64):
        ring = 2 * (w - 1) / w
        assert hooks.cost.hook_wire_bytes("allreduce", n, w) == pytest.approx(ring * 4 * n)
        assert hooks.cost.hook_wire_bytes("fp16_compress", n, w) == pytest.approx(ring * 2 * n)
        assert hooks.cost.hook_wire_bytes("quantization_perchannel", n, w, chunk_size=c) == pytest.approx(
            (w - 1) * (n + 8 * math.ceil(n / c))
        )
        s = math.ceil(math.ceil(n / c) / w)
        assert hooks.cost.hook_wire_bytes("quantized_allreduce", n, w, chunk_size=c) == pytest.approx(2 * (w - 1) * (s * c + 8 * s))
    # about a quarter of fp32 ring allreduce at every world size, for buckets >> W * chunk_size
    big = 25_000_000 // 4
    for w in (2, 4, 8, 64, 512):
        ratio = hooks.cost.hook_wire_bytes("quantized_allreduce", big, w) / hooks.cost.hook_wire_bytes("allreduce", big, w)
        assert 0.25 < ratio < 0.27, (w, ratio)
    # the allgather quantizers stop paying at W = 8
    assert hooks.cost.hook_wire_bytes("quantization_pertensor", big, 8) > hooks.cost.hook_wire_bytes("allreduce", big, 8)


def test_projection_from_measured_stats():
    # two steps of one 1000-float bucket each under allreduce, projected to W = 8 at 100 Gbit/s
    stats = {"calls": 2, "raw_bytes": 8000, "payload_bytes": 8000, "allreduce_calls": 2}
    per_call = hooks.cost.collective_seconds("allreduce", 4000, 8, 100.0)
    assert hooks.cost.projected_comm_seconds("allreduce", stats, steps=2, world_size=8, link_gbps=100.0) == pytest.approx(per_call)
    assert hooks.cost.projected_step_seconds(0.5, "allreduce", stats, 2, 8, 100.0) == pytest.approx(0.5 + per_call)
    # PowerSGD: the measured payload/raw ratio prices the compressed allreduces, plus their latency
    ps = {"calls": 2, "raw_bytes": 8000, "payload_bytes": 2000, "allreduce_calls": 6}
    got = hooks.cost.projected_comm_seconds("powersgd", ps, steps=2, world_size=8, link_gbps=100.0, latency_s=1e-5)
    expect = hooks.cost.collective_seconds("allreduce", 1000, 8, 100.0, 1e-5) + 2 * 2 * 7 * 1e-5
    assert got == pytest.approx(expect)
    assert hooks.cost.projected_comm_seconds("allreduce", {"calls": 0}, 1, 8, 10.0) == 0
    with pytest.raises(ValueError):
        hooks.cost.hook_collectives("nope", 10, 2)


def test_quantized_allreduce_is_listed_with_its_chunk_size():
    spec = hooks.available()["quantized_allreduce"]
    assert spec.params == {"chunk_size": 512, "error_feedback": False} and spec.lossy


def test_with_fidelity_rejects_a_bad_period():
    state, hook = hooks.build("allreduce")
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="every"):
            hooks.with_fidelity(state, hook, every=bad)
    _, wrapped = hooks.with_fidelity(state, hook, every=3)
    assert wrapped.__name__ == "allreduce_with_fidelity"


def test_error_feedback_residuals_follow_their_parameters_through_a_bucket_rebuild():
    """DDP's rebuild: one bucket [p1, p2, p3] becomes bucket 0 = [p3] and bucket 1 = [p1, p2].
    Each parameter's residual must reach it in its new bucket, none lost, none doubled."""
    state = HookState(error_feedback=True)
    p1, p2, p3 = torch.zeros(4), torch.zeros(3), torch.zeros(5)

    def bucket(index, params):
        b = Bucket(torch.zeros(sum(p.numel() for p in params)), index=index)
        b._params = params
        return b

    first = bucket(0, [p1, p2, p3])
    residual = torch.arange(12, dtype=torch.float32) + 1
    state.add_residual(first, first.buffer())
    state.store_residual(first, residual.clone())

    new0 = bucket(0, [p3])
    got0 = state.add_residual(new0, new0.buffer()).clone()
    state.store_residual(new0, torch.full((5,), 100.0))
    new1 = bucket(1, [p1, p2])
    got1 = state.add_residual(new1, new1.buffer()).clone()
    assert torch.equal(got0, residual[7:12])
    assert torch.equal(got1, residual[0:7])
    state.store_residual(new1, torch.full((7,), 200.0))
    # steady state afterwards: each bucket gets exactly its own residual back
    again0 = bucket(0, [p3])
    assert torch.equal(state.add_residual(again0, again0.buffer()), torch.full((5,), 100.0))
