"""Adversarial review (break1): the tokens file's pool scopes."""

from __future__ import annotations

from app import tokens

TOKEN = "tenancy-break1-token-0123456789"


def test_a_pool_named_like_a_dns_subdomain_can_be_scoped():
    """A ProxyPool's name is a DNS subdomain (dots allowed; the controller takes up to 63
    characters, a label value): ``eu.west-1`` is a pool the controller runs.  The tokens file must
    accept ``team-a/eu.west-1`` as a scope; it refuses it as "not <namespace>/<pool name>", so such
    a pool's members can only be leased by widening the client to the whole namespace."""
    client, = tokens.parse({"clients": [{"name": "a", "token": TOKEN, "pools": ["team-a/eu.west-1"]}]}, "tokens.yaml")
    assert client.scope.allows("team-a", "eu.west-1") and not client.scope.allows("team-a", "eu")
