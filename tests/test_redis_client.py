"""REDIS_URL forms (app/store/client.py): one Redis, or Sentinels and a master name; what
Celery's broker and redbeat are given for each; bad Sentinel URLs named clearly."""

from __future__ import annotations

import pytest

from app.store.client import celery_broker, parse_sentinel_url, redbeat_settings
from app.config.settings import compose_redis_url, redis_url_from_env

URL = "redis+sentinel://s0:26379,s1:26380,s2/proxy-operator/2"


def test_a_sentinel_url_names_the_sentinels_the_master_and_the_database():
    target = parse_sentinel_url(URL)
    assert target.sentinels == (("s0", 26379), ("s1", 26380), ("s2", 26379))
    assert (target.master, target.db, target.username, target.password) == ("proxy-operator", 2, None, None)
    assert parse_sentinel_url("sentinel://[::1]:5000/m").sentinels == (("::1", 5000),)
    assert parse_sentinel_url("redis://redis:6379/0") is None


def test_credentials_from_redis_password_and_username_go_to_the_master_for_every_client(monkeypatch):
    monkeypatch.setenv("REDIS_URL", URL)
    monkeypatch.setenv("REDIS_USERNAME", "worker")
    monkeypatch.setenv("REDIS_PASSWORD", "p@ss:w/rd")
    url = redis_url_from_env()
    target = parse_sentinel_url(url)
    assert (target.username, target.password) == ("worker", "p@ss:w/rd")
    broker, options = celery_broker(url)
    assert broker == ("sentinel://worker:p%40ss%3Aw%2Frd@s0:26379/2;sentinel://worker:p%40ss%3Aw%2Frd@s1:26380/2;"
                      "sentinel://worker:p%40ss%3Aw%2Frd@s2:26379/2")
    assert options["master_name"] == "proxy-operator"
    beat_url, beat_options = redbeat_settings(url)
    assert beat_url == "redis-sentinel://"
    assert beat_options["sentinels"] == [("s0", 26379), ("s1", 26380), ("s2", 26379)]
    assert (beat_options["service_name"], beat_options["db"]) == ("proxy-operator", 2)
    assert (beat_options["username"], beat_options["password"]) == ("worker", "p@ss:w/rd")


def test_the_sentinels_own_password_is_redis_sentinel_password(monkeypatch):
    monkeypatch.setenv("REDIS_SENTINEL_PASSWORD", "sentinel-secret\n")
    assert celery_broker(URL)[1]["sentinel_kwargs"]["password"] == "sentinel-secret"
    assert redbeat_settings(URL)[1]["sentinel_kwargs"]["password"] == "sentinel-secret"


def test_a_single_redis_url_is_left_as_it_was():
    assert celery_broker("redis://:pw@redis:6379/0") == ("redis://:pw@redis:6379/0", {})
    assert redbeat_settings("redis://redis:6379/0") == ("redis://redis:6379/0", {})
    assert compose_redis_url("redis://redis:6379/0", "pw") == "redis://:pw@redis:6379/0"


@pytest.mark.parametrize("url, problem", [
    ("redis+sentinel://s0:26379", "the master name is missing"),
    ("redis+sentinel://s0:26379/m/x", "the database number 'x'"),
    ("redis+sentinel://s0:26379/m/0/extra", "the path is /<master name>/<db>"),
    ("redis+sentinel://s0:99999/m", "Sentinel 's0' has a bad port '99999'"),
    ("redis+sentinel://s0:26379,/m", "a Sentinel host is empty"),
    ("sentinel://s0:26379;sentinel://s1:26379/m", "separate the Sentinel hosts with ','"),
    ("redis+sentinel://s0/m?ssl=1", "takes no query"),
])
def test_a_malformed_sentinel_url_is_refused_naming_what_is_wrong(monkeypatch, url, problem):
    monkeypatch.setenv("REDIS_URL", url)
    monkeypatch.setenv("REDIS_PASSWORD", "never-shown")
    with pytest.raises(ValueError) as err:
        redis_url_from_env()
    assert "REDIS_URL" in str(err.value) and problem in str(err.value)
    assert "never-shown" not in str(err.value)
