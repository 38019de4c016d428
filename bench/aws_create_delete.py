"""Creates and deletes per second, and EC2 API calls per create, of the aws provider against moto.

`python bench/aws_create_delete.py [--creates 100] [--warmup 10]` — moto's EC2/SSM server
(server mode, real HTTP on loopback) behind the recording front of the tests
(`tests/aws/ec2_front.py`), and in this process an `AwsProvider` built through the real config
parser (boto3 client, standard retries, an `ssm:` AMI, an ensured security group, a
shared-credentials file).  It runs `--warmup` creates, then times `--creates` creates of new
Proxies and then their deletes (wall clock: moto runs in this process too, so CPU would mix),
and prints creates/s, deletes/s and the calls each step makes, by operation.  The figures are
moto's and this machine's, not EC2's: EC2's own latency (a RunInstances takes 0.5-2 s) dominates
there; what carries over is the number of calls per step, which is what EC2 rate-limits.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import boto3  # noqa: E402

from app.providers.base import CreateRequest  # noqa: E402
from app.providers.naming import instance_name, tags_for  # noqa: E402
from app.squid import conf as squid_conf, egress  # noqa: E402
from app.wiring import parse_config  # noqa: E402

REGION = "eu-west-1"


def _per_step(calls, steps: int) -> str:
    counts = collections.Counter(c.operation for c in calls)
    total = sum(counts.values())
    detail = ", ".join(f"{op} {n / steps:.2f}" for op, n in sorted(counts.items()))
    return f"{total / steps:.2f} calls ({detail})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--creates", type=int, default=100, help="creates (and deletes) timed (default 100)")
    parser.add_argument("--warmup", type=int, default=10, help="creates before timing (default 10)")
    args = parser.parse_args()

    from app.providers.aws.provider import AwsProvider
    from tests.aws.ec2_front import DEBIAN_AMI, Moto

    moto = Moto()
    workdir = Path(tempfile.mkdtemp(prefix="bench-aws-"))
    creds = workdir / "credentials"
    creds.write_text("[default]\naws_access_key_id = AKIABENCH0000000001\naws_secret_access_key = bench\n")
    boto3.client("ssm", region_name=REGION, endpoint_url=moto.moto_url, aws_access_key_id="AKIABENCH0000000001",
                 aws_secret_access_key="bench").put_parameter(Name="/bench/ami", Value=DEBIAN_AMI, Type="String")
    cfg = parse_config({"providers": [{"name": "aws-bench", "type": "aws", "aws": {
        "region": REGION, "zones": ["eu-west-1a", "eu-west-1b", "eu-west-1c"], "endpointUrl": moto.url,
        "credentialsFile": str(creds), "ami": "ssm:/bench/ami",
        "securityGroup": {"ensure": True, "sourceRanges": ["10.0.0.0/8"]}}}]}, "bench")
    provider = AwsProvider(cfg.providers[0])
    squid = squid_conf.render(3128, None)
    rules = egress.nftables_rules(None)
    user_data = b"#cloud-config\npackages: [unattended-upgrades]\n"

    def request(i: int) -> CreateRequest:
        uid = f"bench-{i:06d}"
        return CreateRequest(name=instance_name(uid), tags=tags_for(uid), namespace="bench", user_data=user_data,
                             squid_config=squid, egress_rules=rules)

    first = time.perf_counter()
    provider.create(request(-1))
    print(f"first create (clients, security group, ssm: AMI): {(time.perf_counter() - first) * 1000:.0f} ms, "
          f"{_per_step(moto.front.calls, 1)}")
    for i in range(args.warmup):
        provider.create(request(1_000_000 + i))
    moto.front.calls.clear()

    ids = []
    start = time.perf_counter()
    for i in range(args.creates):
        ids.append(provider.create(request(i)).provider_id)
    created = time.perf_counter() - start
    create_calls = list(moto.front.calls)
    moto.front.calls.clear()
    start = time.perf_counter()
    for pid in ids:
        provider.delete(pid)
    deleted = time.perf_counter() - start
    delete_calls = list(moto.front.calls)

    print(f"creates: {args.creates} in {created:.2f} s = {args.creates / created:.1f} creates/s, "
          f"{created / args.creates * 1000:.1f} ms each; per create: {_per_step(create_calls, args.creates)}")
    print(f"deletes: {args.creates} in {deleted:.2f} s = {args.creates / deleted:.1f} deletes/s, "
          f"{deleted / args.creates * 1000:.1f} ms each; per delete: {_per_step(delete_calls, args.creates)}")
    moto.stop()


if __name__ == "__main__":
    main()
