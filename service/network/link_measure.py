"""What an emulated link really delivers: a short timed gloo exchange between two of its hosts.

``measure(link_gbps, latency_ms)`` builds a two-host :class:`service.network.netem.Network` shaped as
asked, starts one process per host (each enters its host's namespace and joins a two-rank
gloo group whose store and connections run over the link), and times

* bandwidth: an allreduce of ``nbytes`` (what DDP's gradients cross the link as): each host
  sends nbytes (two ring steps of nbytes/2) while receiving as much; achieved Gbit/s = bits
  sent per host / the slower host's time, median of ``repeats``. (A simultaneous gloo
  isend/irecv pair measured half of that here: gloo's point-to-point ops on one pair do not
  overlap, the ring's do.)
  This is *goodput*: tbf charges whole Ethernet frames, so a 1 Gbit/s link carries at most
  ~0.956 Gbit/s of TCP payload at a 1500-byte MTU;
* latency: one-way, half the shortest of 21 round trips of a 4-byte ping-pong (the link's
  own latency; longer trips are the 2 shared cores scheduling the processes late).

:func:`time_group` is that timing (which ``measure`` runs) on any group of W emulated hosts,
every host sending at once: the aggregate a W-host cell really gets (bench/projection.py).

The sweep measures every link setting before its first trial and refuses a link that delivers
less than :data:`MIN_FRACTION` of the asked rate (the machine's CPUs, not the shaping, are
then the limit, and every figure of the trial would be about them) after waiting and measuring
again a bounded number of times (a busy moment passes; a too-small machine does not).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import statistics
import time
from dataclasses import dataclass

from service.network import netem

MIN_FRACTION = 0.8
DEFAULT_BYTES = 16 * 2**20
TIMEOUT_S = 120.0


@dataclass(frozen=True)
class LinkMeasurement:
    link_gbps: float  # asked
    latency_ms: float  # asked (added delay)
    measured_gbps: float  # achieved payload rate, per direction
    measured_latency_ms: float  # one-way

    @property
    def fraction(self) -> float:
        return self.measured_gbps / self.link_gbps if self.link_gbps else 1.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, host: netem.Host, master: str, port: int, nbytes: int, repeats: int, queue) -> None:
    """One host's side (a fresh process: it may enter the namespace for good)."""
    try:
        # c10d warns that a namespace has no resolvable hostname: true, and nothing to act on
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
        import torch.distributed as dist

        with netem.entered(host.namespace):
            os.environ["GLOO_SOCKET_IFNAME"] = host.ifname
            dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=rank, world_size=2)
            gbps, latency_ms = time_group(None, rank, 2, nbytes, repeats)
            dist.destroy_process_group()
        queue.put((rank, gbps, latency_ms, None))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent as one line
        queue.put((rank, 0.0, 0.0, f"{type(exc).__name__}: {' '.join(str(exc).split())}"))


def time_group(group, rank: int, world_size: int, nbytes: int = DEFAULT_BYTES, repeats: int = 3) -> tuple[float, float]:
    """Collective (every rank of ``group`` calls it): what the links carry with all ``world_size``
    hosts sending at once. (Gbit/s each host sends, one-way latency ms between ranks 0 and 1.)

    Bandwidth: a ring allreduce of ``nbytes``, where every host sends 2(W-1)/W x nbytes to its
    ring neighbour while receiving as much, all hosts at once; Gbit/s = bits a host sent / the
    slowest host's time, median of ``repeats`` after one warm-up round (TCP slow start). At W = 2
    this is the module doc's measurement; at larger W it is the aggregate: whether this
    machine's CPUs carry W hosts at the rate together. Latency: as in the module doc, measured
    first (after the bulk transfer the bucket and the queues are still refilling)."""
    import torch
    import torch.distributed as dist

    send, ping, rtts, bandwidth = torch.zeros(nbytes // 4), torch.zeros(1), [], []
    dist.barrier(group=group)
    for _ in range(21):
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(ping, 1, group=group)
            dist.recv(ping, 1, group=group)
        elif rank == 1:
            dist.recv(ping, 0, group=group)
            dist.send(ping, 0, group=group)
        rtts.append(time.perf_counter() - t0)
    sent_bits = 2 * (world_size - 1) / world_size * nbytes * 8  # a ring allreduce's bytes per host
    for i in range(repeats + 1):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        dist.all_reduce(send, group=group)
        slowest = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
        if i:
            bandwidth.append(sent_bits / slowest.item() / 1e9)
    latency = torch.tensor([min(rtts) / 2 * 1000.0 if rank < 2 else 0.0], dtype=torch.float64)
    dist.all_reduce(latency, group=group)  # every rank returns the mean of ranks 0 and 1's
    return statistics.median(bandwidth), latency.item() / 2


def measure(link_gbps: float, latency_ms: float = 0.0, *, nbytes: int | None = None,
            repeats: int = 3, owner_pid: int | None = None) -> LinkMeasurement:
    """Build a two-host network shaped as asked, time it (module docstring), remove it."""
    # enough bytes that the bucket's burst and the slow start are a small part of the time
    nbytes = nbytes or max(DEFAULT_BYTES, int(link_gbps * 1e9 / 8 * 0.1) if link_gbps else DEFAULT_BYTES)
    ctx = mp.get_context("spawn")
    with netem.Network(2, link_gbps, latency_ms, owner_pid=owner_pid) as net:
        net.check_connected()  # a blocked bridge: say why now, not after TIMEOUT_S
        queue = ctx.Queue()
        port = _free_port()
        procs = [ctx.Process(target=_rank_main, args=(r, net.hosts[r], net.hosts[0].address, port, nbytes,
                                                      repeats, queue), daemon=True) for r in range(2)]
        for p in procs:
            p.start()
        results, deadline = {}, time.monotonic() + TIMEOUT_S
        try:
            while len(results) < 2:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise netem.NetemError(f"measuring the {link_gbps:g} Gbit/s link took over {TIMEOUT_S:.0f} s")
                try:
                    rank, gbps, lat, err = queue.get(timeout=min(left, 1.0))
                except Exception:  # queue.Empty: check the processes are alive
                    dead = [p for p in procs if p.exitcode not in (None, 0)]
                    if dead:
                        raise netem.NetemError(f"measuring the {link_gbps:g} Gbit/s link: a process died "
                                               f"(exit {dead[0].exitcode})") from None
                    continue
                if err:
                    raise netem.NetemError(f"measuring the {link_gbps:g} Gbit/s link failed: {err}")
                results[rank] = (gbps, lat)
        finally:
            for p in procs:
                p.join(timeout=5)
                if p.is_alive():
                    p.kill()
                    p.join()
    gbps = min(r[0] for r in results.values())
    lat = statistics.fmean(r[1] for r in results.values())
    return LinkMeasurement(link_gbps, latency_ms, gbps, lat)


def check(m: LinkMeasurement, tries: list[tuple[LinkMeasurement, float]] | None = None) -> None:
    """Refuse (NetemError, one line) a link that delivers less than MIN_FRACTION of its rate;
    ``tries``: every (measurement, load average) taken of it, all named in the refusal."""
    if not m.link_gbps or m.fraction >= MIN_FRACTION:
        return
    tries = tries or [(m, os.getloadavg()[0])]
    rates = ", ".join(f"{t.measured_gbps:.2f}" for t, _ in tries)
    loads = ", ".join(f"{load:.1f}" for _, load in tries)
    raise netem.NetemError(
        f"network.link_gbps {m.link_gbps:g}: this machine delivers only {rates} Gbit/s between two emulated "
        f"hosts ({100 * max(t.fraction for t, _ in tries):.0f}% of the asked rate at best, in {len(tries)} "
        f"measurement{'s' if len(tries) > 1 else ''} at load average {loads} on {os.cpu_count()} CPUs; at least "
        f"{100 * MIN_FRACTION:.0f}% is needed for the link, not the CPUs, to set the pace): ask for a "
        f"lower link_gbps, or run on a quieter or bigger machine")


# A busy moment (another job's burst) can take the CPUs a link measurement needs: before
# refusing, wait and measure again, this many times, the waits growing (seconds).
RETRY_WAITS_S = (5.0, 15.0, 30.0)


def measure_until_carried(gbps: float, latency_ms: float, *, out=None, measure_fn=None,
                          sleep=time.sleep) -> LinkMeasurement:
    """The link measured; while it falls short of MIN_FRACTION, measured again after each of
    RETRY_WAITS_S (said on ``out``), then refused with every figure and the load (:func:`check`)."""
    measure_fn = measure_fn or measure
    tries = []
    for wait_s in (*RETRY_WAITS_S, None):
        m = measure_fn(gbps, latency_ms)
        tries.append((m, os.getloadavg()[0]))
        if out is not None:
            print(f"network: link {gbps:g} Gbit/s (+{latency_ms:g} ms) measured {m.measured_gbps:.2f} Gbit/s, "
                  f"{m.measured_latency_ms:.3f} ms one way", file=out, flush=True)
        if not m.link_gbps or m.fraction >= MIN_FRACTION or wait_s is None:
            break
        if out is not None:
            print(f"network: that is {100 * m.fraction:.0f}% of the rate at load average {tries[-1][1]:.1f} "
                  f"(the CPUs, not the link, set the pace): measuring again in {wait_s:.0f} s "
                  f"({len(tries)} of {len(RETRY_WAITS_S)} retries)", file=out, flush=True)
        sleep(wait_s)
    check(m, tries)
    return m


def prepare(network_cfg, link_settings, *, out=None) -> dict[float, LinkMeasurement]:
    """Before Ray starts: can this machine emulate the sweep's links, and do they deliver?

    Removes leftovers of killed sweeps, runs :func:`netem.preflight`, then measures each link
    setting and refuses (NetemError, one line) one that still falls short after the retries of
    :func:`measure_until_carried`.
    Returns {link_gbps: measurement}; nothing of ours remains on the machine afterwards.
    """
    removed = netem.remove_leftovers()
    if removed and out is not None:
        print(f"network: removed {len(removed)} namespaces/links left by a killed sweep", file=out, flush=True)
    settings = sorted(set(link_settings))
    netem.preflight(settings[0], network_cfg.latency_ms)
    return {gbps: measure_until_carried(gbps, network_cfg.latency_ms, out=out) for gbps in settings}
