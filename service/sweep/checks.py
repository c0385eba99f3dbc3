"""Checks before any trial starts, each refusing in one line (SweepError): the tracking store
answers, and the cluster can place the largest trial and reach the sweep's store and storage."""

from __future__ import annotations

from service import uris
from service.sweep.cluster import ClusterConfigError, alive_nodes, check_storage_for_cluster, check_tracking_uri_for_cluster
from service.config import SweepConfig, TrialSpec
from service.sweep.capacity import check_fits
from service.sweep.errors import SweepError
from service.text import one_line


def check_tracking_store(uri: str, timeout_s: float = 5.0) -> None:
    """Fail in the first seconds, naming the URI, when the tracking store does not answer.

    MLflow's client retries an unreachable server for minutes; a server is probed here on
    its /health endpoint with a short timeout instead. Other stores (SQLite, file) are
    opened once.
    """
    from service import tracking

    if uris.is_server(uri):
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s) as reply:
                if reply.status == 200:
                    return
                reason = f"HTTP {reply.status}"
        except urllib.error.HTTPError as exc:
            reason = f"HTTP {exc.code}"
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = one_line(getattr(exc, "reason", None) or exc) if not isinstance(exc, ValueError) else str(exc)
        raise SweepError(f"the MLflow tracking server {uri} does not answer ({reason}); start it, "
                         f"or fix/unset MLFLOW_TRACKING_URI (unset: ./mlflow.db)")
    try:
        tracking.client(uri).search_experiments(max_results=1)
    except Exception as exc:
        raise SweepError(f"cannot open the MLflow tracking store {uri}: {one_line(exc)}; "
                         f"fix or unset MLFLOW_TRACKING_URI (unset: ./mlflow.db)") from None


def check_cluster(cfg: SweepConfig, trials: list[TrialSpec], tracking_uri: str, storage: str) -> None:
    """Before any trial starts: the largest trial fits the cluster, and on a multi-host
    cluster the tracking store and the storage path are reachable from every host."""
    import ray

    total = ray.cluster_resources()
    nodes = alive_nodes(ray.nodes())
    check_fits(cfg, trials, where="this Ray cluster", cpus=total.get("CPU", 0), gpus=total.get("GPU", 0),
               largest_node_cpus=max((n.get("Resources", {}).get("CPU", 0) for n in nodes), default=0))
    if cfg.network is not None and len(nodes) > 1:
        raise SweepError(f"network: emulated hosts are namespaces on one machine, and this Ray cluster has "
                         f"{len(nodes)} nodes: run it on a single-node (local) Ray, or remove network:")
    try:
        check_tracking_uri_for_cluster(tracking_uri, nodes)
        check_storage_for_cluster(storage, nodes)
    except ClusterConfigError as exc:
        raise SweepError(str(exc)) from None

