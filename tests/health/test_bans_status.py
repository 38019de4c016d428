"""What the probes do with ban state: a new egress IP takes the proxy's targeted leases with it,
and the Proxy status counts the targets that banned its egress IP.  Real Squids on loopback,
real lease scripts on a real Redis, the Kubernetes API fake."""

from __future__ import annotations

import dataclasses

import pytest
import requests

from app.resources import GROUP, PLURAL, VERSION
from app.serving import leases, view as serving
from app.serving.bans import BanSettings, Target
from app.serving.leases import LeaseSettings
from app.squid import conf as squid_conf
from devcluster.squid import SquidProcess, loopback_policy
from tests.health.fleet import start_squid

pytestmark = pytest.mark.timeout(90)

ANY = leases.Filters()
LEASES = LeaseSettings(default_ttl=60, max_ttl=600, cooldown=30, sticky_ttl=600, record_grace=60)


def _lease(r, client: str, target: str, bans: BanSettings) -> leases.Lease:
    return leases.acquire(r, client, ANY, ttl=60, settings=LEASES, target=Target.of(target, bans), bans=bans)


def _restart_leaving_from(sq: SquidProcess, egress: str) -> SquidProcess:
    """Stop ``sq`` and start a Squid on the same address and port whose connections leave from
    ``egress`` (a VM whose DHCP lease gave it another public address)."""
    sq.stop()
    policy = loopback_policy(squid_conf.SquidPolicy())
    policy = dataclasses.replace(policy, extra=(*policy.extra, f"tcp_outgoing_address {egress}"))
    return SquidProcess(sq.address, sq.port, conf=squid_conf.render(sq.port, policy)).start()


def test_a_probe_that_learns_a_new_egress_ip_moves_the_targeted_leases_to_it(fleet, settings, squids,
                                                                            next_address):
    bans = BanSettings()
    settings = dataclasses.replace(settings, egress_refresh=0.0)  # learn the egress IP at every probe
    old_ip, new_ip = next_address(), next_address()
    sq = squids(start_squid(old_ip))
    moving = fleet.external("moving", sq.address, sq.port, max_leases=1, health={"successThreshold": 1})
    fleet.probe([moving], settings)
    assert serving.get(fleet.r, moving.uid)["egressIP"] == old_ip
    held = _lease(fleet.r, "a", "shop.example", bans)
    assert held.uid == moving.uid
    # another proxy already leaves from the address the first one is about to get
    there = squids(start_squid(new_ip))
    resident = fleet.external("resident", there.address, there.port, health={"successThreshold": 1})
    fleet.probe([resident], settings)
    assert serving.get(fleet.r, resident.uid)["egressIP"] == new_ip

    sq = squids(_restart_leaving_from(sq, new_ip))
    fleet.probe([moving], settings)
    assert serving.get(fleet.r, moving.uid)["egressIP"] == new_ip
    # the live lease for the site now leaves through the new IP, which is at its limit of one
    with pytest.raises(leases.LeaseError) as info:
        _lease(fleet.r, "b", "shop.example", bans)
    assert info.value.limited == {"banned": 0, "busy": 1}
    # every other site is still served through it
    assert _lease(fleet.r, "b", "news.example", bans).uid == resident.uid
    # the lease's end frees the new IP for the site
    leases.release(fleet.r, "a", held.id, outcome="ok", settings=LEASES, bans=bans)
    assert _lease(fleet.r, "b", "shop.example", bans).egress_ip == new_ip


def _ban(r, target: str, bans: BanSettings) -> None:
    """A crawler's lease for ``target`` through the only proxy, released ``blocked``."""
    held = _lease(r, "crawler", target, bans)
    assert leases.release(r, "crawler", held.id, outcome="blocked", settings=LEASES, bans=bans).banned


def test_the_proxy_status_counts_the_targets_that_banned_its_egress_ip(fake, fleet, settings, squids,
                                                                       next_address):
    bans = BanSettings()
    sq = squids(start_squid(next_address()))
    px = fleet.external("burned", sq.address, sq.port, max_leases=4, health={"successThreshold": 1})
    fleet.probe([px], settings)
    assert fleet.read("default", "burned").status["bannedTargets"] == 0
    _ban(fleet.r, "shop.example", bans)
    _ban(fleet.r, "news.example", bans)
    writes = fake.request_count("patch", "proxies/status")
    report = fleet.probe([px], settings)
    assert report.status_written == 1
    assert fleet.read("default", "burned").status["bannedTargets"] == 2
    # no change: no write
    fleet.probe([px], settings)
    assert fake.request_count("patch", "proxies/status") == writes + 1
    # kubectl get px: the Burned column
    table = requests.get(f"{fake.url}/apis/{GROUP}/{VERSION}/namespaces/default/{PLURAL}/burned", timeout=5,
                         headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}).json()
    names = [c["name"] for c in table["columnDefinitions"]]
    [row] = table["rows"]
    assert row["cells"][names.index("Burned")] == 2
