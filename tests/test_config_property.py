"""Property: whatever a config file holds, load_config succeeds or raises one ConfigError line.

Hypothesis mutates valid configs at random (values replaced by values of any YAML type, keys
deleted or added, the YAML text itself edited character by character) and loads each result
from a real file. A traceback reaching the user would show up here as a non-ConfigError.
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.config import ConfigError, SweepConfig, TrialSpec, load_config

VALID = [
    {
        "name": "prop",
        "workload": {"name": "mlp_digits", "steps": 30, "global_batch_size": 64, "lr": 0.05,
                     "optimizer": "sgd", "eval_every": 10, "warmup_steps": 2, "grad_accumulation": 2},
        "search": {"hooks": ["allreduce", {"name": "quantization_perchannel", "chunk_size": [128, 512]}],
                   "world_size": [1, 2], "seed": [0, 1]},
        "resources": {"cpus_per_worker": 0.5, "use_gpu": False, "max_concurrent_trials": 1},
        "stop": {"on_nan": True},
    },
    {
        "name": "prop-faults",
        "workload": {"name": "mlp_digits", "steps": 60, "global_batch_size": 64, "lr": 0.05},
        "search": {"hooks": ["fp16_compress", {"name": "powersgd", "rank": [1, 2], "start_iter": 5}],
                   "world_size": 2, "seed": 3},
        "faults": [{"kind": "scale_grad", "step": 20, "rank": 0, "factor": 1.0e6},
                   {"kind": "nan_grad", "step": 40, "rank": 1}],
        "checkpoint": {"every": 10, "max_failures": 1},
        "tracking": {"flush_seconds": 2.0, "fidelity_every": 5},
        "storage_path": "/tmp/ray_results",
    },
]

# Identifier-ish text only: a workload name "pkg.mod:fn" is imported, and a random string must
# not happen to name a real module with side effects.
words = st.text(alphabet="abcdeklmnoprstuwz_.:-0123456789 ", max_size=12)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**15), 10**15), st.integers(-3, 5000),
    st.floats(allow_nan=True, allow_infinity=True), words,
    st.sampled_from(["allreduce", "quantization_perchannel", "powersgd", "mlp_digits", "sgd", "adamw",
                     "crash", "nan_grad", "scale_grad", "chunk_size", "rank", ""]),
)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(words, inner, max_size=3),
                      max_leaves=8)
keys = st.one_of(words, st.sampled_from(["name", "steps", "chunk_size", "chunksize", "world_size", "seed", "lr",
                                         "factor", "rank", "kind", "step", "every", "hooks", "faults"]))


def paths(node, prefix=()):
    """Every location in a config tree, containers included."""
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from paths(v, prefix + (i,))


def get(node, path):
    for p in path:
        node = node[p]
    return node


@st.composite
def mutated_configs(draw):
    cfg = copy.deepcopy(draw(st.sampled_from(VALID)))
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(list(paths(cfg))))
        op = draw(st.sampled_from(["replace", "delete", "add", "nudge"]))
        if not where:  # the whole document
            cfg = draw(values) if op == "replace" else cfg
            continue
        parent, last = get(cfg, where[:-1]), where[-1]
        if op == "replace":
            parent[last] = draw(values)
        elif op == "nudge":  # a plausible value of the same type: keeps some configs valid
            current = parent[last]
            if isinstance(current, bool):
                parent[last] = draw(st.booleans())
            elif isinstance(current, int):
                parent[last] = draw(st.integers(-1, 130))
            elif isinstance(current, float):
                parent[last] = draw(st.floats(0, 3))
            elif isinstance(current, str):
                parent[last] = draw(st.sampled_from(["allreduce", "bf16_compress", "quantization_pertensor",
                                                     "mlp_digits", "cnn_digits", "adamw", "crash", "x"]))
            elif isinstance(current, list) and current:
                parent[last] = current[: draw(st.integers(0, len(current)))]
        elif op == "delete":
            del parent[last]
        elif isinstance(parent, dict):
            parent[draw(keys)] = draw(values)
        else:
            parent.insert(last, draw(values))
        if not isinstance(cfg, (dict, list)):
            break
    text = yaml.safe_dump(cfg, sort_keys=False)
    if draw(st.booleans()):  # edit the text itself: syntax errors, odd indentation, stray characters
        for _ in range(draw(st.integers(1, 3))):
            at = draw(st.integers(0, len(text)))
            if draw(st.booleans()):
                text = text[:at] + draw(st.sampled_from(list(":-[]{}#&*!|>'\"\t\n ,?%@`") + ["\x00", "é"])) + text[at:]
            else:
                text = text[:at] + text[at + 1:]
    return text


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=mutated_configs())
def test_any_mutation_loads_or_is_one_config_error(text):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mutated.yaml"
        path.write_text(text)
        try:
            cfg, _ = load_config(str(path))
        except ConfigError as exc:
            message = str(exc)
            assert message and "\n" not in message and "Traceback" not in message
            assert message.startswith(str(path)), message  # it names the file
            assert "could not load the config" not in message, message  # load_config's net for our own bugs
            return
    # accepted: it must then be a config the sweep can run
    assert isinstance(cfg, SweepConfig)
    trials = cfg.trials()
    assert trials and len({t.key for t in trials}) == len(trials)
    assert len({t.run_name for t in trials}) == len(trials)
    for trial in trials:
        assert cfg.workload.global_batch_size % (trial.world_size * cfg.workload.grad_accumulation) == 0
        assert TrialSpec.from_dict(trial.to_dict()) == trial


def test_the_unmutated_configs_are_valid(tmp_path):
    for i, data in enumerate(VALID):
        path = tmp_path / f"valid{i}.yaml"
        path.write_text(yaml.safe_dump(data))
        cfg, _ = load_config(str(path))
        assert cfg.trials()
