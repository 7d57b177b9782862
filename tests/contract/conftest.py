"""Fixtures of the contract suites: one implementation of an interface per parameter."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
from switchyard.state import MemoryStateStore, StateStore
from switchyard.state.redis_store import RedisStateStore

StoreMaker = Callable[[str], StateStore]


@pytest.fixture(
    params=[
        "memory",
        pytest.param("redis", marks=pytest.mark.integration),
        # TLS only and an ACL user, as managed Redis services run (deploy/local/redis-tls.sh).
        pytest.param("redis-tls-acl", marks=pytest.mark.integration),
    ]
)
async def make_store(request: pytest.FixtureRequest) -> AsyncIterator[StoreMaker]:
    """Makes stores (clients) that share one backing store; clears and closes them after."""
    made: list[StateStore] = []
    if request.param in ("redis", "redis-tls-acl"):
        fixture = "redis_url" if request.param == "redis" else "redis_tls_url"
        url = request.getfixturevalue(fixture)

        def make(prefix: str) -> StateStore:
            store = RedisStateStore(url, prefix=prefix)
            made.append(store)
            return store

    else:
        shared = MemoryStateStore("")

        def make(prefix: str) -> StateStore:
            store = shared.sharing(prefix)
            made.append(store)
            return store

    yield make
    for store in made:
        await store.clear_prefix()
        await store.close()


@pytest.fixture
def store(make_store: StoreMaker, unique_prefix: str) -> StateStore:
    """One store under a prefix no other test uses."""
    return make_store(unique_prefix)
