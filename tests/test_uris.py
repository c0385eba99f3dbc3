"""service/uris.py: what a tracking URI or a storage path names, the one reading that the sweep,
the cluster checks and the job submission share."""
from pathlib import Path

import pytest

from service import uris


@pytest.mark.parametrize("uri, kind, path", [
    (None, "file", None),
    ("", "file", None),
    ("mlruns", "file", "mlruns"),
    ("/srv/mlruns", "file", "/srv/mlruns"),
    ("file:mlruns", "file", "mlruns"),
    ("file:///srv/mlruns", "file", "/srv/mlruns"),
    ("sqlite:///mlflow.db", "sqlite", "mlflow.db"),
    ("sqlite:////srv/mlflow.db", "sqlite", "/srv/mlflow.db"),
    ("http://127.0.0.1:5000", "server", None),
    ("https://mlflow.example.org", "server", None),
    ("databricks", "hosted", None),
    ("postgresql://u@db/mlflow", "database", None),
])
def test_tracking_uris_are_classified_with_the_path_they_name(uri, kind, path):
    store = uris.tracking_store(uri)
    assert (store.kind, store.path) == (kind, path)
    assert store.local == (kind in ("sqlite", "file"))
    assert uris.is_server(uri or "") == (kind == "server")


@pytest.mark.parametrize("uri, loopback", [
    ("http://127.0.0.1:5000", True), ("http://localhost:5000", True), ("https://[::1]:5000", True),
    ("http://10.0.0.1:5000", False), ("http://mlflow:5000", False), ("sqlite:///mlflow.db", False),
])
def test_a_server_on_a_loopback_address_is_told_apart(uri, loopback):
    assert uris.tracking_store(uri).loopback is loopback


def test_storage_paths_local_or_remote_and_joined_accordingly(tmp_path):
    assert uris.local_dir(str(tmp_path)) == tmp_path
    assert uris.local_dir(f"file://{tmp_path}") == tmp_path
    assert uris.local_dir("s3://bucket/sweeps") is None
    assert uris.join("s3://bucket/sweeps/", "a", "trials") == "s3://bucket/sweeps/a/trials"
    assert uris.join(str(tmp_path), "a", "trials") == str(Path(tmp_path, "a", "trials"))
