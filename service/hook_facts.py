"""What the service reads about a hook from its HookSpec (hooks/spec.py) instead of its name:
whether it is chunked and its chunk size, whether its wire is 16-bit. A trial record may name a
hook this version no longer registers: it then has no such facts (None / False). The hooks
library is imported on first use: service.config stays free of torch until it validates."""

from __future__ import annotations

from typing import Any, Optional


def _spec(hook: str):
    import hooks  # late: it pulls in torch

    return hooks.available().get(hook)


def chunk_size(hook: str, params: dict[str, Any]) -> Optional[int]:
    """The chunk size of a chunked hook's configuration (its default when ``params`` lacks it),
    None for any other hook: it names the configuration (run names, tables, line styles)."""
    spec = _spec(hook)
    return spec.chunk_size(params) if spec is not None else None


def is_chunk_size(hook: str, param: str) -> bool:
    """Is ``param`` the chunk size of the chunked hook ``hook``?"""
    from hooks.spec import CHUNK_SIZE

    return param == CHUNK_SIZE and chunk_size(hook, {}) is not None


def sixteen_bit(hook: str) -> bool:
    """Does the hook put 16 bits per gradient value on the wire (fp16/bf16 casts)?"""
    spec = _spec(hook)
    return spec is not None and spec.wire_bits == 16


def label_parts(hook: str, params: dict[str, Any]) -> Optional[list[str]]:
    """The parts after the hook's name that name its configuration where its spec says them
    (``HookSpec.label``: post_local_sgd's ``p16``), None where the parameters' default naming does."""
    spec = _spec(hook)
    if spec is None or spec.label is None:
        return None
    return spec.label({**spec.params, **params})


def periodic(hook: str) -> bool:
    """Does the hook exchange every ``period`` steps after the optimizer step (local SGD, DiLoCo)?"""
    spec = _spec(hook)
    return spec is not None and spec.periodic


def names_configuration(hook: str, param: str) -> bool:
    """Is ``param`` shown with every configuration of ``hook`` even at its default (tables, the
    sweep's closing table): a chunked hook's chunk size, a periodic hook's period."""
    return is_chunk_size(hook, param) or (param == "period" and periodic(hook))
