"""The Redis client factory: its options land on the clients, the clients talk to a real
Redis, and a password in the URL shows nowhere."""

from __future__ import annotations

import logging

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from common.redis_client import RedisFactory, redacted_url

SECRET_URL = "redis://user:s3cret-pw@127.0.0.1:6379/0"


def test_an_async_client_gets_the_callers_timeouts_and_the_shared_defaults() -> None:
    client = RedisFactory(SECRET_URL, name="replica-1").client("quotas", 0.25, retries=1)
    kwargs = client.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == 0.25
    assert kwargs["socket_connect_timeout"] == 0.25  # connecting waits as long as a command
    assert kwargs["client_name"] == "replica-1:quotas"
    assert kwargs["decode_responses"] is False
    retry = kwargs["retry"]
    assert retry.get_retries() == 1
    assert retry._supported_errors == (RedisConnectionError,)  # never a timed-out command


def test_a_connect_timeout_of_its_own_and_decoded_responses() -> None:
    factory = RedisFactory(SECRET_URL)
    client = factory.client("tail", 2.5, connect_timeout_s=0.5, decode_responses=True)
    kwargs = client.connection_pool.connection_kwargs
    assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (2.5, 0.5)
    assert kwargs["decode_responses"] is True
    assert kwargs["retry"].get_retries() == 0  # by default no retries at all


def test_a_blocking_client_gets_the_same_defaults() -> None:
    client = RedisFactory(SECRET_URL).blocking_client("reports", 10.0)
    kwargs = client.connection_pool.connection_kwargs
    assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (10.0, 10.0)
    assert kwargs["client_name"] == "gateway:reports"
    assert kwargs["retry"].get_retries() == 0


async def test_an_async_client_round_trips_and_names_its_connection(redis_url: str) -> None:
    client = RedisFactory(redis_url, name="test").client("ping", 2.0)
    try:
        assert await client.ping() is True
        assert await client.client_getname() == "test:ping"  # redis-py decodes it
    finally:
        await client.aclose()


def test_a_blocking_client_round_trips(redis_url: str) -> None:
    client = RedisFactory(redis_url).blocking_client("reports", 2.0, connect_timeout_s=1.0)
    try:
        assert client.ping() is True
        assert client.client_getname() == "gateway:reports"
    finally:
        client.close()


def test_the_password_shows_in_no_repr_and_no_log(caplog: pytest.LogCaptureFixture) -> None:
    factory = RedisFactory(SECRET_URL)
    caplog.set_level(logging.DEBUG)
    logging.getLogger("test").info("state in %s", factory)
    shown = [repr(factory), str(factory), caplog.text]
    shown += [repr(factory.client("x", 1.0)), repr(factory.blocking_client("y", 1.0))]
    for text in shown:
        assert "s3cret-pw" not in text
    assert repr(factory) == "RedisFactory('redis://127.0.0.1:6379/0', name='gateway')"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://user:pw@10.0.0.5:6379/0", "redis://10.0.0.5:6379/0"),
        ("rediss://:pw@cache:6380", "rediss://cache:6380"),
        ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379"),
    ],
)
def test_redacted_url(url: str, shown: str) -> None:
    assert redacted_url(url) == shown
