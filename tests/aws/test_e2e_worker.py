"""End to end through the real processes: watcher, Celery worker and beat, with an aws provider
whose endpointUrl is moto's EC2 in server mode (behind the recording front).

``kubectl apply`` of the aws sample takes the Proxy to Running (the instance launched with the
Secret's cloud-init inside its user-data, tagged, in the sample's zone) and ``kubectl delete``
terminates the instance and releases the Proxy.  Quota errors (``InstanceLimitExceeded``,
``InsufficientInstanceCapacity``) show as the ``QuotaExceeded`` condition with the long quota
backoff before the next attempt; a first DescribeInstances that does not show the new instance
(EC2's eventually consistent reads) keeps the Proxy Provisioning, not lost.
"""

from __future__ import annotations

import base64
import gzip
from email import message_from_bytes
from pathlib import Path

import pytest
import yaml
from kubernetes import client as k8s

from app.resources import GROUP, PLURAL, VERSION
from devcluster.cluster import FakeCluster
from tests.aws.conftest import ACCESS_KEY, REGION, SECRET_KEY
from tests.support.processes import celery_beat, celery_worker, watcher
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "deploy" / "samples" / "proxy_aws.yaml"
QUOTA_BACKOFF = 3.0
RUNNING = ("Running", "Ready", "Unhealthy")


@pytest.fixture()
def cluster():
    with FakeCluster(kubelet=False, bookmark_interval=1.0) as c:
        yield c


@pytest.fixture()
def operator(cluster, moto, ami, credentials_file, redis_url, tmp_path):
    """watcher + worker + beat, configured with the sample's aws provider pointed at moto."""
    providers = tmp_path / "providers.yaml"
    providers.write_text(yaml.safe_dump({"providers": [{
        "name": "aws-eu", "type": "aws", "checkInterval": "10s",
        "aws": {"region": REGION, "zones": ["eu-west-1a", "eu-west-1b"], "endpointUrl": moto.url,
                "credentialsFile": credentials_file, "ami": "ssm:/proxy-operator/test/ami", "maxAttempts": 1,
                "requestTimeout": "5s", "securityGroup": {"ensure": True, "sourceRanges": ["10.0.0.0/8"]},
                "wireLogging": {"enabled": True}},
    }], "tenancy": {"cloudInitNamespaces": ["default"]}}))  # the sample carries cloud-init
    env = {
        "KUBECONFIG": cluster.fake.write_kubeconfig(str(tmp_path / "kubeconfig")), "REDIS_URL": redis_url,
        "PROVIDERS_CONFIG": str(providers), "RESYNC_INTERVAL": "3600", "GC_INTERVAL": "3600",
        "POLL_INITIAL": "0.5", "POLL_MAX": "1", "RETRY_INITIAL": "0.3", "RETRY_MAX": "0.6",
        "QUOTA_BACKOFF": str(QUOTA_BACKOFF), "TASK_SOFT_TIME_LIMIT": "20", "TASK_TIME_LIMIT": "25",
        "BROKER_VISIBILITY_TIMEOUT": "120", "LOG_LEVEL": "DEBUG",
        # moto hands out public-looking addresses: no probe may ever connect to one.
        "PROBE_DENIED_RANGES": "0.0.0.0/0 ::/0",
    }
    procs = {"worker": celery_worker(env).start(), "beat": celery_beat(env, str(tmp_path)).start(),
             "watcher": watcher(env).start()}
    procs["worker"].wait_for_log("ready", timeout=60)
    yield procs
    for p in procs.values():
        p.stop()


def _custom(cluster):
    return k8s.CustomObjectsApi(cluster.fake.api_client())


def _apply_sample(cluster, name: str) -> tuple[dict, str]:
    secret, proxy = list(yaml.safe_load_all(SAMPLE.read_text()))
    try:
        k8s.CoreV1Api(cluster.fake.api_client()).create_namespaced_secret("default", secret)
    except k8s.ApiException as exc:
        if exc.status != 409:
            raise
    proxy["metadata"]["name"] = name
    created = _custom(cluster).create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, proxy)
    return created, secret["stringData"]["user-data"]


def _proxy(cluster, name: str) -> dict | None:
    try:
        return _custom(cluster).get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, name)
    except k8s.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _phase(cluster, name: str) -> str | None:
    return ((_proxy(cluster, name) or {}).get("status") or {}).get("phase")


def _condition(cluster, name: str, ctype: str) -> dict | None:
    p = _proxy(cluster, name) or {}
    return next((c for c in (p.get("status") or {}).get("conditions", []) if c["type"] == ctype), None)


def _instances(ec2, uid: str) -> list[dict]:
    found = ec2.describe_instances(Filters=[{"Name": "tag:proxy-uid", "Values": [uid]}])
    return [i for r in found["Reservations"] for i in r["Instances"]]


def test_aws_proxy_goes_running_and_is_deleted(cluster, moto, ec2, operator):
    moto.front.lag(times=1)  # the first DescribeInstances after the launch does not show it yet
    created, user_data = _apply_sample(cluster, "squid-aws-e2e")
    uid = created["metadata"]["uid"]
    proxy = wait_for(lambda: _phase(cluster, "squid-aws-e2e") in RUNNING and _proxy(cluster, "squid-aws-e2e"),
                     60, "Proxy Running")

    [raw] = _instances(ec2, uid)
    name = {t["Key"]: t["Value"] for t in raw["Tags"]}["Name"]
    assert raw["Placement"]["AvailabilityZone"] == "eu-west-1a"  # the sample's zone
    assert proxy["status"]["providerID"] == f"regions/{REGION}/zones/eu-west-1a/instances/{name}"
    assert proxy["status"]["address"] == raw["PublicIpAddress"]
    assert {t["Key"]: t["Value"] for t in raw["Tags"]}["managed-by"] == "proxy-operator"
    data = ec2.describe_instance_attribute(InstanceId=raw["InstanceId"], Attribute="userData")["UserData"]["Value"]
    doc = message_from_bytes(gzip.decompress(base64.b64decode(data)))
    user_part, operator_part = [p for p in doc.walk() if not p.is_multipart()]
    assert user_part.get_payload(decode=True).decode() == user_data  # byte for byte from the Secret
    assert b"squid-egress" in base64.b64decode(operator_part.get_payload(decode=True).split(b"put per-boot.sh '")[1]
                                               .split(b"'")[0]) or operator_part.get_filename()
    assert moto.front.count("RunInstances") == 1

    _custom(cluster).delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "squid-aws-e2e")
    wait_for(lambda: _proxy(cluster, "squid-aws-e2e") is None, 30, "Proxy deleted")
    assert [i["State"]["Name"] for i in _instances(ec2, uid)] in (["shutting-down"], ["terminated"])

    logs = "\n".join(p.log() for p in operator.values())
    assert "squid-aws-e2e" in operator["worker"].log()  # the logs we search are the real ones
    assert "aws wire request RunInstances" in operator["worker"].log()  # wire logging was on ...
    for secret in ("Only the crawlers' network", "unattended-upgrades", SECRET_KEY, ACCESS_KEY):
        assert secret not in logs  # ... and neither the user-data nor the keys reached a log


def test_quota_errors_show_as_condition_and_back_off(cluster, moto, ec2, operator):
    moto.front.fail("RunInstances", "InstanceLimitExceeded",
                    message="You have requested more instances (21) than your current instance limit of 20 allows")
    moto.front.fail("RunInstances", "InsufficientInstanceCapacity", status=500,
                    message="We currently do not have sufficient t3.micro capacity in eu-west-1a")
    created, _ = _apply_sample(cluster, "squid-aws-quota")
    cond = wait_for(lambda: (c := _condition(cluster, "squid-aws-quota", "Provisioned")) and
                    c["reason"] == "QuotaExceeded" and c, 30, "QuotaExceeded condition")
    assert cond["status"] == "False" and "InstanceLimitExceeded" in cond["message"]
    wait_for(lambda: _phase(cluster, "squid-aws-quota") in RUNNING, 60, "Proxy Running")
    runs = moto.front.of("RunInstances")
    assert len(runs) == 3  # two quota errors, then the launch
    gaps = [b.at - a.at for a, b in zip(runs, runs[1:])]
    assert all(gap >= QUOTA_BACKOFF * 0.9 for gap in gaps), gaps  # the quota backoff, not a Transient retry
    assert len(_instances(ec2, created["metadata"]["uid"])) == 1
