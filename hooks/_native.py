"""The fused CPU kernels behind hooks.quantize and hooks.finite: a small C file, compiled once,
called through ctypes.

What they do: per chunk, one pass that keeps the chunk in L1 (min/max, then the uint8 codes);
one fused dequantize(-and-accumulate) pass; an exact NaN/inf test over many arrays in one call;
allreduce's divide by W that answers the NaN/inf test on the way. Why C through ctypes rather
than eager torch (a memory pass per op), ``torch.utils.cpp_extension.load_inline`` (compiles
against the torch headers in every fresh Ray worker image, needs ninja) or ``torch.compile``
(compile latency in every Ray worker process), and what each costs: docs/hooks.md
("Benchmark") and docs/performance.md ("Instrumentation").

Plain C99 with portable flags only (``-O3``: SSE2 on x86-64, no ``-march=native``, since the
image and CI machines differ), compiled by the system ``cc``. The library is cached under
``$HOOKS_KERNEL_CACHE`` or ``$XDG_CACHE_HOME/commhooks-kernels`` (default
``~/.cache/commhooks-kernels``), named by a hash of the source, flags and compiler, and
published with an atomic rename so concurrent Ray workers never load a half-written file.
``ctypes.CDLL`` calls release the GIL. ``HOOKS_NATIVE_KERNELS=0`` turns the native path off.

The kernels compute the per-chunk scalars and the codes with the same float32 operations, in
the same order, as the torch path in hooks.quantize (``-ffp-contract=off``: no fused
multiply-adds), so both give bit-identical codes and meta (tests/test_quantize_kernels.py);
the divide is IEEE division, as torch's ``div_``.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

C_SOURCE = r"""
#include <stdint.h>
#include <string.h>
#include <float.h>
#include <math.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

/* min and max of x[0..n), and whether any element is NaN (n >= 1).
   lo/hi follow torch.aminmax: NaN anywhere makes both NaN. */
static void chunk_minmax(const float *x, int64_t n, float *lo_out, float *hi_out) {
    int64_t i = 0;
    float lo = x[0], hi = x[0];
    int nan = 0;
#ifdef __SSE2__
    if (n >= 16) {
        __m128 mn0 = _mm_loadu_ps(x), mn1 = mn0, mn2 = mn0, mn3 = mn0;
        __m128 mx0 = mn0, mx1 = mn0, mx2 = mn0, mx3 = mn0;
        __m128 bad = _mm_setzero_ps();
        for (; i + 16 <= n; i += 16) {
            __m128 a = _mm_loadu_ps(x + i), b = _mm_loadu_ps(x + i + 4);
            __m128 c = _mm_loadu_ps(x + i + 8), d = _mm_loadu_ps(x + i + 12);
            mn0 = _mm_min_ps(mn0, a); mx0 = _mm_max_ps(mx0, a);
            mn1 = _mm_min_ps(mn1, b); mx1 = _mm_max_ps(mx1, b);
            mn2 = _mm_min_ps(mn2, c); mx2 = _mm_max_ps(mx2, c);
            mn3 = _mm_min_ps(mn3, d); mx3 = _mm_max_ps(mx3, d);
            /* unordered: a NaN in either operand */
            bad = _mm_or_ps(bad, _mm_or_ps(_mm_cmpunord_ps(a, b), _mm_cmpunord_ps(c, d)));
        }
        float m[4], M[4];
        _mm_storeu_ps(m, _mm_min_ps(_mm_min_ps(mn0, mn1), _mm_min_ps(mn2, mn3)));
        _mm_storeu_ps(M, _mm_max_ps(_mm_max_ps(mx0, mx1), _mm_max_ps(mx2, mx3)));
        nan = _mm_movemask_ps(bad) != 0;
        lo = m[0]; hi = M[0];
        for (int k = 1; k < 4; k++) { if (m[k] < lo) lo = m[k]; if (M[k] > hi) hi = M[k]; }
    }
#endif
    for (; i < n; i++) {
        float v = x[i];
        if (v != v) nan = 1;
        if (v < lo) lo = v;
        if (v > hi) hi = v;
    }
    if (nan || lo != lo || hi != hi) { lo = NAN; hi = NAN; }
    *lo_out = lo; *hi_out = hi;
}

/* NaN/inf tests: x - x is +0 for every finite x and NaN for NaN and +-inf, and NaN + anything
   is NaN, so an accumulator of x - x stays 0 exactly when every element is finite. */
static int any_nonfinite(const float *x, int64_t n) {
    int64_t i = 0;
    float acc = 0.0f;
#ifdef __SSE2__
    __m128 a0 = _mm_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (; i + 16 <= n; i += 16) {
        __m128 a = _mm_loadu_ps(x + i), b = _mm_loadu_ps(x + i + 4);
        __m128 c = _mm_loadu_ps(x + i + 8), d = _mm_loadu_ps(x + i + 12);
        a0 = _mm_add_ps(a0, _mm_sub_ps(a, a)); a1 = _mm_add_ps(a1, _mm_sub_ps(b, b));
        a2 = _mm_add_ps(a2, _mm_sub_ps(c, c)); a3 = _mm_add_ps(a3, _mm_sub_ps(d, d));
    }
    __m128 t = _mm_add_ps(_mm_add_ps(a0, a1), _mm_add_ps(a2, a3));
    if (_mm_movemask_ps(_mm_cmpunord_ps(t, t))) return 1;
#endif
    for (; i < n; i++) acc += x[i] - x[i];
    return acc != acc;
}

/* Does any of the k float32 arrays xs[j][0..ns[j]) hold NaN or +-inf? */
int hooks_any_nonfinite_f32(const float *const *xs, const int64_t *ns, int64_t k) {
    for (int64_t j = 0; j < k; j++)
        if (any_nonfinite(xs[j], ns[j])) return 1;
    return 0;
}

/* x[i] = x[i] / w in place (IEEE division, as torch's div_), and whether any x[i] was NaN or
   +-inf: for a finite w >= 1 the quotient is non-finite exactly when x[i] is. One pass. */
int hooks_div_nonfinite_f32(float *x, int64_t n, float w) {
    int64_t i = 0;
    float acc = 0.0f;
    int bad = 0;
#ifdef __SSE2__
    const __m128 vw = _mm_set1_ps(w);
    __m128 a0 = _mm_setzero_ps(), a1 = a0;
    for (; i + 8 <= n; i += 8) {
        __m128 a = _mm_div_ps(_mm_loadu_ps(x + i), vw), b = _mm_div_ps(_mm_loadu_ps(x + i + 4), vw);
        _mm_storeu_ps(x + i, a); _mm_storeu_ps(x + i + 4, b);
        a0 = _mm_add_ps(a0, _mm_sub_ps(a, a)); a1 = _mm_add_ps(a1, _mm_sub_ps(b, b));
    }
    __m128 t = _mm_add_ps(a0, a1);
    bad = _mm_movemask_ps(_mm_cmpunord_ps(t, t)) != 0;
#endif
    for (; i < n; i++) { float v = x[i] / w; x[i] = v; acc += v - v; }
    return bad || acc != acc;
}

/* Outputs of buckets at least this long (floats; 8 MB) are written with streaming stores. */
#define STREAM_MIN_FLOATS (2 << 20)

#ifdef __SSE2__
/* The h == 1 codes loop below with non-temporal 16-byte stores (no read-for-ownership of the
   codes buffer). Values lie in [0.5, 255.5] here, where the saturating packs equal the cast. */
static void codes_stream(const float *xc, uint8_t *qc, int64_t len, float nlo, float inv) {
    int64_t i = 0;
    for (; i < len && ((uintptr_t)(qc + i) & 15); i++) qc[i] = (uint8_t)(int32_t)((xc[i] + nlo) * inv + 0.5f);
    const __m128 vn = _mm_set1_ps(nlo), vi = _mm_set1_ps(inv), half = _mm_set1_ps(0.5f);
    for (; i + 16 <= len; i += 16) {
        __m128i a = _mm_cvttps_epi32(_mm_add_ps(_mm_mul_ps(_mm_add_ps(_mm_loadu_ps(xc + i), vn), vi), half));
        __m128i b = _mm_cvttps_epi32(_mm_add_ps(_mm_mul_ps(_mm_add_ps(_mm_loadu_ps(xc + i + 4), vn), vi), half));
        __m128i c = _mm_cvttps_epi32(_mm_add_ps(_mm_mul_ps(_mm_add_ps(_mm_loadu_ps(xc + i + 8), vn), vi), half));
        __m128i d = _mm_cvttps_epi32(_mm_add_ps(_mm_mul_ps(_mm_add_ps(_mm_loadu_ps(xc + i + 12), vn), vi), half));
        _mm_stream_si128((__m128i *)(qc + i), _mm_packus_epi16(_mm_packs_epi32(a, b), _mm_packs_epi32(c, d)));
    }
    for (; i < len; i++) qc[i] = (uint8_t)(int32_t)((xc[i] + nlo) * inv + 0.5f);
}
#endif

/* Per chunk of `chunk` floats (the last may be shorter): meta[2k] = lo, meta[2k+1] = step,
   codes = trunc((x*h - lo*h) * inv_h + 0.5) with h = 1, or 0.5 where max - min overflows float32.
   Mirrors hooks.quantize._quantize_torch operation by operation. */
void hooks_quantize_f32(const float *x, int64_t n, int64_t chunk, uint8_t *codes, float *meta) {
#ifdef __SSE2__
    int stream = n >= STREAM_MIN_FLOATS;
#else
    int stream = 0;
#endif
    for (int64_t start = 0, k = 0; start < n; start += chunk, k++) {
        int64_t len = n - start < chunk ? n - start : chunk;
        const float *xc = x + start;
        uint8_t *qc = codes + start;
        float lo, hi;
        chunk_minmax(xc, len, &lo, &hi);
        float d = hi - lo;
        int overflow = isinf(d);
        float h = overflow ? 0.5f : 1.0f;
        float step = overflow ? hi / 255.0f - lo / 255.0f : d / 255.0f;
        meta[2 * k] = lo;
        meta[2 * k + 1] = step;
        /* step below FLT_MIN (subnormal, 0) or non-finite: no codes to speak of */
        if (!(step >= FLT_MIN && step <= FLT_MAX)) {
            memset(qc, 0, (size_t)len);
            continue;
        }
        float inv_h = (1.0f / step) / h;
        float nlo_h = -lo * h;
        if (overflow) {
            for (int64_t i = 0; i < len; i++) {
                float t = xc[i] * h + nlo_h;
                float v = t * inv_h + 0.5f;
                qc[i] = (uint8_t)(int32_t)v;
            }
        } else if (stream) {
            codes_stream(xc, qc, len, nlo_h, inv_h);
        } else { /* h == 1: x * h is x, one multiply less per element */
            for (int64_t i = 0; i < len; i++) {
                float v = (xc[i] + nlo_h) * inv_h + 0.5f;
                qc[i] = (uint8_t)(int32_t)v;
            }
        }
    }
#ifdef __SSE2__
    if (stream) _mm_sfence();
#endif
}

#ifdef __SSE2__
/* oc[i] = lo + qc[i] * step with non-temporal stores: a large output is not read first (no
   read-for-ownership), as memcpy does for large copies. Same mul-then-add as the loop below. */
static void dequantize_stream(const uint8_t *qc, float *oc, int64_t len, float lo, float step) {
    int64_t i = 0;
    for (; i < len && ((uintptr_t)(oc + i) & 15); i++) oc[i] = lo + (float)qc[i] * step;
    const __m128 vlo = _mm_set1_ps(lo), vs = _mm_set1_ps(step);
    const __m128i z = _mm_setzero_si128();
    for (; i + 16 <= len; i += 16) {
        __m128i b = _mm_loadu_si128((const __m128i *)(qc + i));
        __m128i w0 = _mm_unpacklo_epi8(b, z), w1 = _mm_unpackhi_epi8(b, z);
        __m128 f0 = _mm_cvtepi32_ps(_mm_unpacklo_epi16(w0, z));
        __m128 f1 = _mm_cvtepi32_ps(_mm_unpackhi_epi16(w0, z));
        __m128 f2 = _mm_cvtepi32_ps(_mm_unpacklo_epi16(w1, z));
        __m128 f3 = _mm_cvtepi32_ps(_mm_unpackhi_epi16(w1, z));
        _mm_stream_ps(oc + i, _mm_add_ps(vlo, _mm_mul_ps(f0, vs)));
        _mm_stream_ps(oc + i + 4, _mm_add_ps(vlo, _mm_mul_ps(f1, vs)));
        _mm_stream_ps(oc + i + 8, _mm_add_ps(vlo, _mm_mul_ps(f2, vs)));
        _mm_stream_ps(oc + i + 12, _mm_add_ps(vlo, _mm_mul_ps(f3, vs)));
    }
    for (; i < len; i++) oc[i] = lo + (float)qc[i] * step;
}
#endif

/* out[i] (+)= lo + code * step over n codes in chunks of `chunk`. */
void hooks_dequantize_f32(const uint8_t *codes, const float *meta, int64_t n, int64_t chunk,
                          float *out, int accumulate) {
#ifdef __SSE2__
    if (!accumulate && n >= STREAM_MIN_FLOATS) {
        for (int64_t start = 0, k = 0; start < n; start += chunk, k++) {
            int64_t len = n - start < chunk ? n - start : chunk;
            dequantize_stream(codes + start, out + start, len, meta[2 * k], meta[2 * k + 1]);
        }
        _mm_sfence();
        return;
    }
#endif
    for (int64_t start = 0, k = 0; start < n; start += chunk, k++) {
        int64_t len = n - start < chunk ? n - start : chunk;
        const uint8_t *qc = codes + start;
        float *oc = out + start;
        float lo = meta[2 * k], step = meta[2 * k + 1];
        if (accumulate) {
            for (int64_t i = 0; i < len; i++) oc[i] += lo + (float)qc[i] * step;
        } else {
            for (int64_t i = 0; i < len; i++) oc[i] = lo + (float)qc[i] * step;
        }
    }
}
"""

# Portable: no -march=native (the Docker image and CI machines may differ); no FMA contraction,
# so the float32 results match the torch path bit for bit.
CFLAGS = ["-O3", "-std=c99", "-fPIC", "-shared", "-ffp-contract=off", "-fno-math-errno"]

_lock = threading.Lock()
_lib = None  # ctypes.CDLL once loaded
_unavailable: str | None = None  # why the native kernels are not used (None: not tried yet or loaded)


def enabled_by_env() -> bool:
    return os.environ.get("HOOKS_NATIVE_KERNELS", "1").strip().lower() not in ("0", "false", "no", "off")


def cache_dir() -> Path:
    if os.environ.get("HOOKS_KERNEL_CACHE"):
        return Path(os.environ["HOOKS_KERNEL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "commhooks-kernels"


def _compiler() -> str | None:
    cc = os.environ.get("CC", "cc")
    return shutil.which(cc) or shutil.which("gcc") or shutil.which("clang")


def build(directory: Path | None = None) -> Path:
    """Compile the kernels (if this source/flags/compiler has no cached library yet); its path.

    Raises RuntimeError (with the compiler's message) when there is no compiler or it fails."""
    cc = _compiler()
    if cc is None:
        raise RuntimeError("no C compiler (cc, gcc or clang) on PATH")
    key = hashlib.sha256("\0".join([C_SOURCE, " ".join(CFLAGS), os.path.realpath(cc), os.uname().machine]).encode()).hexdigest()[:16]
    directory = Path(directory or cache_dir())
    target = directory / f"hooks_kernels_{key}.so"
    if target.exists():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    # Build in a private temp dir next to the target, then rename: concurrent workers each
    # build their own copy and the last rename wins; nobody sees a partial file.
    with tempfile.TemporaryDirectory(dir=directory, prefix=".build-") as tmp:
        src = Path(tmp) / "hooks_kernels.c"
        src.write_text(C_SOURCE)
        out = Path(tmp) / "hooks_kernels.so"
        proc = subprocess.run([cc, *CFLAGS, str(src), "-o", str(out)], capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"{cc} failed: {proc.stderr.strip()[:500]}")
        os.replace(out, target)
    return target


def _load(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.hooks_quantize_f32.argtypes = [ptr, i64, i64, ptr, ptr]
    lib.hooks_quantize_f32.restype = None
    lib.hooks_dequantize_f32.argtypes = [ptr, ptr, i64, i64, ptr, ctypes.c_int]
    lib.hooks_dequantize_f32.restype = None
    lib.hooks_any_nonfinite_f32.argtypes = [ptr, ptr, i64]
    lib.hooks_any_nonfinite_f32.restype = ctypes.c_int
    lib.hooks_div_nonfinite_f32.argtypes = [ptr, i64, ctypes.c_float]
    lib.hooks_div_nonfinite_f32.restype = ctypes.c_int
    return lib


def library():
    """The loaded kernels, or None (then :func:`unavailable_reason` says why). Builds on first use."""
    global _lib, _unavailable
    if not enabled_by_env():
        return None
    if _lib is not None or _unavailable is not None:
        return _lib
    with _lock:
        if _lib is None and _unavailable is None:
            try:
                try:
                    path = build()
                except OSError:  # e.g. a read-only home in a container: a per-user temp dir
                    path = build(Path(tempfile.gettempdir()) / f"commhooks-kernels-{os.getuid()}")
                _lib = _load(path)
            except Exception as e:  # no compiler, read-only cache, foreign architecture...
                _unavailable = f"{type(e).__name__}: {e}"
    return _lib


def unavailable_reason() -> str | None:
    if not enabled_by_env():
        return "HOOKS_NATIVE_KERNELS=0"
    library()
    return _unavailable
