"""Each collective a hook issues, timed alone on emulated shaped links, against hooks.cost.

    .venv/bin/python bench/collectives_probe.py --world-sizes 2 4 --link 1
    .venv/bin/python bench/collectives_probe.py --kinds reduce_scatter all_gather   # FSDP's two

W processes, each on its own emulated host (service/network/netem.py), time one gloo collective at a
time (barrier on the ordinary network first, median of repeats, max over ranks) for the
payloads mlp_digits' buckets give each hook (FSDP's kinds: one such bucket as a sharded module's
unsharded parameters), unshaped and on the shaped link, and print measured ms beside
hooks.cost.collective_seconds at the link's measured goodput and latency; whether a kind's CPU
work pipelines under the wire (hooks.cost.OVERLAPPING_KINDS) is read off the two: shaped against
max(unshaped, wire) and against unshaped + wire. Writes bench/results/collectives_probe.json.
"""
from __future__ import annotations

import argparse
import sys

from _common import Rendezvous, join_group, load_average, machine, time_collective, write_json  # noqa: F401  (sys.path)

import hooks  # noqa: E402
from hooks.wire import ALL_KINDS, KINDS  # noqa: E402
from service.network import link_measure  # noqa: E402
from service.network import netem

BUCKET_ELEMS = 4_273_157  # mlp_digits' 8.5 M gradients in DDP's two buckets (mean bucket)


def cases(w: int) -> list[tuple[str, str, int, str]]:
    """(label, kind, payload bytes per rank, dtype)"""
    from hooks.quantize import num_chunks

    n = BUCKET_ELEMS
    s = -(-num_chunks(n, 512) // w)
    shard = 8 * s + s * 512
    return [("allreduce fp32", "allreduce", 4 * n, "float32"),
            ("allreduce fp16", "allreduce", 2 * n, "float16"),
            ("allreduce bf16", "allreduce", 2 * n, "bfloat16"),
            ("allgather uint8 n", "allgather", n, "uint8"),
            ("allgather fp32 n", "allgather", 4 * n, "float32"),
            ("all_to_all uint8 W*shard", "all_to_all", w * shard, "uint8"),
            ("allgather uint8 shard", "allgather", shard, "uint8"),
            ("allreduce fp32 small (PowerSGD P)", "allreduce", 4 * 3000, "float32"),
            # FSDP's (hooks/sharded.py), n the unsharded size, a multiple of W: its own fp32, bf16_compress's form
            ("reduce_scatter fp32 n", "reduce_scatter", 4 * (n - n % w), "float32"),
            ("reduce_scatter bf16 n", "reduce_scatter", 2 * (n - n % w), "bfloat16"),
            ("all_gather fp32 n", "all_gather", 4 * (n - n % w), "float32"),
            ("all_gather bf16 n", "all_gather", 2 * (n - n % w), "bfloat16")]


def _rank(rank, w, port, net, links, repeats, kinds, queue):
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        join_group(port, rank, w)
        group = netem.process_group_on_host(net.hosts[rank])
        out = []
        for link, label, kind, nbytes, dtype in [(link, *c) for link in links for c in cases(w) if c[1] in kinds]:
            if rank == 0 and link != net.link_gbps:
                net.reshape(link)
            dt = getattr(torch, dtype)
            elem = torch.tensor([], dtype=dt).element_size()
            x = torch.ones(nbytes // elem, dtype=dt)
            out.append((link, label, kind, nbytes, time_collective(kind, x, group, w, repeats)))
        dist.destroy_process_group()
        queue.put((rank, out, None))
    except BaseException:  # noqa: BLE001
        import traceback

        queue.put((rank, None, traceback.format_exc()))


def main(argv=None) -> int:
    import multiprocessing as mp

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    p.add_argument("--link", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--kinds", nargs="+", choices=ALL_KINDS, default=list(KINDS),
                   help="the collective kinds to time (default: the DDP hooks' three)")
    p.add_argument("--out", default=None, help="the JSON's path (default: bench/results/collectives_probe.json)")
    args = p.parse_args(argv)
    load_before, rows = load_average(), []
    measured = {link: link_measure.measure(link) for link in (None, args.link)}
    for link, m in measured.items():
        print(f"link {link} Gbit/s: measured {m.measured_gbps:.3f} Gbit/s, {m.measured_latency_ms:.3f} ms; "
              f"load {load_average()}", flush=True)
    ctx = mp.get_context("spawn")
    for w in args.world_sizes:
        with netem.Network(w, None) as net:
            q, meet = ctx.Queue(), Rendezvous(w)
            procs = [ctx.Process(target=_rank, args=(r, w, meet.port, net, [None, args.link], args.repeats, args.kinds, q),
                                 daemon=True) for r in range(w)]
            for pr in procs:
                pr.start()
            res = {}
            for _ in procs:
                r, out, err = q.get(timeout=1800)
                if err:
                    print(err, file=sys.stderr)
                    return 1
                res[r] = out
            for pr in procs:
                pr.join(30)
        unshaped = {label: sec for link, label, _, _, sec in res[0] if link is None}
        for link, label, kind, nbytes, sec in res[0]:
            m = measured[link]
            model = hooks.cost.collective_seconds(kind, nbytes, w, m.measured_gbps, m.measured_latency_ms / 1000)
            print(f"W={w} link {str(link):4s} {label:34s} {nbytes / 1e6:8.3f} MB  measured {1000 * sec:8.1f} ms  model {1000 * model:8.1f} ms  "
                  f"err {100 * (model - sec) / sec:+6.1f}%", flush=True)
            rows.append({"world_size": w, "link_gbps": link, "label": label, "kind": kind, "nbytes": nbytes,
                         "measured_ms": 1000 * sec, "model_wire_ms": 1000 * model, "unshaped_ms": 1000 * unshaped[label],
                         "err": (model - sec) / sec})
        for r in (r for r in rows if r["world_size"] == w and r["link_gbps"] is not None):
            # pipelined under the wire: shaped ~ max(unshaped, wire); not: shaped ~ unshaped + wire
            r["over_max"] = r["measured_ms"] / max(r["unshaped_ms"], r["model_wire_ms"])
            r["over_sum"] = r["measured_ms"] / (r["unshaped_ms"] + r["model_wire_ms"])
            print(f"W={w} {r['label']:34s} shaped / max(unshaped, wire) {r['over_max']:.2f}  "
                  f"shaped / (unshaped + wire) {r['over_sum']:.2f}", flush=True)
    load_after = load_average()
    print(f"load {load_after}")
    links = {str(k): {"measured_gbps": m.measured_gbps, "measured_latency_ms": m.measured_latency_ms}
             for k, m in measured.items()}
    path = write_json("collectives_probe", {"settings": vars(args), "machine": machine(), "links": links,
                                            "load_average_before": load_before, "load_average_after": load_after,
                                            "rows": rows}, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
