"""bench/projection.py's figures from its raw runs: each cell's projection from the loopback basis,
the error against the measured step, the bands per (hook, error feedback, W), time to target, the
band file the report reads (service/step_model/projection_error.json, format 2) and the cells it
is derived from (projection_cells.json beside it: :func:`bands` re-derives the file from them).
Pure Python over the runs' JSON."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import _projection_cluster as cluster_mod
from _projection_pairs import name
import _projection_scores as scores
from _common import table

from service.answer.recommend import time_to_target
from service.step_model.bands import DDP, FORMAT, RAW_FILE, error_feedback_of, label, sharding_fields, sharding_in
from service.step_model.price import CellRefused
from service.step_model.transport import Sample, TransportFit, fit
from service.step_model.trial import TrialTimeline, pooled_compute

LOOPBACK = "loopback"
BASES = (LOOPBACK, cluster_mod.BASIS_ARM)  # the basis arm: loopback, or the emulated cluster's unshaped hosts


def setting(r: dict, default=True):
    """A run's or row's error-feedback setting (None: its hook has none); a run from before the
    bench recorded it ran ``default`` (on)."""
    if "error_feedback" in r:
        return r["error_feedback"]
    return error_feedback_of(r["hook"], {"error_feedback": default if isinstance(default, bool) else True})


def configuration(r: dict, default=True) -> tuple:
    """What a run's, row's or band's figures are kept apart by: (hook, error feedback, parallelism,
    all-gather format); a run or row without a parallelism (every one from before fsdp was
    measured) is ddp's (bands.sharding_in)."""
    return (r["hook"], setting(r, default), *sharding_in(r))


def view(rows: list[dict], ef: bool) -> list[dict]:
    """The rows of one error-feedback setting, with the hooks that have none (scores and pairs
    rank hooks by name within one setting)."""
    return [r for r in rows if setting(r) in (ef, None)]


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _links(world: dict) -> dict[float, dict]:
    """Each link's per-host goodput and latency with all W hosts sending: medians over repeats."""
    links = {float(k) for rep in world["links"] for k in rep}
    return {link: {k: statistics.median(rep[link][k] if link in rep else rep[str(link)][k] for rep in world["links"])
                   for k in ("gbps", "latency_ms")} for link in links}


def _bases(worlds: dict) -> dict[tuple, list[dict]]:
    """Per configuration (:func:`configuration`), the basis trial of each repeat that ended ok
    with a timeline (W = 2's basis arm)."""
    out: dict[tuple, list[dict]] = {}
    for run in _world(worlds, 2)["runs"]:
        if run["arm"] in BASES and run["status"] == "ok" and run["timeline"]:
            out.setdefault(configuration(run), []).append(run)
    return out


def quiet(runs: list[dict], limit: float) -> list[dict]:
    """The repeats whose trial had the machine to itself: other processes kept at most ``limit``
    cores busy on average (a repeat hit by a test suite is not the step the model prices)."""
    return [r for r in runs if r.get("other_cores", 0.0) <= limit]


def quiet_limit(rules: dict, w: int) -> float:
    """The most cores other processes may keep busy for a W trial to count: ``rules["quiet"]``; on
    the emulated cluster what its W hosts leave free of the machine (cores - W x Q): a host's
    share is a ceiling, so others hurt a trial only once they take from it (W = 8 x 0.2 on 2
    cores: 0.4; W = 2: 1.6)."""
    if not rules.get("host_cpus"):
        return rules["quiet"]
    return max(rules["machine_cores"] - w * rules["host_cpus"], 0.0)


def _world(worlds: dict, w: int) -> dict:
    return worlds.get(w, worlds.get(str(w)))


def transport_of(worlds: dict, only_w: int | None = None) -> TransportFit | None:
    """The probe's samples of every world (run on loopback before its trials) as one fit; None
    for a saved run from before the bench probed. ``only_w``: the emulated cluster's, that W's
    probe on the hosts alone (a cluster cell has the basis sweep's probe)."""
    if only_w is not None:
        return cluster_mod.fit_at(worlds, only_w)
    samples = [Sample(**s) for w in worlds.values() for s in w.get("transport", [])]
    return fit(samples, {}) if samples else None


def _price(bases: list[TrialTimeline], global_batch: int, w: int, gbps: float, latency_ms: float, rules: dict,
           transport_key: str = "transport"):
    """(projected step ms, projected compute ms), medians over the repeats' bases; or the refusal.
    Priced as this machine's cell: its ranks share ``rules["cores"]`` and the transport is the
    probe's at W (``rules["transport"]``) where the run has one; on the emulated cluster, cores
    None and W = 2's probe: the report's cluster cell (``price.Cell(W, goodput, latency, fit, None)``);
    ``transport_key="probed_transport"``: the same cell with every W's probe on the hosts."""
    try:
        prices = [b.price(global_batch, w, gbps, latency_ms / 1000.0, rules.get(transport_key), rules["cores"])
                  for b in bases]
    except CellRefused as exc:
        return None, None, str(exc)
    return _median(p.step_ms for p in prices), _median(p.compute_ms for p in prices), None


def pooled_bases(bases: dict[tuple, list[dict]], rules: dict) -> dict[tuple, list[TrialTimeline]]:
    """Per configuration, its quiet basis trials' timelines with their compute points
    pooled over every configuration's (``trial.pooled_compute``, as the report pools its bases)."""
    calm = {key: quiet(runs, quiet_limit(rules, 2)) for key, runs in bases.items()}
    pooled = iter(pooled_compute(TrialTimeline.from_json(r["timeline"]) for runs in calm.values() for r in runs))
    return {key: [next(pooled) for _ in runs] for key, runs in calm.items()}


def cell_row(hook: str, w: int, link, runs: list[dict], link_fig: dict | None, basis: list[TrialTimeline],
             rules: dict, ef=None, parallelism: str = DDP, all_gather: str | None = None) -> dict:
    """One (hook, W, link) cell from the quiet repeats (:func:`quiet`) of its runs and its quiet
    basis trials' timelines (:func:`pooled_bases`): measured and projected (medians), error,
    counted or why not (``rules``: global_batch, carried, cores, quiet)."""
    ok = [r for r in runs if r["status"] == "ok"]
    calm = quiet(ok, quiet_limit(rules, w))
    measured = _median(r["step_ms"] for r in calm)
    timelines = [TrialTimeline.from_json(r["timeline"]) for r in calm if r["timeline"]]
    row = {"hook": hook, "error_feedback": ef, **sharding_fields(parallelism, all_gather), "world_size": w,
           "link_gbps": link, "measured_ms": measured,
           "repeats": len(ok),
           "quiet_repeats": len(calm), "other_cores": [round(r.get("other_cores", 0.0), 2) for r in ok],
           "measured_compute_ms": _median(t.timeline.compute_ms for t in timelines),
           "measured_timeline_ms": _median(t.own_step_ms() for t in timelines)}
    gbps, latency_ms = (float("inf"), 0.0) if link in BASES else (link_fig["gbps"], link_fig["latency_ms"])
    if link not in BASES:
        row.update(link_measured_gbps=gbps, latency_ms=latency_ms)
    why = None if basis else "no quiet basis trial"
    if basis:
        row["projected_ms"], row["projected_compute_ms"], why = _price(
            basis, rules["global_batch"], w, gbps, latency_ms, rules)
        if rules.get("probed_transport") is not None:
            row["probed_projected_ms"] = _price(basis, rules["global_batch"], w, gbps, latency_ms, rules,
                                                "probed_transport")[0]
    if measured is None:
        why = why or f"no quiet measured trial (other processes kept {max(row['other_cores'], default=0):.1f} cores busy)"
    elif row.get("projected_ms") is not None:
        row["error_pct"] = 100.0 * (row["projected_ms"] - measured) / measured
        if row.get("probed_projected_ms") is not None:
            row["probed_error_pct"] = 100.0 * (row["probed_projected_ms"] - measured) / measured
    row["why_not"] = _why_not(w, link, gbps, rules, why)
    row["counted"] = row["why_not"] is None
    return row


def _why_not(w: int, link, gbps: float, rules: dict, why: str | None) -> str | None:
    """Why a cell is not counted in the band, or None. The model is told this machine's shape
    (W ranks on its cores, the transport probed at W), so a crowded W counts; a link the machine
    does not carry with all W hosts sending is shown, not counted."""
    if why or link in BASES:
        return why or "the basis itself (not held out)"
    if gbps < rules["carried"] * link:
        return f"not carried: measured {gbps:.2f} Gbit/s per host with {w} sending ({100 * gbps / link:.0f}% of {link:g})"
    return None


def summarise(worlds: dict, rules: dict) -> dict:
    """Every cell's row, the per-hook bands, and time to target (when a quality run was made)."""
    rules = {**rules, "transport": transport_of(worlds, rules.get("transport_w"))}
    if rules.get("transport_w"):  # the emulated cluster: also priced with the hosts' probe at each W
        rules["probed_transport"] = cluster_mod.fit_all(worlds)
    bases, rows = pooled_bases(_bases(worlds), rules), []
    for w in sorted(int(k) for k in worlds):
        world, links = _world(worlds, w), _links(_world(worlds, w))
        configs = list(dict.fromkeys(configuration(r) for r in world["runs"]))
        arms = list(dict.fromkeys(r["arm"] for r in world["runs"]))
        arms = [a for a in arms if a in BASES] + sorted(float(a) for a in arms if a not in BASES)
        for config in configs:
            for arm in arms:
                runs = [r for r in world["runs"] if (configuration(r), r["arm"]) == (config, arm)]
                hook, ef, parallelism, all_gather = config
                rows.append(cell_row(hook, w, arm, runs, links.get(arm), bases.get(config, []), rules, ef,
                                     parallelism, all_gather))
    quality = _world(worlds, 2).get("quality") if _world(worlds, 2) else None
    found = bands(rows, rules["error_feedback"])
    efs = rules["error_feedback"] if isinstance(rules["error_feedback"], list) else [rules["error_feedback"]]
    scored = [{**c, "error_feedback": ef} for ef in efs for c in scores.score(view(rows, ef), ef)]
    return {"rows": rows, "bands": found, "scores": scored, "score_totals": scores.totals(scored),
            "time_to_target": targets(quality, view(rows, efs[0])) if quality else None,
            "ring_check": cluster_mod.ring_check(worlds) if rules.get("transport_w") else []}


def _band(errors: list[float]) -> dict:
    if not errors:
        return {"low_pct": None, "high_pct": None, "median_abs_pct": None}
    return {"low_pct": round(min(errors), 1), "high_pct": round(max(errors), 1),
            "median_abs_pct": round(statistics.median(abs(e) for e in errors), 1)}


def bands(rows: list[dict], error_feedback) -> dict:
    """Per (configuration: hook, its error-feedback setting and, under fsdp, its all-gather format;
    W) and overall: the error band over the counted cells, median |error|, counts
    (``error_feedback``: what the bench ran hooks that have it with, where a row does not say).
    The basis's own cell is neither counted nor excluded (it is not held out)."""
    held_out = [r for r in rows if r["link_gbps"] not in BASES]
    out = []
    for key in dict.fromkeys((*configuration(r, error_feedback), r["world_size"]) for r in held_out):
        mine = [r for r in held_out if (*configuration(r, error_feedback), r["world_size"]) == key]
        counted = [r["error_pct"] for r in mine if r["counted"]]
        out.append({"hook": key[0], "error_feedback": key[1], **sharding_fields(key[2], key[3]), "world_size": key[4],
                    **_band(counted), "counted": len(counted), "excluded": len(mine) - len(counted)})
    overall = _band([r["error_pct"] for r in held_out if r["counted"]])
    return {"bands": out, "overall": overall}


def targets(quality: dict, rows: list[dict], tolerance: float = 0.01) -> dict:
    """Time to target from each hook's quality run: target = allreduce's final eval loss x (1 +
    tolerance); the crossing step (recommend.time_to_target); x each cell's projected step."""
    base = quality.get("allreduce")
    if not base or not base["evals"]:
        return {"error": "no allreduce quality run: no target"}
    target = base["evals"][-1][1] * (1 + tolerance)
    out = {"target": target, "steps": base["steps"], "hooks": {}}
    for hook, q in quality.items():
        steps = list(range(1, q["steps"] + 1))
        ttt = time_to_target([s for s, _ in q["evals"]], [v for _, v in q["evals"]], steps, [1.0] * len(steps), target)
        cells = {f"W={r['world_size']} {r['link_gbps']:g}": (None if ttt.step is None or r.get("projected_ms") is None
                                                            else ttt.step * r["projected_ms"] / 1000.0)
                 for r in rows if name(r) == hook and r["link_gbps"] not in BASES}
        out["hooks"][hook] = {"crossing_step": ttt.step, "final_eval_loss": q["evals"][-1][1] if q["evals"] else None,
                              "projected_s": cells}
    return out


def _fmt_link(r: dict) -> str:
    if r["link_gbps"] in BASES:
        return r["link_gbps"]
    return f"{r['link_gbps']:g} ({r['link_measured_gbps']:.2f})"


def print_report(result: dict) -> None:
    rows = result["rows"]
    print(table(["hook", "error feedback", "W", "Gbit/s (measured, all W)", "projected ms", "measured ms", "error %",
                 "proj. compute ms", "meas. compute ms", "quiet/repeats", "counted"],
                [[name(r), setting(r), r["world_size"], _fmt_link(r), r.get("projected_ms"), r["measured_ms"],
                  None if r.get("error_pct") is None else round(r["error_pct"], 1), r.get("projected_compute_ms"),
                  r["measured_compute_ms"], f"{r['quiet_repeats']}/{r['repeats']}",
                  "yes" if r["counted"] else r["why_not"]] for r in rows]))
    b = result["bands"]
    print()
    print(table(["hook", "error feedback", "W", "low %", "high %", "median |error| %", "counted", "excluded"],
                [[name(v), v["error_feedback"], v["world_size"], v["low_pct"], v["high_pct"], v["median_abs_pct"],
                  v["counted"], v["excluded"]] for v in b["bands"]]))
    o = b["overall"]
    print(f"overall: {o['low_pct']} .. {o['high_pct']} %, median |error| {o['median_abs_pct']} %")
    print_per_w(rows, "error_pct")
    if any(r.get("probed_error_pct") is not None for r in rows):
        print("\npriced with the transport probed on the hosts at each cell's own W (not W = 2's scaled by the ring):")
        print_per_w(rows, "probed_error_pct")
    scored = result.get("scores") or []
    for ef in dict.fromkeys(c.get("error_feedback", True) for c in scored) or [True]:
        print(f"\n(error feedback {'on' if ef else 'off'} where a hook has it)")
        print_scores([c for c in scored if c.get("error_feedback", True) == ef])
    cluster_mod.print_ring_check(result.get("ring_check") or [], table)
    ttt = result.get("time_to_target")
    if ttt and "hooks" in ttt:
        cells = list(next(iter(ttt["hooks"].values()))["projected_s"])
        print(f"\ntime to target (allreduce's final eval loss x 1.01 = {ttt['target']:.4f}; quality runs of "
              f"{ttt['steps']} steps on loopback, W=2): crossing step x projected step, s")
        print(table(["hook", "crossing step", *cells],
                    [[h, v["crossing_step"], *v["projected_s"].values()] for h, v in ttt["hooks"].items()]))
    elif ttt:
        print(f"time to target: {ttt['error']}")


def print_per_w(rows: list[dict], key: str) -> None:
    """Per W (and parallelism, where the rows have more than ddp), the counted cells' ``key`` (an
    error %): band, median |error|, how many within +-10 %."""
    per_w = {}
    for r in rows:
        if r["counted"] and r.get(key) is not None:
            per_w.setdefault((sharding_in(r)[0], r["world_size"]), []).append(r[key])
    several = len({p for p, _ in per_w}) > 1
    for (parallelism, w), errors in sorted(per_w.items()):
        b = _band(errors)
        print(f"{parallelism + ' ' if several else ''}W={w}: {b['low_pct']} .. {b['high_pct']} %, median |error| "
              f"{b['median_abs_pct']} %, {sum(abs(e) <= 10 for e in errors)} of {len(errors)} within +-10 %")


CELL_KEYS = ("hook", "error_feedback", "world_size", "link_gbps", "link_measured_gbps", "latency_ms", "projected_ms", "measured_ms",
             "error_pct", "quiet_repeats", "repeats", "counted", "why_not", "probed_projected_ms", "probed_error_pct")


def print_scores(scored: list[dict]) -> None:
    """The decisions per counted cell (bench/_projection_scores.py: each decided under the pair
    bands of the other cells), or why there are none."""
    if not scored:
        print("\ndecisions: no counted cell with two hooks to score")
        return
    print("\ndecisions per counted cell (projected vs measured step; pair bands from the other cells):")
    print(table(["W", "Gbit/s", "hooks", "projected winner", "runner-up", "decided", "measured winner", "regret %",
                 "Kendall tau", "compress right"],
                [[c["world_size"], c["link_gbps"], c["hooks"], c["projected_winner"], c["runner_up"], c["decided"],
                  c["measured_winner"], round(c["regret_pct"], 1),
                  None if c["kendall_tau"] is None else round(c["kendall_tau"], 2), c["compress_right"]]
                 for c in scored]))
    t = scores.totals(scored)
    print("; ".join(f"{name} {'-' if t[name]['value'] is None else round(t[name]['value'], 2)} (target "
                    f"{t[name]['target']})" for name in scores.TARGETS) + " (bench/projection_pairs.py: their power)")


def band_file(result: dict, args, rules: dict, load: list[float], measured: str | None = None) -> dict:
    """The committed error bands (format 2): per hook, error feedback and W, with where they come from."""
    per_w = {}
    for r in result["rows"]:
        if r["link_gbps"] not in BASES:
            per_w.setdefault(r["world_size"], []).append(r["link_gbps"])
    links = "; ".join(f"W={w} x {','.join(f'{x:g}' for x in dict.fromkeys(v))} Gbit/s" for w, v in sorted(per_w.items()))
    crowded = [w for w in args.world_sizes if rules["cores"] and w > rules["cores"]]
    note = (f" (W={','.join(map(str, crowded))}: more ranks than the {rules['cores']} cores, priced with the machine's "
            "shape)") if crowded else ""
    basis = "loopback, W=2"
    under = ", under fsdp (FSDP2, every block sharded)" if getattr(args, "parallelism", DDP) != DDP else ""
    if rules.get("host_cpus"):
        q = rules["host_cpus"]
        apart = ", gloo's threads off the quota" if rules.get("comm_apart") else ""
        note = f" on emulated hosts of {q:g} cores each{apart}, priced as the report's cluster cell (a share per rank)"
        basis = f"emulated hosts of {q:g} cores{apart}, unshaped, W=2; transport probed there"
    measured = measured or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {"format": FORMAT, "source": "bench/projection.py", "measured": measured,
            "workload": f"char_lm, global batch 64, {args.steps} steps{under}", "basis": basis,
            "cells": f"{links}{note}", "load_average": load,
            "error_feedback": rules["error_feedback"], "raw": RAW_FILE.name,
            "bands": result["bands"]["bands"], "overall": result["bands"]["overall"]}


def cells_file(result: dict, band: dict) -> dict:
    """The cells the bands come from, small enough to commit (projection_cells.json): every
    row's figures without the timelines; :func:`from_cells` re-derives the band file from it."""
    head = {k: v for k, v in band.items() if k not in ("bands", "overall", "raw")}
    return {**head, "cell_rows": [cell_of(r) for r in result["rows"]]}


def cell_of(r: dict) -> dict:
    """A row as the cells file keeps it: :data:`CELL_KEYS`, an fsdp row's parallelism and
    all-gather format after its error feedback (a ddp row carries neither: as before fsdp)."""
    out = {k: r.get(k) for k in CELL_KEYS[:2]}
    return {**out, **sharding_fields(*sharding_in(r)), **{k: r.get(k) for k in CELL_KEYS[2:]}}


def _kept_apart(r: dict) -> tuple:
    """What with_added_hooks tells rows apart by: hook, error feedback as the row says it, and its
    sharding (a row without one is ddp's)."""
    return (r["hook"], r.get("error_feedback"), *sharding_in(r))


def with_added_hooks(cells: dict, later: list[dict]) -> dict:
    """``cells`` (a committed projection_cells.json) with the rows of every configuration it
    lacks (hook, error-feedback setting, parallelism and fsdp's all-gather format) taken from
    ``later`` cells files (a run of only those, on the same cluster and cells), each one's
    provenance kept under ``added``: fsdp rows of a hook the committed cells have under ddp are added
    beside them, kept apart."""
    if not later:
        return cells
    have = {_kept_apart(r) for r in cells["cell_rows"]}
    rows, added = list(cells["cell_rows"]), list(cells.get("added", []))
    for more in later:
        new = [r for r in more["cell_rows"] if _kept_apart(r) not in have]
        if new:
            rows += new
            added.append({"hooks": sorted({label(r["hook"], None, *sharding_in(r)) for r in new}),
                          "measured": more["measured"], "workload": more["workload"],
                          "cells": more["cells"], "load_average": more["load_average"]})
    return {**cells, "cell_rows": rows, **({"added": added} if added else {})}


def from_cells(saved: dict) -> dict:
    """The band file again from a committed projection_cells.json."""
    derived = bands(saved["cell_rows"], saved["error_feedback"])
    head = {k: v for k, v in saved.items() if k != "cell_rows"}
    return {**head, "raw": RAW_FILE.name, **derived}


def write_band(band: dict, path: str) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(band, indent=1) + "\n")
    return out
