"""A test's MLflow SQLite store, its schema copied from a template made once per test process.

Creating a SQLite store runs MLflow's schema migrations (about fifty alembic revisions): 1.85 s of
CPU here, paid by the first process of every sweep that opened a new store, 30-odd times a suite.
The template is MLflow's own, made by MLflow in this process; a store copied from it is the same
file a sweep would have made. The smoke sweep (tests/conftest.py) and the tests of what a refused
sweep leaves behind still start from nothing, as a user's first run does.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

STORE = "mlflow.db"


@functools.cache
def _template() -> Path:
    from mlflow.tracking import MlflowClient

    directory = Path(tempfile.mkdtemp(prefix="mlflow-template-"))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    MlflowClient(tracking_uri=f"sqlite:///{directory / STORE}").search_experiments()  # creates the schema
    return directory / STORE


def store_uri(directory: Path) -> str:
    """``sqlite:///DIRECTORY/mlflow.db``, the file made from the template unless it is there already
    (a resumed sweep's store is its own)."""
    path = Path(directory) / STORE
    if not path.exists():
        shutil.copyfile(_template(), path)
    return f"sqlite:///{path}"
