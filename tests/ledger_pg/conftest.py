"""Fixtures of the PostgreSQL ledger tests (:mod:`tests.ledger_pg.pg_servers`): ``pg_url`` a
throwaway database on the machine's server for the whole session, ``fresh_pg`` a new one per
test, ``private_pg`` a cluster of the test module's own that a test may stop and start. Each
skips with the reason only when no server could be reached (``make test`` starts one)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ledger_pg.pg_servers import PrivateCluster, admin_url, create_db, drop_db, free_port, pg_bin


@pytest.fixture(scope="session")
def pg_admin() -> str:
    url = admin_url()
    if url is None:
        pytest.skip("no PostgreSQL reachable on 127.0.0.1:5432 / :55432 (run `make postgres`)")
    return url


@pytest.fixture
def fresh_pg(pg_admin: str) -> Iterator[str]:
    url = create_db(pg_admin)
    yield url
    drop_db(pg_admin, url)


@pytest.fixture(scope="module")
def private_pg() -> Iterator[PrivateCluster]:
    if pg_bin() is None:
        pytest.skip("Debian's postgresql binaries missing (run `make postgres`)")
    # not under pytest's temp root: that is private to root, and the cluster runs as postgres
    root = Path(tempfile.mkdtemp(prefix="prefixgate-pg-"))
    cluster = PrivateCluster(root / "data", free_port())
    cluster.start()
    yield cluster
    try:
        cluster.stop()
    except Exception:
        pass
    shutil.rmtree(root, ignore_errors=True)
