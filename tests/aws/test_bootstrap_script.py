"""The aws user-data for real: the first-boot part the provider launched the instance with (read
back from moto) runs under /bin/sh, installs the per-boot script and runs it; a later boot runs
the per-boot script alone.  Only what lies outside the operator's code is faked, as for the gcp
startup-script: ``systemctl``, ``squid``, ``nft``, ``apt-get`` on PATH (tests/gcp/test_startup_script.py's
``Box``), recording their calls; paths come from the ``PROXY_OPERATOR_*`` variables the scripts document."""

from __future__ import annotations

import base64
import gzip
import stat
from email import message_from_bytes

from app.providers.aws import bootstrap
from app.providers.base import CreateRequest
from app.providers.naming import instance_name, tags_for
from app.squid import conf as squid, egress
from tests.gcp.test_startup_script import Box

USER_DATA = b"#cloud-config\npackages: [squid]\n"


def _first_boot(ec2, provider, *, basic_auth: bool) -> tuple[str, str, str | None]:
    policy = squid.SquidPolicy(denied_destinations=("10.128.0.0/9",),
                               basic_auth_file=squid.DEFAULT_HTPASSWD_PATH if basic_auth else None)
    uid = "5c0ffee0-0000-4000-8000-00000000010%d" % (1 if basic_auth else 2)
    conf = squid.render(3128, policy)
    htpasswd = squid.htpasswd_entry("crawler", "s3cret-pw") if basic_auth else None
    inst = provider.create(CreateRequest(name=instance_name(uid), tags=tags_for(uid), namespace="crawl",
                                         user_data=USER_DATA, squid_config=conf,
                                         egress_rules=egress.nftables_rules(policy), auth_htpasswd=htpasswd))
    found = ec2.describe_instances(Filters=[{"Name": "tag:Name", "Values": [inst.name]}])
    instance_id = found["Reservations"][0]["Instances"][0]["InstanceId"]
    data = ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")["UserData"]["Value"]
    doc = message_from_bytes(gzip.decompress(base64.b64decode(data)))
    [script] = [p for p in doc.walk() if p.get_filename() == bootstrap.FIRST_BOOT_NAME]
    return script.get_payload(decode=True).decode(), conf, htpasswd


def _env(box: Box) -> dict[str, str]:
    return {"PROXY_OPERATOR_FILES": str(box.dir / "etc/proxy-operator"),
            "PROXY_OPERATOR_PER_BOOT": str(box.dir / "per-boot/proxy-operator.sh")}


def test_first_boot_installs_the_conf_htpasswd_and_egress_rules_then_squid_restarts(ec2, provider, tmp_path):
    script, conf, htpasswd = _first_boot(ec2, provider, basic_auth=True)
    box = Box(tmp_path)
    out = box.run(script, "", **_env(box))
    assert out.returncode == 0, out.stderr
    assert box.conf.read_text() == conf
    assert box.htpasswd.read_text() == htpasswd
    assert stat.S_IMODE(box.htpasswd.stat().st_mode) == 0o640
    assert stat.S_IMODE((box.dir / "etc/proxy-operator/squid.conf").stat().st_mode) == 0o600  # root only
    per_boot = box.dir / "per-boot/proxy-operator.sh"
    assert per_boot.read_text() == bootstrap.PER_BOOT and stat.S_IMODE(per_boot.stat().st_mode) == 0o700
    [rules] = box.nft_loads()
    assert "10.128.0.0/9" in rules  # the denied range, below Squid too
    calls = box.calls()
    assert calls.index("systemctl stop squid") < calls.index("systemctl restart squid")
    assert box.conf_at_restarts() == [conf]


def test_a_later_boot_puts_the_operators_conf_back(ec2, provider, tmp_path):
    script, conf, _ = _first_boot(ec2, provider, basic_auth=False)
    box = Box(tmp_path)
    assert box.run(script, "", **_env(box)).returncode == 0
    box.conf.write_text("http_access allow all\n")  # someone's own setup since
    out = box.run((box.dir / "per-boot/proxy-operator.sh").read_text(), "", **_env(box))
    assert out.returncode == 0, out.stderr
    assert box.conf.read_text() == conf and not box.htpasswd.exists()


def test_a_conf_squid_refuses_leaves_squid_stopped(ec2, provider, tmp_path):
    script, _, _ = _first_boot(ec2, provider, basic_auth=False)
    box = Box(tmp_path)
    out = box.run(script, "", FAKE_SQUID_PARSE_RC="1", **_env(box))
    assert out.returncode != 0 and "squid -k parse refuses" in out.stderr
    assert "systemctl restart squid" not in box.calls() and box.calls()[-1] == "systemctl stop squid"
