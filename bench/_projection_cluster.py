"""bench/projection.py's emulated cluster (``--host-cpus Q``): hosts that own their CPU as well as
their link, and the report's cluster path priced on them.

* every emulated host gets a CPU cgroup of Q cores (service/network/host_cpu.py, made by
  ``netem.Network(..., host_cpus=Q)``), and each rank's whole process (its gloo threads too) joins
  its host's cgroup for the whole world, as service/train/ray_entry.py's rank code does; with
  ``--comm-apart`` (the committed cluster bands) every thread but the rank's own (gloo's) then
  leaves the quota (:func:`threads_apart`): the compute owns the share, and no collective waits on
  a host's quota or takes CPU from its compute, as on a cluster host with cores beside its rank's
  (docs/performance.md, "The step model's error bands");
* the basis is the W = 2 trial on two such hosts over their link, unshaped (``BASIS_ARM``), not on
  shared loopback: the same share per rank as every held-out cell;
* the transport probe (service/train/transport_probe.py) runs on the hosts' group, unshaped, at
  every W of the run; only W = 2's fit prices (the report's cluster cell has the basis sweep's
  probe), the others are kept to set the ring scaling of W = 2's fixed cost against (:func:`ring_check`);
* a held-out cell is priced as the report prices a cluster cell: ``TrialTimeline.price(64, W,
  goodput, latency, W = 2's fit, cores=None)`` (``price.Cell(..., cores=None)``: a core, here a
  share, per rank; ``TransportFit.own_cores`` and the ring's rounds from W = 2's fixed cost);
* each held-out cell is priced a second time with the transport probed on the hosts at its own W
  (:func:`fit_all`: every W's probe in one fit, as ``python -m service.probe --world-size 2 4 8`` on
  the user's cluster writes it and ``report.cluster.transport`` prices with it), its error beside the
  first (``probed_error_pct``): what probing the cluster at the target W buys over the ring scaling.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import asdict

from service.step_model.transport import Sample, TransportFit, fit

BASIS_ARM = "unshaped"  # the cluster basis: the W = 2 hosts' own link, not shaped
BASIS_W = 2


def on_host(host) -> contextlib.AbstractContextManager:
    """This rank's process inside its host's CPU cgroup (nothing without one)."""
    if not getattr(host, "cgroup", ""):
        return contextlib.nullcontext()
    from service.network import host_cpu

    return host_cpu.joined(host.cgroup)


def remove_apart(owner: int) -> None:
    """The comm cgroups of ``owner``'s hosts, removed (their threads ended with the ranks)."""
    from service.network import host_cpu

    host_cpu.remove_where(lambda pid: pid == owner)


def probe_on(group, host: str) -> dict:
    """The sweep's transport probe on the emulated hosts' ``group`` (link unshaped): its samples
    and where they were taken (the ranks' cores: their cgroup's quota; ``host``: this rank's
    namespace, each rank on a host of its own)."""
    from service.train.transport_probe import probe

    samples, where = probe(group=group, host=host)
    return {"samples": [asdict(s) for s in samples], "hosts": asdict(where)}


def fit_at(worlds: dict, w: int) -> TransportFit | None:
    """One world's probe (the cluster mode's ``transport_probe``) as a fit; None if it has none."""
    world = worlds.get(w, worlds.get(str(w))) or {}
    probed = world.get("transport_probe")
    if not probed:
        return None
    return fit([Sample(**s) for s in probed["samples"]], {})


def fit_all(worlds: dict) -> TransportFit | None:
    """Every world's probe on the hosts as one fit (one per probed W, as transport.json keeps
    them); None if no world has one."""
    samples = [Sample(**s) for w in worlds.values() for s in (w.get("transport_probe") or {}).get("samples", [])]
    return fit(samples, {}) if samples else None


def ring_check(worlds: dict) -> list[dict]:
    """Per probed W above the basis and kind: the probe's own fit at W against W = 2's fit scaled
    to W as the report scales it (fixed cost x the ring's rounds, the same cost per byte), and
    both at 64 KiB and 1 MiB per rank (the sizes of a compressed and a full bucket)."""
    base = fit_at(worlds, BASIS_W)
    out = []
    if base is None:
        return out
    for w in sorted(int(k) for k in worlds if int(k) > BASIS_W):
        own = fit_at(worlds, w)
        if own is None:
            continue
        for kind, fits in own.kinds.items():
            f = fits[0]
            scaled = base.kinds[kind][0]
            row = {"world_size": w, "kind": kind, "fixed_ms": f.fixed_ms,
                   "ring_fixed_ms": scaled.ms(kind, 0.0, w), "per_mb_ms": f.per_byte_ms * 1e6,
                   "basis_per_mb_ms": scaled.per_byte_ms * 1e6}
            for label, nbytes in (("64k", 64 << 10), ("1m", 1 << 20)):
                row[f"probe_{label}_ms"], row[f"ring_{label}_ms"] = f.ms(kind, nbytes, w), scaled.ms(kind, nbytes, w)
            out.append(row)
    return out


def print_ring_check(rows: list[dict], table) -> None:
    if not rows:
        return
    print("\nthe probe at W on the hosts against W = 2's fit scaled by the ring (what a cluster cell is priced with):")
    print(table(["W", "kind", "fixed ms (probe)", "fixed ms (W=2 x rounds)", "ms/MB sent (probe)", "ms/MB (W=2)",
                 "64 KiB: probe / ring ms", "1 MiB: probe / ring ms"],
                [[r["world_size"], r["kind"], round(r["fixed_ms"], 3), round(r["ring_fixed_ms"], 3),
                  round(r["per_mb_ms"], 3), round(r["basis_per_mb_ms"], 3),
                  f"{r['probe_64k_ms']:.2f} / {r['ring_64k_ms']:.2f}", f"{r['probe_1m_ms']:.2f} / {r['ring_1m_ms']:.2f}"]
                 for r in rows]))


def preflight(host_cpus: float, world_sizes: list[int]) -> str | None:
    """Why the emulated cluster cannot run here (one line), or None: W = 2 must be among the
    world sizes (it is the basis) and the largest W's hosts must fit in the cores with headroom."""
    if BASIS_W not in world_sizes:
        return f"--host-cpus needs W = {BASIS_W} among --world-sizes (the basis is trained there)"
    from service.network import host_cpu

    try:
        host_cpu.preflight(host_cpus, max(world_sizes))
    except host_cpu.HostCpuError as exc:
        return str(exc)
    return None
