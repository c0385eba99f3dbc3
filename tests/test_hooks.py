"""hooks library, single process: registry and validation, the quantization kernel, the byte
formulas, NaN flags, checkpoints, and that `import hooks` needs only torch.
Collective behaviour on real process groups: tests/test_hooks_dist.py."""
import dataclasses
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
    "topk",
    "randomk",
    "signsgd",
    "qsgd",
    "plan",
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
        ("topk", {"ratio": 0}, ["ratio", "(0, 1]"]),
        ("topk", {"ratio": 1.5}, ["ratio", "(0, 1]"]),
        ("randomk", {"ratio": -0.1}, ["ratio", "(0, 1]"]),
        ("randomk", {"ratio": float("nan")}, ["ratio", "(0, 1]"]),
        ("topk", {"ratio": "1%"}, ["ratio", "(0, 1]"]),
        ("topk", {"ratio": True}, ["ratio"]),
        ("topk", {"chunk_size": 64}, ["no parameter 'chunk_size'", "ratio (default 0.01)"]),
        ("qsgd", {"levels": 0}, ["levels", "1 to 127"]),
        ("qsgd", {"levels": 128}, ["levels", "1 to 127", "int8"]),
        ("qsgd", {"levels": 2.5}, ["levels", "integer"]),
        ("qsgd", {"chunk_size": 0}, ["chunk_size", "positive integer"]),
        ("signsgd", {"chunk_size": -8}, ["chunk_size", "positive integer"]),
        ("signsgd", {"majority_vote": "yes"}, ["majority_vote", "true or false"]),
        ("signsgd", {"error_feedback": None}, ["error_feedback", "true or false"]),
        ("powersgd", {"wire_dtype": "fp8"}, ["wire_dtype", "one of fp32, fp16, bf16"]),
        ("powersgd", {"wire_dtype": 16}, ["wire_dtype", "one of fp32, fp16, bf16"]),
        ("topk", {"wire_dtype": "float16"}, ["wire_dtype", "one of fp32, fp16, bf16"]),
        ("randomk", {"wire_dtype": None}, ["wire_dtype", "one of fp32, fp16, bf16"]),
        ("powersgd", {"min_compression_rate": -1}, ["min_compression_rate", "non-negative"]),
        ("powersgd", {"min_compression_rate": "2"}, ["min_compression_rate", "non-negative"]),
        ("powersgd", {"batched": 1}, ["batched", "true or false"]),
        ("powersgd", {"batched": True, "min_compression_rate": 4}, ["min_compression_rate", "no effect with batched"]),
        ("powersgd", {"batched": True, "orthogonalization_epsilon": 0.0},
         ["orthogonalization_epsilon", "no effect with batched"]),
        ("qsgd", {"wire_dtype": "fp16"}, ["no parameter 'wire_dtype'"]),
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


def test_compressor_defaults_and_coercion():
    assert hooks.validate("topk") == {"ratio": 0.01, "wire_dtype": "fp32", "error_feedback": False}
    assert hooks.validate("randomk", ratio=1) == {"ratio": 1.0, "wire_dtype": "fp32", "error_feedback": False}
    assert hooks.validate("signsgd") == {"chunk_size": 512, "majority_vote": False, "error_feedback": False}
    assert hooks.validate("qsgd") == {"levels": 127, "chunk_size": 512, "error_feedback": False}
    for name in ("topk", "randomk", "signsgd", "qsgd"):
        assert hooks.available()[name].lossy


def test_num_selected_is_ceil_of_ratio_times_n_without_float_noise():
    from hooks.sparsify import num_selected

    assert num_selected(100, 0.07) == 7  # 0.07 * 100 = 7.000000000000001 in binary floating point
    assert num_selected(5037, 0.01) == 51 and num_selected(5037, 0.1) == 504
    assert num_selected(10, 0.01) == 1 and num_selected(10, 1.0) == 10 and num_selected(1, 0.5) == 1


def test_strata_indices_are_distinct_one_per_stratum_and_reproducible():
    from hooks.sparsify import strata_indices

    for n, k in ((1000, 10), (1001, 7), (5037, 504), (12, 12), (1, 1)):
        idx = strata_indices(n, k, torch.Generator().manual_seed(3))
        assert idx.dtype == torch.int64 and idx.numel() == k and idx.unique().numel() == k
        bounds = torch.arange(k + 1) * n // k
        assert bool(((idx >= bounds[:-1]) & (idx < bounds[1:])).all())
        assert torch.equal(idx, strata_indices(n, k, torch.Generator().manual_seed(3)))
    assert torch.equal(strata_indices(12, 12, torch.Generator().manual_seed(0)), torch.arange(12))
    # uniform within a stratum: over many draws each of a 10-element stratum's positions turns up
    draws = torch.stack([strata_indices(100, 10, torch.Generator().manual_seed(s)) for s in range(400)])
    counts = torch.bincount(draws[:, 0], minlength=10)
    assert int(counts.min()) > 15, counts


def test_sign_bits_pack_eight_per_byte_and_round_trip():
    from hooks.sign import pack_signs, unpack_signs

    # every byte value: element 8b + j negative exactly where bit j of b is set
    patterns = torch.arange(256)
    bits = (patterns[:, None] >> torch.arange(8)) & 1
    x = torch.where(bits.bool(), -1.5, 2.0).reshape(-1)
    assert torch.equal(pack_signs(x), patterns.to(torch.uint8))
    for n in (1, 7, 8, 9, 5037, 100_003):
        v = torch.randn(n, generator=torch.Generator().manual_seed(n))
        v[:: 11] = 0.0
        v[5 :: 13] = -0.0
        packed = pack_signs(v)
        assert packed.dtype == torch.uint8 and packed.numel() == math.ceil(n / 8)
        expect = torch.where(v < 0, -1.0, 1.0)  # zeros (and -0.0) are sent as +
        assert torch.equal(unpack_signs(packed, n), expect)
        if n % 8:  # the last byte's unused bits are 0
            assert int(packed[-1]) >> (n % 8) == 0
    nan = torch.tensor([float("nan"), -1.0, float("-inf"), float("inf")])
    assert unpack_signs(pack_signs(nan), 4).tolist() == [1.0, -1.0, -1.0, 1.0]
    out = torch.empty(2, dtype=torch.uint8)
    assert pack_signs(torch.full((16,), -1.0), out=out) is out and out.tolist() == [255, 255]


def test_qsgd_encode_is_unbiased_within_one_level_and_exact_on_levels():
    from hooks import qsgd

    x = layered(seed=4, sizes=(1000,), scales=(1.0,))
    codes, norms = torch.empty(1000, dtype=torch.int8), torch.empty(16)
    qsgd.encode(x, 3, 64, torch.Generator().manual_seed(0), codes, norms)
    assert int(codes.abs().max()) <= 3
    back = qsgd.decode(codes, norms, 3, 64, out=torch.empty(1000))
    per_chunk_level = torch.repeat_interleave(norms / 3, 64)[:1000]
    assert bool(((back - x).abs() < per_chunk_level * (1 + 1e-6)).all())
    total = torch.zeros(1000, dtype=torch.float64)
    for s in range(300):
        qsgd.encode(x, 3, 64, torch.Generator().manual_seed(s), codes, norms)
        total += qsgd.decode(codes, norms, 3, 64, out=torch.empty(1000)).double()
    single = float((back - x).norm())
    assert float((total / 300 - x.double()).norm()) < 0.15 * single  # ~1/sqrt(300) = 0.06 of one draw
    zero = torch.zeros(70)
    qsgd.encode(zero, 5, 64, torch.Generator(), codes[:70], norms[:2])
    assert torch.equal(qsgd.decode(codes[:70], norms[:2], 5, 64, out=torch.empty(70)), zero)


def test_powersgd_without_memory_may_start_at_once():
    assert hooks.validate("powersgd", start_iter=0, error_feedback=False, warm_start=False)["start_iter"] == 0


def test_build_gives_named_hooks_for_every_name():
    for name in hooks.available():
        state, hook = hooks.build(name)
        assert isinstance(state, HookState) and hook.__name__ and callable(hook)
        assert state.params == hooks.validate(name)


def test_import_hooks_needs_only_torch():
    """Nor FSDP2's modules (~0.5 CPU-s to import: DTensor, sympy), until a model is sharded:
    validating a sharded form imports none of them."""
    code = (
        "import sys\n"
        "for blocked in ('numpy', 'ray', 'mlflow', 'pydantic', 'yaml', 'torch.distributed.fsdp', 'torch.distributed.tensor'):\n"
        "    sys.modules[blocked] = None\n"
        "import hooks, hooks.fsdp\n"
        "state, hook = hooks.build('quantization_perchannel', chunk_size=8)\n"
        "hooks.fsdp.validate('quantized_allreduce', all_gather='uint8')\n"
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
        assert hooks.wire.wire_bytes("allreduce", 1000, w) == pytest.approx(2 * (w - 1) / w * 1000)
        assert hooks.wire.wire_bytes("allgather", 1000, w) == (w - 1) * 1000
        assert hooks.wire.wire_bytes("all_to_all", 1000, w) == pytest.approx((w - 1) / w * 1000)
    with pytest.raises(ValueError):
        hooks.wire.wire_bytes("broadcast", 1, 2)


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
    assert len(state.flags.counts) == 1
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
        k = math.ceil(0.01 * n)
        assert hooks.cost.hook_wire_bytes("topk", n, w, ratio=0.01) == pytest.approx((w - 1) * 8 * k)
        assert hooks.cost.hook_wire_bytes("randomk", n, w, ratio=0.01) == pytest.approx(ring * 4 * k)
        assert hooks.cost.hook_wire_bytes("signsgd", n, w, chunk_size=c) == pytest.approx(
            (w - 1) * (math.ceil(n / 8) + 4 * math.ceil(n / c)))
        assert hooks.cost.hook_wire_bytes("qsgd", n, w, chunk_size=c) == pytest.approx((w - 1) * (n + 4 * math.ceil(n / c)))
        assert hooks.cost.hook_collectives("randomk", n, w) == [hooks.wire.Collective("allreduce", 4 * k)]  # defaults: ratio 0.01
    # about a quarter of fp32 ring allreduce at every world size, for buckets >> W * chunk_size
    big = 25_000_000 // 4
    for w in (2, 4, 8, 64, 512):
        ratio = hooks.cost.hook_wire_bytes("quantized_allreduce", big, w) / hooks.cost.hook_wire_bytes("allreduce", big, w)
        assert 0.25 < ratio < 0.27, (w, ratio)
    # the allgather quantizers stop paying at W = 8
    assert hooks.cost.hook_wire_bytes("quantization_pertensor", big, 8) > hooks.cost.hook_wire_bytes("allreduce", big, 8)


def test_an_unknown_hook_has_no_collectives():
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


def test_what_a_hook_is_on_the_wire_is_data_on_its_spec():
    specs = hooks.available()
    # a chunk_size parameter names the hook's configurations only if the spec says it is chunked
    assert {n for n, s in specs.items() if "chunk_size" in s.parameters} == {n for n, s in specs.items() if s.chunked}
    assert specs["quantization_perchannel"].chunk_size({}) == 512
    assert specs["qsgd"].chunk_size({"chunk_size": 64}) == 64
    assert specs["quantization_pertensor"].chunk_size({}) is None
    assert sorted(n for n, s in specs.items() if s.wire_bits == 16) == ["bf16_compress", "fp16_compress"]
    with pytest.raises(ValueError, match="chunked but has no 'chunk_size'"):
        dataclasses.replace(specs["allreduce"], chunked=True)
    with pytest.raises(TypeError):  # built with keywords only
        hooks.HookSpec("x", specs["allreduce"].hook, specs["allreduce"].make_state, specs["allreduce"].collectives)
