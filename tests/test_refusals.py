"""Refusals that arrive (issue 27, item 1).

A start-of-trial refusal is raised inside a Ray Train worker; Ray pickles it to carry it to
the driver. An exception that does not survive a pickle round trip reaches the user as
"WorkerHealthCheckFailedError: A worker health check failed." instead of its own line.
"""
from __future__ import annotations

import importlib
import inspect
import pickle
import pkgutil

import pytest

import service


def _service_exception_classes() -> list[type[BaseException]]:
    """Every exception class defined in a module of the service package (walked, not listed:
    a new one is covered without touching this test)."""
    found = {}
    for info in pkgutil.walk_packages(service.__path__, prefix="service."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for obj in vars(module).values():
            if (inspect.isclass(obj) and issubclass(obj, BaseException)
                    and obj.__module__ == module.__name__):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return [found[k] for k in sorted(found)]


def _an_instance(cls: type[BaseException]) -> BaseException:
    """The class built with a distinct string for every required argument (positional or
    keyword-only), as the service raises it."""
    if "__init__" not in {k for c in cls.__mro__ if c.__module__.startswith("service") for k in vars(c)}:
        return cls("the message")  # BaseException's own constructor
    args, kwargs = [], {}
    for p in inspect.signature(cls).parameters.values():
        if p.default is not inspect.Parameter.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        value = f"{p.name} text"
        if p.kind == p.KEYWORD_ONLY:
            kwargs[p.name] = value
        else:
            args.append(value)
    return cls(*args, **kwargs)


def test_the_walk_finds_the_service_exceptions():
    names = {c.__name__ for c in _service_exception_classes()}
    assert {"WorkloadError", "ConfigError", "FieldProblem", "SweepError", "StoreError"} <= names, names


@pytest.mark.parametrize("cls", _service_exception_classes(), ids=lambda c: c.__qualname__)
def test_every_service_exception_survives_a_pickle_round_trip_with_its_message(cls):
    err = _an_instance(cls)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls
    assert str(back) == str(err)
    assert vars(back) == vars(err)  # the typed fields (a ConfigError's field, a FieldProblem's field)


def test_a_workload_error_keeps_its_one_line_through_pickle():
    from service.preflight import WorkloadError

    err = pickle.loads(pickle.dumps(WorkloadError("x", "bad\nthing")))
    assert str(err) == "workload 'x': bad thing"
