"""hooks.quantize backends: the fused C kernels (hooks/_native.py) against the pure-torch path.

Both backends are run explicitly on awkward sizes and values and must give bit-identical codes,
meta and dequantized values; the fallback to torch is exercised for real (no compiler, a failing
compiler, HOOKS_NATIVE_KERNELS=0), and the quantizing hooks give identical results on real gloo
groups with either backend."""
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from hooks import _native
from hooks import quantize as q
from tests.dist_utils import run_distributed

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = ("native", "torch")


def _both(x: torch.Tensor, chunk: int):
    got = {}
    for backend in BACKENDS:
        codes, meta = q.quantize(x, chunk, backend=backend)
        back = q.dequantize(codes, meta, chunk, backend=backend)
        got[backend] = (codes, meta, back)
    return got


def _assert_identical(x: torch.Tensor, chunk: int):
    got = _both(x, chunk)
    (c1, m1, b1), (c2, m2, b2) = got["native"], got["torch"]
    assert torch.equal(m1, m2), (m1, m2)
    assert torch.equal(c1, c2), (c1 != c2).nonzero()[:5]
    assert torch.equal(b1, b2)
    return c1, m1, b1


def _within_half_a_step(x, meta, back, chunk):
    for k in range(meta.shape[0]):
        part = x[k * chunk : (k + 1) * chunk].double()
        err = (back[k * chunk : (k + 1) * chunk].double() - part).abs()
        assert bool((err <= 0.5 * meta[k, 1].double() * (1 + 1e-5) + 1e-6 * part.abs().max()).all()), k


def test_the_native_backend_is_taken_when_a_compiler_is_present():
    assert q.kernel_backend() == "native", q.native_unavailable_reason()
    assert q.native_unavailable_reason() is None


@pytest.mark.parametrize(
    "n, chunk",
    [(1, 512), (2, 512), (511, 512), (512, 512), (513, 512), (5037, 64), (7, 3), (15, 16), (17, 16), (100_003, 512), (70_001, 70_001), (70_001, 10**9)],
)
def test_backends_agree_bit_for_bit_on_awkward_sizes(n, chunk):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g) * 3
    codes, meta, back = _assert_identical(x, chunk)
    assert codes.shape == (n,) and meta.shape == (q.num_chunks(n, chunk), 2)
    _within_half_a_step(x, meta, back, chunk)


@pytest.mark.parametrize("n, chunk", [(3_000_001, 512), (2_097_152, 2_097_152), (2_500_000, 1000)])
def test_backends_agree_on_large_buckets_streamed_out(n, chunk):
    """Buckets of 8 MB and more write codes and dequantized values with non-temporal stores
    (also at unaligned starts); the values are the same, and within half a step."""
    x = torch.randn(n, generator=torch.Generator().manual_seed(n))
    codes, meta, back = _assert_identical(x, chunk)
    step = meta[:, 1].repeat_interleave(chunk)[:n]
    assert bool(((back - x).abs() <= 0.5 * step * (1 + 1e-5) + 1e-6 * x.abs().max()).all())
    offset = torch.empty(n + 3)[3:]  # a float output whose start is not 16-byte aligned
    q.dequantize(codes, meta, chunk, out=offset, backend="native")
    assert torch.equal(offset, back)
    codes_at_5 = torch.empty(n + 5, dtype=torch.uint8)[5:]  # nor are these codes
    q.quantize(x, chunk, codes=codes_at_5, backend="native")
    assert torch.equal(codes_at_5, codes)


@pytest.mark.parametrize("offset, scale", [(50.0, 1.0), (1e4, 1e-3), (-3e5, 1.0), (0.0, 1e-30), (1.0, 1e-7)])
def test_chunks_far_from_zero_keep_their_resolution(offset, scale):
    """x - lo is taken before scaling, so |lo| >> max - min costs no resolution."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4096, generator=g) * scale + offset
    _, meta, back = _assert_identical(x, 512)
    _within_half_a_step(x, meta, back, 512)


def test_constant_zero_and_single_element_chunks_are_exact():
    x = torch.cat([torch.zeros(64), torch.full((64,), -2.5), torch.full((64,), 7e37), torch.tensor([3.25])])
    codes, meta, back = _assert_identical(x, 64)
    assert torch.equal(back, x)
    assert bool((codes == 0).all()) and bool((meta[:, 1] == 0).all())


def test_huge_values_stay_finite_and_in_range():
    big = torch.finfo(torch.float32).max
    x = torch.linspace(-1.0, 1.0, 1000) * (0.9 * big)  # max - min overflows float32
    x[500:] = torch.linspace(-1.0, 1.0, 500) * 1e38  # a second, non-overflowing chunk
    codes, meta, back = _assert_identical(x, 500)
    assert bool(torch.isfinite(meta).all())
    assert int(codes[:500].max()) == 255 and int(codes[:500].min()) == 0
    # the overflowing chunk: finite wherever q * step fits in float32, within half a step there
    fits = back[:500].isfinite()
    assert bool(fits[:250].all())
    err = (back[:500][fits].double() - x[:500][fits].double()).abs()
    assert bool((err <= 0.5 * meta[0, 1].double() * (1 + 1e-5)).all())
    _within_half_a_step(x[500:], meta[1:], back[500:], 500)


def test_subnormal_ranges_are_stored_as_constant_chunks():
    tiny = torch.finfo(torch.float32).tiny
    x = torch.tensor([0.0, tiny, 2 * tiny, 3 * tiny])  # step would be subnormal
    codes, meta, back = _assert_identical(x, 4)
    assert bool((codes == 0).all()) and meta[0, 1] < tiny
    assert float((back - x).abs().max()) <= 3 * tiny


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nonfinite_inputs_poison_exactly_their_own_chunk(bad):
    x = torch.randn(4 * 64 + 5)
    x[70] = bad  # chunk 1
    x[-1] = bad  # the short last chunk
    got = _both(x, 64)
    for backend in BACKENDS:
        codes, meta, back = got[backend]
        per_chunk_finite = torch.isfinite(meta).all(dim=1)
        assert per_chunk_finite.tolist() == [True, False, True, True, False], backend
        assert not bool(back[64:128].isfinite().any()) and not bool(back[-5:].isfinite().any())
        assert bool(back[:64].isfinite().all()) and bool(back[128:256].isfinite().all())
    (c1, m1, b1), (c2, m2, b2) = got["native"], got["torch"]
    torch.testing.assert_close(m1, m2, rtol=0, atol=0, equal_nan=True)
    ok = torch.isfinite(m1).all(dim=1).repeat_interleave(64)[: x.numel()]
    assert torch.equal(c1[ok], c2[ok])  # codes of non-finite chunks are unspecified
    torch.testing.assert_close(b1, b2, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dequantize_into_and_accumulate(backend):
    x = torch.randn(1000)
    codes, meta = q.quantize(x, 64, backend=backend)
    plain = q.dequantize(codes, meta, 64, backend=backend)
    out = torch.full((1000,), 0.25)
    assert q.dequantize(codes, meta, 64, out=out, accumulate=True, backend=backend) is out
    assert torch.equal(out, plain + 0.25)
    q.dequantize(codes, meta, 64, out=out, backend=backend)
    assert torch.equal(out, plain)


def test_non_contiguous_and_float64_inputs_are_read_as_flat_float32():
    x = torch.randn(64, 30).t()  # not contiguous
    ref = x.contiguous().reshape(-1)
    for backend in BACKENDS:
        c1, m1 = q.quantize(x, 100, backend=backend)
        c2, m2 = q.quantize(ref, 100, backend=backend)
        assert torch.equal(c1, c2) and torch.equal(m1, m2)
        c3, m3 = q.quantize(ref.double(), 100, backend=backend)
        assert torch.equal(c3, c2) and torch.equal(m3, m2)


# ------------------------------------------------------------------ fallback and the cache
def _probe(env: dict) -> str:
    code = (
        "import torch, hooks\n"
        "from hooks import quantize as q\n"
        "state, hook = hooks.build('quantization_perchannel', chunk_size=8)\n"
        "c, m = q.quantize(torch.arange(768.0), 256)\n"
        "assert torch.equal(q.dequantize(c, m, 256), torch.arange(768.0))  # step 1: exact\n"
        "print(q.kernel_backend(), '|', q.native_unavailable_reason())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env={**os.environ, **env}, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_env_switch_turns_the_native_kernels_off():
    assert _probe({"HOOKS_NATIVE_KERNELS": "0"}) == "torch | HOOKS_NATIVE_KERNELS=0"


def test_without_a_compiler_the_torch_path_runs(tmp_path):
    out = _probe({"HOOKS_KERNEL_CACHE": str(tmp_path / "cache"), "CC": "no-such-cc", "PATH": str(tmp_path)})
    assert out.startswith("torch | RuntimeError: no C compiler"), out


def test_a_failing_compiler_falls_back_to_torch(tmp_path):
    cc = tmp_path / "broken-cc"
    cc.write_text("#!/bin/sh\necho 'broken-cc: cannot compile' >&2\nexit 1\n")
    cc.chmod(0o755)
    out = _probe({"HOOKS_KERNEL_CACHE": str(tmp_path / "cache"), "CC": str(cc)})
    assert out.startswith("torch | RuntimeError:") and "cannot compile" in out, out
    assert [p.name for p in (tmp_path / "cache").iterdir()] == []  # no partial library left


def test_asking_for_native_when_unavailable_raises(monkeypatch):
    monkeypatch.setenv("HOOKS_NATIVE_KERNELS", "0")
    with pytest.raises(RuntimeError, match="HOOKS_NATIVE_KERNELS=0"):
        q.quantize(torch.ones(4), 2, backend="native")
    assert q.kernel_backend() == "torch"
    codes, meta = q.quantize(torch.ones(4), 2)  # the default quietly takes the torch path
    assert torch.equal(q.dequantize(codes, meta, 2), torch.ones(4))


def test_concurrent_builds_publish_one_complete_library(tmp_path):
    paths, errors = [], []

    def build():
        try:
            paths.append(_native.build(tmp_path))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=build) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(paths)) == 1
    assert [p.name for p in tmp_path.iterdir()] == [paths[0].name]  # temp build dirs cleaned up
    lib = _native._load(paths[0])  # loadable, with both entry points
    assert lib.hooks_quantize_f32 and lib.hooks_dequantize_f32
    assert _native.build(tmp_path) == paths[0]  # cached: keyed by the source hash


# ------------------------------------------------------------------ hooks on real gloo groups
def _hooks_on_both_backends(rank: int, w: int) -> None:
    import hooks
    from tests.hooks_checks import Bucket

    g = torch.Generator().manual_seed(rank)
    for name, params, n in [
        ("quantization_perchannel", {"chunk_size": 64}, 1000),
        ("quantization_perchannel", {"chunk_size": 512}, 5),
        ("quantization_pertensor", {}, 777),
        ("quantized_allreduce", {"chunk_size": 64}, 1000),
        ("quantized_allreduce", {"chunk_size": 8}, 3),
    ]:
        x = torch.randn(n, generator=g)
        results = {}
        for backend in BACKENDS:
            os.environ["HOOKS_NATIVE_KERNELS"] = "1" if backend == "native" else "0"
            assert q.kernel_backend() == backend
            state, hook = hooks.build(name, **params)
            results[backend] = hook(state, Bucket(x.clone())).wait().clone()
        os.environ.pop("HOOKS_NATIVE_KERNELS")
        assert torch.equal(results["native"], results["torch"]), (name, params, n)


@pytest.mark.timeout(600)
def test_quantizing_hooks_give_identical_results_on_either_backend():
    run_distributed(_hooks_on_both_backends, world_size=2)
