"""The error of the projected *ratio* of two hooks' steps, from bench/projection.py's cells (the
committed projection_cells*.json, or a run's rows): the raw pair cells, their bands per (pair,
error feedback, W), and the pair file (service/step_model/projection_pairs_cluster.json, the one
the report reads, from the cluster cells; projection_pairs.json from this machine's shape;
service/step_model/pairs.py says what the bands are for and the rule that uses them).

Pure Python over the cell rows (``hook``, ``world_size``, ``link_gbps``, ``projected_ms``,
``measured_ms``, ``counted``; an fsdp row's ``parallelism`` and ``all_gather``: a configuration of
its own, named apart from the same hook under ddp: :func:`name`)."""

from __future__ import annotations

import itertools
import json
import statistics
from pathlib import Path

from service.step_model import pairs
from service.step_model.bands import DDP, error_feedback_of, sharding_fields, sharding_in

BASELINE = "allreduce"  # DDP's (an fsdp configuration's name says fsdp: :func:`name`)
# an fsdp side's parallelism and all-gather format last (null for ddp): the columns before fsdp unchanged
PAIR_COLUMNS = ("a", "a_error_feedback", "b", "b_error_feedback", "world_size", "link_gbps", "projected_ratio",
                "measured_ratio", "error_pct", "a_parallelism", "a_all_gather", "b_parallelism", "b_all_gather")


def name(r: dict) -> str:
    """A configuration's name where hooks are ranked by name within one error-feedback setting
    (pairs, scores): the hook under ddp, 'quantized_allreduce [fsdp, uint8 all-gather]' under fsdp."""
    parallelism, all_gather = sharding_in(r)
    return r["hook"] if parallelism == DDP else f"{r['hook']} [{parallelism}, {all_gather} all-gather]"


def hook_of(named: str) -> str:
    """The hook of a :func:`name`."""
    return named.split(" [", 1)[0]


def counted_cells(rows: list[dict]) -> dict[tuple, dict[str, dict]]:
    """(W, link) -> configuration name (:func:`name`: the hook, under fsdp with its
    sharding) -> its counted row: the held-out cells the bands are measured on."""
    cells: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        if r.get("counted") and r.get("projected_ms") and r.get("measured_ms"):
            cells.setdefault((r["world_size"], r["link_gbps"]), {})[name(r)] = r
    return cells


def _side(prefix: str, r: dict) -> dict:
    """A pair side's sharding fields (``a_parallelism``, ``a_all_gather``): none for ddp."""
    return {f"{prefix}{k}": v for k, v in sharding_fields(*sharding_in(r)).items()}


def _oriented(a: str, b: str) -> tuple[str, str]:
    """A pair's order: a configuration against the baseline (its ratio to DDP's allreduce), a hook
    against allreduce under its own parallelism (fsdp's: FSDP's own fp32 comms), else by name."""
    if a == BASELINE or (hook_of(a) == BASELINE and hook_of(b) != BASELINE):
        return b, a
    return a, b


def pair_cells(rows: list[dict], error_feedback: bool) -> list[dict]:
    """Every pair of hooks at every counted cell: projected and measured ratio of a's step to b's,
    and the error of the projected one, %."""
    out, setting = [], {}
    for (w, link), by_hook in sorted(counted_cells(rows).items(), key=lambda c: (c[0][0], str(c[0][1]))):
        for h, r in by_hook.items():
            setting.setdefault(h, error_feedback_of(r["hook"], {"error_feedback": error_feedback}))
        for x, y in itertools.combinations(sorted(by_hook), 2):
            a, b = _oriented(x, y)
            ra, rb = by_hook[a], by_hook[b]
            projected = ra["projected_ms"] / rb["projected_ms"]
            measured = ra["measured_ms"] / rb["measured_ms"]
            out.append({"a": ra["hook"], "a_error_feedback": setting[a], "b": rb["hook"], "b_error_feedback": setting[b],
                        "world_size": w, "link_gbps": link, "projected_ratio": projected, "measured_ratio": measured,
                        "error_pct": 100.0 * (projected / measured - 1.0), **_side("a_", ra), **_side("b_", rb)})
    return out


def pair_key(c: dict) -> tuple:
    """A pair: each side's hook, error feedback, parallelism and all-gather format."""
    return c["a"], c["a_error_feedback"], *sharding_in(c, "a_"), c["b"], c["b_error_feedback"], *sharding_in(c, "b_")


def link_moves(cells: list[dict]) -> dict[int, float]:
    """Per W: the median over every pair of how far its error moved between the links it was
    measured on there (max - min). A W where no pair has two links takes the median over the
    other W's (a held-out link leaves one); none at all: 0."""
    by: dict[tuple, list[float]] = {}
    for c in cells:
        by.setdefault((pair_key(c), c["world_size"]), []).append(c["error_pct"])
    moves: dict[int, list[float]] = {}
    for (_, w), errors in by.items():
        if len(errors) > 1:
            moves.setdefault(w, []).append(max(errors) - min(errors))
    spread = {w: statistics.median(v) for w, v in moves.items()}
    pooled = statistics.median(spread.values()) if spread else 0.0
    return {w: spread.get(w, pooled) for w in sorted({c["world_size"] for c in cells})}


def bands(cells: list[dict]) -> list[dict]:
    """Per (pair, W): the range of its cells' errors, widened on both sides by that W's link move."""
    moves = link_moves(cells)
    by: dict[tuple, list[float]] = {}
    for c in cells:
        by.setdefault((*pair_key(c), c["world_size"]), []).append(c["error_pct"])
    return [{"a": a, "a_error_feedback": aef, **_prefixed("a_", ap, ag), "b": b, "b_error_feedback": bef,
             **_prefixed("b_", bp, bg), "world_size": w,
             "low_pct": round(min(e) - moves[w], 2), "high_pct": round(max(e) + moves[w], 2), "cells": len(e),
             "widened_by_pct": round(moves[w], 2)}
            for (a, aef, ap, ag, b, bef, bp, bg, w), e in by.items()]


def _prefixed(prefix: str, parallelism: str, all_gather) -> dict:
    return {f"{prefix}{k}": v for k, v in sharding_fields(parallelism, all_gather).items()}


def pair_bands(cells: list[dict]) -> pairs.PairBands:
    """The bands of ``cells`` as the report reads them (service.step_model.pairs.PairBands)."""
    return pairs.from_json({"format": pairs.FORMAT, "source": "bench", "derived_from": "cells", "measured": "",
                            "bands": bands(cells)})


def pair_file(parts: list[dict], derived_from: str = "projection_cells.json") -> dict:
    """projection_pairs.json from a committed projection_cells.json split by error-feedback setting
    (one part per setting: ``one_setting`` in bench/projection_pairs.py): the bands and the raw pair
    cells of every part. Each part's pairs rank its own hooks; a pair of two hooks without the
    setting (allreduce and allgather_then_aggregate) is kept once, from the first part."""
    cells, seen = [], set()
    for part in parts:
        for c in pair_cells(part["cell_rows"], part["error_feedback"]):
            at = (*pair_key(c), c["world_size"], c["link_gbps"])
            if at not in seen:
                seen.add(at)
                cells.append(c)
    first = parts[0]
    settings = [p["error_feedback"] for p in parts]
    return {"format": pairs.FORMAT, "source": "bench/projection_pairs.py", "derived_from": derived_from,
            "measured": first["measured"], "workload": first["workload"], "cells": first["cells"],
            "error_feedback": settings[0] if len(settings) == 1 else settings,
            "rule": "per pair and W: the range of its counted cells' ratio errors, widened on both sides by the "
                    "median over every pair of how far its error moved between that W's links",
            "link_move_pct": {str(w): round(m, 2) for w, m in link_moves(cells).items()},
            "bands": bands(cells), "pair_columns": list(PAIR_COLUMNS),
            "pair_cells": [[_rounded(c.get(k)) for k in PAIR_COLUMNS] for c in cells]}


def _rounded(x):
    return round(x, 5) if isinstance(x, float) else x


def write(data: dict, path: str) -> Path:
    """The pair file, its lists one entry a line (a diff of a re-derivation reads line by line)."""
    head = {k: v for k, v in data.items() if not isinstance(v, list) or k == "pair_columns"}
    lists = [k for k, v in data.items() if isinstance(v, list) and k != "pair_columns"]
    text = json.dumps(head, indent=1)[:-2] + "".join(
        f',\n "{k}": [\n' + ",\n".join(f"  {json.dumps(x)}" for x in data[k]) + "\n ]" for k in lists) + "\n}\n"
    out = Path(path)
    out.write_text(text)
    return out
