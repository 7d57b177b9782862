"""Switchyard against a Redis that takes TLS only and an ACL user (as managed Redis
services run), started by deploy/local/redis-tls.sh. Every state-store, ledger, lease and
quota contract runs against it too (the ``redis-tls-acl`` parameter of
tests/contract/conftest.py); these tests show what the configuration refuses, and that
the password never shows in an error."""

from __future__ import annotations

from urllib.parse import urlparse

import pytest
from switchyard.errors import StateError
from switchyard.state.redis_store import RedisStateStore


async def test_the_acl_user_reaches_its_keys_and_no_others(
    redis_tls_url: str, unique_prefix: str
) -> None:
    password = urlparse(redis_tls_url).password
    assert password
    own = RedisStateStore(redis_tls_url, prefix=unique_prefix)
    other = RedisStateStore(redis_tls_url, prefix="elsewhere:")
    try:
        await own.set("k", "v")
        assert await own.get("k") == "v"
        with pytest.raises(StateError) as refused:
            await other.set("k", "v")
        assert not refused.value.retriable
        assert "no permissions" in str(refused.value)
        assert password not in str(refused.value)
    finally:
        await own.clear_prefix()
        await own.close()
        await other.close()


async def test_a_wrong_password_or_plaintext_is_refused_without_showing_the_secret(
    redis_tls_url: str, unique_prefix: str
) -> None:
    password = urlparse(redis_tls_url).password
    assert password
    wrong = RedisStateStore(
        redis_tls_url.replace(password, "not-the-password"), prefix=unique_prefix
    )
    plaintext = RedisStateStore(
        redis_tls_url.replace("rediss://", "redis://").split("?")[0],
        prefix=unique_prefix,
        timeout_s=2.0,
    )
    try:
        with pytest.raises(StateError) as bad_password:
            await wrong.get("k")
        assert "invalid username-password pair" in str(bad_password.value)
        with pytest.raises(StateError) as not_tls:
            await plaintext.get("k")
        for error in (bad_password.value, not_tls.value):
            assert password not in str(error)
            assert "not-the-password" not in str(error)
    finally:
        await wrong.close()
        await plaintext.close()
