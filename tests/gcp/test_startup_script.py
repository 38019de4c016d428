"""The gcp ``startup-script`` for real: /bin/sh runs it against a local stand-in for the metadata server.

The script is the one the provider puts into the insert request (read back from the Compute
fake), the attributes it fetches are that request's metadata items, and the squid.conf is the
one :mod:`app.squid.conf` renders.  Only what lies outside the operator's code is faked: the
``systemctl``, ``squid``, ``cloud-init`` and ``apt-get`` commands on PATH, which record their
calls (and what the conf file held when Squid was restarted).  Paths come from the
``PROXY_OPERATOR_*`` variables the script documents; GCE runs it without them.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from app.squid import egress, conf as squid
from app.providers.naming import instance_name, tags_for
from app.providers.base import CreateRequest
from app.providers.gcp import startup

USER_DATA = b"#cloud-config\npackages: [squid]\nruncmd:\n  - [systemctl, restart, squid]\n"
STOCK_CONF = "# Debian's stock squid.conf\nhttp_access allow all\n"
ATTRIBUTES = "/computeMetadata/v1/instance/attributes"


class Metadata:
    """A stand-in for GCE's metadata server: instance attributes, ``Metadata-Flavor: Google`` required."""

    def __init__(self, attributes: dict[str, str]) -> None:
        self.attributes = dict(attributes)
        self.requests: list[tuple[str, str | None]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server's name
                outer.requests.append((self.path, self.headers.get("Metadata-Flavor")))
                key = self.path[len(ATTRIBUTES) + 1:] if self.path.startswith(ATTRIBUTES + "/") else None
                if self.headers.get("Metadata-Flavor") != "Google":
                    code, body = 403, b"Missing Metadata-Flavor:Google header.\n"
                elif key in outer.attributes:
                    code, body = 200, outer.attributes[key].encode()
                else:
                    code, body = 404, b"not found\n"
                self.send_response(code)
                self.send_header("Content-Type", "application/text")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{ATTRIBUTES}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


FAKE_SYSTEMCTL = """#!/bin/sh
echo "systemctl $*" >> "$FAKE_LOG"
if [ "$1" = restart ]; then cat "$PROXY_OPERATOR_SQUID_CONF" > "$FAKE_DIR/conf-at-restart-$(wc -l < "$FAKE_LOG")"; fi
exit 0
"""
# `squid -k parse` goes to the real Squid when the test asks for it (the rendered conf must parse).
FAKE_SQUID = """#!/bin/sh
echo "squid $*" >> "$FAKE_LOG"
if [ "$1 $2" = "-k parse" ]; then
  [ -n "${FAKE_SQUID_PARSE_RC:-}" ] && exit "$FAKE_SQUID_PARSE_RC"
  [ -n "${REAL_SQUID:-}" ] && exec "$REAL_SQUID" "$@"
fi
exit 0
"""
# The user-data "wins" while cloud-init runs: it overwrites squid.conf with its own.
FAKE_CLOUD_INIT = """#!/bin/sh
echo "cloud-init $*" >> "$FAKE_LOG"
[ -n "${FAKE_USER_CONF:-}" ] && printf '%s' "$FAKE_USER_CONF" > "$PROXY_OPERATOR_SQUID_CONF"
exit 0
"""
# nft records what it was asked to load (the real one would change this machine's packet filter;
# tests/test_egress_nftables.py loads the same rules with the real nft in a network namespace).
FAKE_NFT = """#!/bin/sh
echo "nft $*" >> "$FAKE_LOG"
[ "$1" = -f ] && cat "$2" > "$FAKE_DIR/nft-loaded-$(wc -l < "$FAKE_LOG")"
exit "${FAKE_NFT_RC:-0}"
"""
# apt-get installs a (fake) squid; it records what Debian's invoke-rc.d would have been told.
FAKE_APT_GET = """#!/bin/sh
echo "apt-get $*" >> "$FAKE_LOG"
if [ -x "$PROXY_OPERATOR_POLICY_RC_D" ]; then "$PROXY_OPERATOR_POLICY_RC_D" squid start; echo "policy-rc.d $?" >> "$FAKE_LOG"
else echo "policy-rc.d absent" >> "$FAKE_LOG"; fi
cp "$FAKE_DIR/squid.fake" "$FAKE_BIN/squid"
printf '%s' "$STOCK_CONF" > "$PROXY_OPERATOR_SQUID_CONF"
exit 0
"""


class Box:
    """A temp root for one run of the script: fake commands, target paths, the call log."""

    def __init__(self, tmp: Path, *, squid_installed: bool = True, cloud_init: bool = False) -> None:
        self.dir = tmp
        self.bin = tmp / "bin"
        self.bin.mkdir()
        self.log = tmp / "calls.log"
        self.log.write_text("")
        self.conf = tmp / "etc/squid/squid.conf"
        self.conf.parent.mkdir(parents=True)
        self.conf.write_text(STOCK_CONF)
        self.htpasswd = tmp / "etc/squid/proxy-operator-auth/htpasswd"
        self.policy_rc_d = tmp / "policy-rc.d"
        self.egress_rules = tmp / "etc/proxy-operator/squid-egress.nft"
        self.dropin_dir = tmp / "etc/systemd/system/squid.service.d"
        (tmp / "squid.fake").write_text(FAKE_SQUID)
        for name, text in (("systemctl", FAKE_SYSTEMCTL), ("squid", FAKE_SQUID if squid_installed else None),
                           ("cloud-init", FAKE_CLOUD_INIT if cloud_init else None), ("apt-get", FAKE_APT_GET),
                           ("nft", FAKE_NFT)):
            if text is not None:
                (self.bin / name).write_text(text)
                (self.bin / name).chmod(0o755)
        os.chmod(tmp / "squid.fake", 0o755)

    def run(self, script: str, metadata_url: str, **env: str) -> subprocess.CompletedProcess:
        path = tmp_script = self.dir / "startup-script"
        tmp_script.write_text(script)
        full = {
            "PATH": f"{self.bin}:/usr/bin:/bin",  # no /usr/sbin: the real squid is not "installed"
            "HOME": str(self.dir), "FAKE_LOG": str(self.log), "FAKE_DIR": str(self.dir),
            "FAKE_BIN": str(self.bin), "STOCK_CONF": STOCK_CONF,
            "PROXY_OPERATOR_METADATA_URL": metadata_url,
            "PROXY_OPERATOR_SQUID_CONF": str(self.conf),
            "PROXY_OPERATOR_HTPASSWD": str(self.htpasswd),
            "PROXY_OPERATOR_POLICY_RC_D": str(self.policy_rc_d),
            "PROXY_OPERATOR_FETCH_PAUSE": "0",
            "PROXY_OPERATOR_EGRESS_RULES": str(self.egress_rules),
            "PROXY_OPERATOR_SQUID_DROPIN_DIR": str(self.dropin_dir),
            **env,
        }
        return subprocess.run(["/bin/sh", str(path)], env=full, capture_output=True, text=True, timeout=120)

    def nft_loads(self) -> list[str]:
        """What ``nft -f`` was given, in order."""
        return [p.read_text() for p in sorted(self.dir.glob("nft-loaded-*"),
                                              key=lambda p: int(p.name.rsplit("-", 1)[1]))]

    def calls(self) -> list[str]:
        return self.log.read_text().splitlines()

    def conf_at_restarts(self) -> list[str]:
        return [p.read_text() for p in sorted(self.dir.glob("conf-at-restart-*"),
                                              key=lambda p: int(p.name.rsplit("-", 1)[1]))]


def _inserted_metadata(make_provider, fake, *, basic_auth: bool) -> dict[str, str]:
    """Create an instance through the provider and return the insert request's metadata items."""
    policy = squid.SquidPolicy(denied_destinations=("10.128.0.0/9",),
                               basic_auth_file=squid.DEFAULT_HTPASSWD_PATH if basic_auth else None)
    uid = "5c0ffee0-0000-4000-8000-00000000000%d" % (1 if basic_auth else 2)
    make_provider().create(CreateRequest(
        name=instance_name(uid), tags=tags_for(uid), namespace="crawl", user_data=USER_DATA,
        squid_config=squid.render(3128, policy), egress_rules=egress.nftables_rules(policy),
        auth_htpasswd=squid.htpasswd_entry("crawler", "s3cret-pw") if basic_auth else None))
    [insert] = fake.calls("POST", r"/zones/[^/]+/instances$")
    return {i["key"]: i["value"] for i in insert.body["metadata"]["items"]}


@pytest.fixture()
def metadata():
    servers: list[Metadata] = []

    def start(attributes: dict[str, str]) -> Metadata:
        servers.append(Metadata(attributes))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_insert_request_carries_the_script_and_the_conf(make_provider, fake):
    items = _inserted_metadata(make_provider, fake, basic_auth=True)
    assert items["startup-script"] == startup.STARTUP_SCRIPT
    assert items["user-data"] == USER_DATA.decode()  # the user's cloud-init untouched, byte for byte
    conf = items["squid-conf"]
    assert "acl metadata_dst dst 169.254.169.254/32" in conf and "http_access deny metadata_names" in conf
    assert "169.254.0.0/16" in conf and "10.128.0.0/9" in conf
    assert items["squid-htpasswd"].startswith("crawler:$2b$")
    script = items["startup-script"]
    assert startup.METADATA_ATTRIBUTES_URL in script and "Metadata-Flavor: Google" in script
    assert squid.DEFAULT_HTPASSWD_PATH in script


def test_the_script_installs_the_operators_conf_and_htpasswd_before_squid_restarts(make_provider, fake,
                                                                                 metadata, tmp_path):
    items = _inserted_metadata(make_provider, fake, basic_auth=True)
    md = metadata(items)
    box = Box(tmp_path)
    real_squid = shutil.which("squid", path="/usr/sbin:/usr/bin")
    result = box.run(items["startup-script"], md.url, **({"REAL_SQUID": real_squid} if real_squid else {}))
    assert result.returncode == 0, result.stderr

    assert box.conf.read_text() == items["squid-conf"]  # the operator's, not the stock one
    assert _mode(box.conf) == 0o644
    assert box.htpasswd.read_text() == items["squid-htpasswd"]
    assert _mode(box.htpasswd) == 0o640  # never world-readable
    assert _mode(box.htpasswd.parent) == 0o755
    try:
        import grp
        proxy_gid = grp.getgrnam("proxy").gr_gid
    except KeyError:
        proxy_gid = None
    if proxy_gid is not None:
        assert box.htpasswd.stat().st_gid == proxy_gid  # Squid's group reads it
    assert not list(box.conf.parent.glob("*.new")) and not list(box.htpasswd.parent.glob("*.new"))

    calls = box.calls()
    # A Squid already running (the image's, the last boot's) is stopped before anything else.
    assert calls[0] == "systemctl stop squid"
    assert f"squid -k parse -f {box.conf}" in calls
    assert calls[-2:] == ["systemctl enable squid", "systemctl restart squid"]
    assert calls.index(f"squid -k parse -f {box.conf}") < calls.index("systemctl restart squid")
    assert box.conf_at_restarts() == [items["squid-conf"]]  # Squid restarted on the operator's conf
    # Both attributes fetched from the metadata server, with the header it requires.
    assert (f"{ATTRIBUTES}/squid-conf", "Google") in md.requests
    assert (f"{ATTRIBUTES}/squid-htpasswd", "Google") in md.requests
    assert all(flavor == "Google" for _, flavor in md.requests)
    assert "s3cret-pw" not in result.stderr + result.stdout and items["squid-htpasswd"] not in result.stderr


def test_without_basic_auth_a_stale_htpasswd_is_removed(make_provider, fake, metadata, tmp_path):
    items = _inserted_metadata(make_provider, fake, basic_auth=False)
    assert "squid-htpasswd" not in items
    md = metadata(items)
    box = Box(tmp_path)
    box.htpasswd.parent.mkdir(parents=True)
    box.htpasswd.write_text("old:$2b$10$stale\n")
    result = box.run(items["startup-script"], md.url)
    assert result.returncode == 0, result.stderr
    assert box.conf.read_text() == items["squid-conf"]
    assert not box.htpasswd.exists()
    assert box.calls()[-1] == "systemctl restart squid"


def test_no_conf_in_the_metadata_stops_squid(metadata, tmp_path):
    md = metadata({})
    box = Box(tmp_path)
    result = box.run(startup.STARTUP_SCRIPT, md.url)
    assert result.returncode == 1
    assert "no squid-conf" in result.stderr
    assert set(box.calls()) == {"systemctl stop squid"}  # fail-closed: no stock conf left serving
    assert box.conf.read_text() == STOCK_CONF


def test_an_unreachable_metadata_server_stops_squid_after_the_retries(tmp_path):
    box = Box(tmp_path)
    with __import__("socket").socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = box.run(startup.STARTUP_SCRIPT, f"http://127.0.0.1:{port}{ATTRIBUTES}", PROXY_OPERATOR_FETCH_ATTEMPTS="3")
    assert result.returncode == 1
    assert result.stderr.count("metadata squid-conf: HTTP 000") == 3
    assert set(box.calls()) == {"systemctl stop squid"}


def test_a_conf_squid_refuses_stops_squid(make_provider, fake, metadata, tmp_path):
    items = _inserted_metadata(make_provider, fake, basic_auth=False)
    md = metadata(items)
    box = Box(tmp_path)
    result = box.run(items["startup-script"], md.url, FAKE_SQUID_PARSE_RC="1")
    assert result.returncode == 1
    assert "squid -k parse refuses" in result.stderr
    assert "systemctl restart squid" not in box.calls()
    assert box.calls()[-1] == "systemctl stop squid"


def test_the_egress_rules_are_loaded_before_squid_restarts(make_provider, fake, metadata, tmp_path):
    items = _inserted_metadata(make_provider, fake, basic_auth=False)
    # The rules of the same policy as the conf: metadata, link-local, the denied VPC range.
    assert items["squid-egress-nft"] == egress.nftables_rules(squid.SquidPolicy(denied_destinations=("10.128.0.0/9",)))
    md = metadata(items)
    box = Box(tmp_path)
    result = box.run(items["startup-script"], md.url)
    assert result.returncode == 0, result.stderr
    uid = __import__("pwd").getpwnam("proxy").pw_uid
    installed = f"define squid_uid = {uid}\n" + items["squid-egress-nft"]
    assert box.egress_rules.read_text() == installed
    assert box.nft_loads() == [installed]
    calls = box.calls()
    assert calls.index(f"nft -f {box.egress_rules}") < calls.index("systemctl restart squid")
    # squid.service loads them again before every start; it does not start when nft fails.
    dropin = (box.dropin_dir / "proxy-operator-egress.conf").read_text()
    assert dropin == f"[Service]\nExecStartPre={box.bin}/nft -f {box.egress_rules}\n"


def test_no_egress_rules_in_the_metadata_stops_squid(make_provider, fake, metadata, tmp_path):
    items = _inserted_metadata(make_provider, fake, basic_auth=False)
    del items["squid-egress-nft"]
    md = metadata(items)
    box = Box(tmp_path)
    result = box.run(items["startup-script"], md.url)
    assert result.returncode == 1
    assert "no squid-egress-nft" in result.stderr
    assert set(box.calls()) == {"systemctl stop squid"}


def test_egress_rules_nft_refuses_stop_squid(make_provider, fake, metadata, tmp_path):
    items = _inserted_metadata(make_provider, fake, basic_auth=False)
    md = metadata(items)
    box = Box(tmp_path)
    result = box.run(items["startup-script"], md.url, FAKE_NFT_RC="1")
    assert result.returncode == 1
    assert "cannot load the egress rules" in result.stderr
    assert "systemctl restart squid" not in box.calls()
    assert box.calls()[-1] == "systemctl stop squid"


def test_the_operators_conf_wins_over_a_user_data_that_rewrites_it(make_provider, fake, metadata, tmp_path):
    items = _inserted_metadata(make_provider, fake, basic_auth=True)
    md = metadata(items)
    box = Box(tmp_path, cloud_init=True)
    user_conf = "# the user's squid.conf\nhttp_access allow all\n"
    result = box.run(items["startup-script"], md.url, FAKE_USER_CONF=user_conf)
    assert result.returncode == 0, result.stderr
    assert "installing the operator's again" in result.stderr
    assert box.conf.read_text() == items["squid-conf"]
    calls = box.calls()
    assert "cloud-init status --wait" in calls
    assert calls.count("systemctl restart squid") == 2
    assert box.conf_at_restarts() == [items["squid-conf"], items["squid-conf"]]


def test_a_missing_squid_is_installed_without_ever_starting_on_the_stock_conf(make_provider, fake,
                                                                            metadata, tmp_path):
    items = _inserted_metadata(make_provider, fake, basic_auth=False)
    md = metadata(items)
    box = Box(tmp_path, squid_installed=False)
    result = box.run(items["startup-script"], md.url)
    assert result.returncode == 0, result.stderr
    calls = box.calls()
    assert calls[0].startswith("apt-get ") and calls[0].endswith("install -y -q squid")
    assert calls[1] == "policy-rc.d 101"  # Debian's invoke-rc.d was told not to start it
    assert not box.policy_rc_d.exists()  # and the guard is gone again
    assert box.conf.read_text() == items["squid-conf"]
    assert box.conf_at_restarts() == [items["squid-conf"]]


def test_an_existing_policy_rc_d_is_left_alone(make_provider, fake, metadata, tmp_path):
    items = _inserted_metadata(make_provider, fake, basic_auth=False)
    md = metadata(items)
    box = Box(tmp_path, squid_installed=False)
    box.policy_rc_d.write_text("#!/bin/sh\nexit 104\n")
    box.policy_rc_d.chmod(0o755)
    result = box.run(items["startup-script"], md.url)
    assert result.returncode == 0, result.stderr
    assert box.policy_rc_d.read_text() == "#!/bin/sh\nexit 104\n"


def test_basic_auth_without_its_htpasswd_attribute_stops_squid(make_provider, fake, metadata, tmp_path):
    """The conf names the htpasswd file but the metadata has no ``squid-htpasswd`` (404) or an
    empty one: the script used to delete the file, restart Squid on a conf whose password file
    is gone and report success (every client then gets 407, or Squid dies when its auth helper
    cannot read the file).  It stops Squid and says what is missing instead."""
    items = _inserted_metadata(make_provider, fake, basic_auth=True)
    real_squid = shutil.which("squid", path="/usr/sbin:/usr/bin")
    env = {"REAL_SQUID": real_squid} if real_squid else {}
    for name, attributes in (("missing", {k: v for k, v in items.items() if k != "squid-htpasswd"}),
                             ("empty", {**items, "squid-htpasswd": ""})):
        md = metadata(attributes)
        (tmp_path / name).mkdir()
        box = Box(tmp_path / name)
        result = box.run(items["startup-script"], md.url, **env)
        assert result.returncode == 1, (name, result.stderr)
        assert "squid-htpasswd" in result.stderr and "basic auth" in result.stderr, name
        assert "systemctl restart squid" not in box.calls(), name
        assert box.calls()[-1] == "systemctl stop squid", name


def test_an_empty_conf_stops_squid(metadata, tmp_path):
    md = metadata({"squid-conf": ""})
    box = Box(tmp_path)
    result = box.run(startup.STARTUP_SCRIPT, md.url)
    assert result.returncode == 1 and "squid-conf is empty" in result.stderr
    assert set(box.calls()) == {"systemctl stop squid"}
    assert box.conf.read_text() == STOCK_CONF


def test_a_metadata_server_answering_500_then_200_is_waited_for(make_provider, fake, tmp_path):
    """A metadata server that errs (500, or garbage with another status) is retried, not taken
    for "no such attribute"; once it answers, the conf is installed."""
    items = _inserted_metadata(make_provider, fake, basic_auth=False)
    md = Metadata(items)
    answered = []
    handler = md.server.RequestHandlerClass
    serve = handler.do_GET

    def flaky(self):  # the first two answers are errors
        if len(answered) < 2:
            answered.append(self.path)
            body = b"<html>backend error</html>"
            self.send_response(500)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        serve(self)

    handler.do_GET = flaky
    try:
        box = Box(tmp_path)
        result = box.run(items["startup-script"], md.url)
    finally:
        md.close()
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("metadata squid-conf: HTTP 500") == 2
    assert box.conf.read_text() == items["squid-conf"]
    assert box.conf_at_restarts() == [items["squid-conf"]]


def test_the_metadata_values_are_never_run_by_the_shell(make_provider, fake, metadata, tmp_path):
    """Attribute values land in files only: shell syntax in them is data."""
    items = _inserted_metadata(make_provider, fake, basic_auth=True)
    marker = tmp_path / "pwned"
    evil = f"$(touch {marker}) `touch {marker}` ; touch {marker}\n"
    md = metadata({**items, "squid-conf": items["squid-conf"] + "# " + evil,
                   "squid-htpasswd": items["squid-htpasswd"].rstrip("\n") + evil})
    (tmp_path / "box").mkdir()
    box = Box(tmp_path / "box")
    result = box.run(items["startup-script"], md.url)
    assert result.returncode == 0, result.stderr
    assert not marker.exists()
    assert box.conf.read_text().endswith(evil)
    assert evil not in result.stderr


def test_a_reboot_installs_the_conf_the_metadata_holds_then(make_provider, fake, metadata, tmp_path):
    """Every boot installs what the metadata holds at that boot (here: basic auth turned off
    between two boots): the new conf, and the old htpasswd gone."""
    with_auth = _inserted_metadata(make_provider, fake, basic_auth=True)
    box = Box(tmp_path)
    md = metadata(with_auth)
    assert box.run(with_auth["startup-script"], md.url).returncode == 0
    assert box.htpasswd.exists()
    changed = {k: v for k, v in with_auth.items() if k != "squid-htpasswd"}
    changed["squid-conf"] = squid.render(3128, squid.SquidPolicy(denied_destinations=("10.0.0.0/8",)))
    md2 = metadata(changed)
    result = box.run(with_auth["startup-script"], md2.url)
    assert result.returncode == 0, result.stderr
    assert box.conf.read_text() == changed["squid-conf"]
    assert not box.htpasswd.exists()
    assert box.conf_at_restarts() == [with_auth["squid-conf"], changed["squid-conf"]]
