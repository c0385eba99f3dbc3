"""What a tracking URI or a storage path names: one home for reading them.

The sweep, the cluster checks and the job submission each decide something from a tracking URI
(is it a server? a SQLite file? a local file store? on a loopback address? relative to the
working directory?) or a storage path (a local directory, or a URI such as s3://... that every
host reaches); they all ask here, so that "local" means the same thing everywhere.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

HOSTED_SCHEMES = ("databricks", "databricks-uc")  # MLflow's hosted servers, named by scheme alone


@dataclass(frozen=True)
class TrackingStore:
    """What an MLflow tracking URI names.

    kind: ``server`` (http/https), ``hosted`` (databricks), ``sqlite`` (a database file),
    ``file`` (a local file store: a bare path, ``file:...``, or unset: MLflow's default ./mlruns),
    ``database`` (any other URI: postgresql://, mysql://, ..., a server of its own).
    path: the file or directory a ``sqlite``/``file`` store names, as written (may be relative;
    None where the URI names none). host: a ``server``'s host name.
    """

    uri: str
    kind: str
    path: str | None = None
    host: str | None = None

    @property
    def local(self) -> bool:
        """A file on this machine (SQLite or a file store): other hosts cannot write it."""
        return self.kind in ("sqlite", "file")

    @property
    def loopback(self) -> bool:
        """A server on a loopback address: on each host it names that host itself."""
        return self.kind == "server" and is_loopback_host(self.host or "")


def tracking_store(uri: str | None) -> TrackingStore:
    """Classify a tracking URI (None or empty: MLflow's default local file store)."""
    uri = uri or ""
    if uri.split(":", 1)[0] in HOSTED_SCHEMES:
        return TrackingStore(uri, "hosted")
    parsed = urlparse(uri)
    scheme = parsed.scheme.lower()
    if scheme in ("http", "https"):
        return TrackingStore(uri, "server", host=parsed.hostname or "")
    if scheme == "sqlite":
        return TrackingStore(uri, "sqlite", uri[len("sqlite:///"):] if uri.startswith("sqlite:///") else None)
    if scheme == "file":
        return TrackingStore(uri, "file", parsed.path if uri.startswith("file://") else uri[len("file:"):])
    if scheme == "" or len(scheme) == 1:  # a bare path (len 1: a Windows drive letter)
        return TrackingStore(uri, "file", uri or None)
    return TrackingStore(uri, "database")


def is_server(uri: str) -> bool:
    """An MLflow tracking server (http or https): probed on /health rather than opened."""
    return tracking_store(uri).kind == "server"


def is_loopback_host(host: str) -> bool:
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def is_remote(storage_path: str) -> bool:
    """A storage URI (s3://, gs://, file://...) rather than a plain directory path."""
    return "://" in storage_path


def local_dir(storage_path: str) -> Path | None:
    """The directory a storage path names on this host, or None for a remote URI (s3://...)."""
    parsed = urlparse(storage_path)
    if parsed.scheme.lower() == "file":
        return Path(parsed.path)
    if is_remote(storage_path):
        return None
    return Path(storage_path)


def join(root: str, *parts: str) -> str:
    """``root``/``parts``: with '/' under a storage URI, as a path under a directory."""
    return "/".join([root.rstrip("/"), *parts]) if is_remote(root) else str(Path(root, *parts))
