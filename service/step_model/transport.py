"""What moving bytes through the collectives costs this machine, measured once per sweep
(``transport.json`` on the parent run): per collective kind, a fixed cost per round and a cost
per byte a rank sends, fitted over the world sizes and message sizes the probe ran
(service/train/transport_probe.py).

    transport(kind, n bytes, W, count) = fixed_ms x rounds(kind, W) x count + per_byte_ms x wire_bytes(kind, n, W)

rounds: the ring's (allreduce 2(W-1), allgather and all_to_all W-1); wire_bytes: hooks/wire.py.
Both grow with W as the ring does, so two measured world sizes check the form and one prices
any other. The cost of a collective is a property of the machine and W, not of the hook or the
seed: priced from this fit, a trial's collectives no longer carry the noise of the few steps
it sampled (service/step_model/price.py uses it in place of the trial's own comm when given).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

from hooks.wire import KINDS, rounds, wire_bytes

ARTIFACT = "transport.json"
FORMAT = 1


@dataclass(frozen=True)
class Sample:
    """One probe measurement: the median ms of ``repeats`` collectives of ``kind`` carrying
    ``nbytes`` of payload per rank at ``world_size`` (the slowest rank's)."""

    kind: str
    world_size: int
    nbytes: int
    ms: float
    repeats: int


@dataclass(frozen=True)
class KindFit:
    """One kind's fit: ms = fixed_ms x rounds + per_byte_ms x bytes sent; ``max_rel_error``:
    the worst |fit - sample| / sample over its samples."""

    fixed_ms: float
    per_byte_ms: float
    max_rel_error: float

    def ms(self, kind: str, nbytes: float, world_size: int, count: float = 1.0) -> float:
        if world_size <= 1:
            return 0.0
        return self.fixed_ms * rounds(kind, world_size) * count + self.per_byte_ms * wire_bytes(kind, nbytes, world_size)


@dataclass(frozen=True)
class TransportFit:
    """The machine's transport per kind, with the samples it was fitted from and what they cost."""

    kinds: dict[str, KindFit]
    samples: tuple[Sample, ...]
    probe_s: dict[int, float]   # wall seconds the probe took per world size

    def ms(self, kind: str, nbytes: float, world_size: int, count: float = 1.0) -> float:
        """The transport of ``count`` collectives of ``kind`` carrying ``nbytes`` in all at ``world_size``."""
        if kind not in self.kinds:
            raise KeyError(f"transport.json has no {kind} (measured: {', '.join(sorted(self.kinds))})")
        return self.kinds[kind].ms(kind, nbytes, world_size, count)

    @property
    def world_sizes(self) -> list[int]:
        return sorted({s.world_size for s in self.samples})

    def to_json(self) -> dict:
        return {"format": FORMAT, "kinds": {k: asdict(f) for k, f in self.kinds.items()},
                "samples": [asdict(s) for s in self.samples], "probe_s": {str(w): s for w, s in self.probe_s.items()}}

    @classmethod
    def from_json(cls, data: dict) -> "TransportFit":
        if data.get("format") != FORMAT:
            raise ValueError(f"transport.json format {data.get('format')!r}, this reader reads {FORMAT}")
        return cls({k: KindFit(**f) for k, f in data["kinds"].items()}, tuple(Sample(**s) for s in data["samples"]),
                   {int(w): float(s) for w, s in data["probe_s"].items()})


def fit(samples: list[Sample], probe_s: dict[int, float]) -> TransportFit:
    """Per kind, least squares of ms on (rounds, bytes sent) through the origin, each sample
    weighted by 1/ms (relative error: a small message's fixed cost counts as much as a large
    one's bytes); a negative coefficient is clipped to 0 and the other refitted alone."""
    kinds = {}
    for kind in KINDS:
        mine = [s for s in samples if s.kind == kind and s.world_size > 1]
        if mine:
            kinds[kind] = _fit_kind(kind, mine)
    return TransportFit(kinds, tuple(samples), dict(probe_s))


def _fit_kind(kind: str, samples: list[Sample]) -> KindFit:
    xs = [(rounds(kind, s.world_size) / s.ms, wire_bytes(kind, s.nbytes, s.world_size) / s.ms) for s in samples]
    ys = [1.0] * len(samples)  # ms / ms: each sample's relative error counts alike
    a11 = sum(r * r for r, _ in xs)
    a12 = sum(r * b for r, b in xs)
    a22 = sum(b * b for _, b in xs)
    y1 = sum(r * y for (r, _), y in zip(xs, ys))
    y2 = sum(b * y for (_, b), y in zip(xs, ys))
    det = a11 * a22 - a12 * a12
    fixed, per_byte = ((y1 * a22 - y2 * a12) / det, (a11 * y2 - a12 * y1) / det) if det > 0 else (-1.0, -1.0)
    if fixed < 0 or per_byte < 0:  # one term alone: the one that explains the samples better
        alone = [(y1 / a11, 0.0) if a11 else (0.0, 0.0), (0.0, y2 / a22) if a22 else (0.0, 0.0)]
        fixed, per_byte = min(alone, key=lambda c: _worst(kind, samples, KindFit(c[0], c[1], 0.0)))
    f = KindFit(fixed, per_byte, 0.0)
    return KindFit(fixed, per_byte, _worst(kind, samples, f))


def _worst(kind: str, samples: list[Sample], f: KindFit) -> float:
    return max(abs(f.ms(kind, s.nbytes, s.world_size) - s.ms) / s.ms for s in samples)


def medians(kind: str, world_size: int, nbytes: int, times_ms: list[float]) -> Sample:
    """One :class:`Sample` from a probe's repeated times (the median: one slow repeat is noise)."""
    return Sample(kind, world_size, nbytes, statistics.median(times_ms), len(times_ms))
