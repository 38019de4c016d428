"""The NoCloud seed ISO and its vendor-data (pure: no libvirt, no I/O).

cloud-init's NoCloud datasource reads a filesystem labelled ``cidata`` holding ``user-data``,
``meta-data`` and optionally ``vendor-data``
(https://cloudinit.readthedocs.io/en/latest/reference/datasources/nocloud.html).  The ISO is
built in memory with pycdlib (ISO 9660 + Joliet + Rock Ridge, so every reader sees the
lowercase names).

user-data goes in byte for byte as the Proxy gave it — a cloud-config, a Jinja template, a
shell script, a MIME archive — and is never parsed: merging our needs into it is what broke
the Go operator twice (cloud-init's default mergers drop vendor-data keys the user also
sets, and a YAML round-trip re-types scalars).  Our needs travel as vendor-data *scripts*
instead: cloud-init runs vendor scripts (``cc_scripts_vendor``) after the user's packages and
before the user's scripts, whatever the user-data says.  A user ``vendorData`` goes beside
them in a MIME multipart, declared ``text/plain`` so cloud-init sniffs its type itself.
"""

from __future__ import annotations

import base64
import io
from email.mime.base import MIMEBase
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText
from email import encoders

import pycdlib

from app.squid.egress import INSTALL_EGRESS_SH
from app.squid.conf import DEFAULT_HTPASSWD_PATH

LABEL = "cidata"

_PKG_INSTALL = """\
pkg_install() {
  if command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q "$@" || { apt-get update -q && apt-get install -y -q "$@"; }
  elif command -v dnf >/dev/null 2>&1; then dnf install -y "$@"
  elif command -v yum >/dev/null 2>&1; then yum install -y "$@"
  elif command -v zypper >/dev/null 2>&1; then zypper --non-interactive install "$@"
  elif command -v apk >/dev/null 2>&1; then apk add "$@"
  else echo "proxy-operator: no known package manager to install $*" >&2; return 1
  fi
}
"""

GUEST_AGENT_SCRIPT = ("""\
#!/bin/sh
# proxy-operator vendor-data: install and start the QEMU guest agent so the operator can
# learn this VM's address (installGuestAgent: false in the kvm provider config turns it off).
""" + _PKG_INSTALL + """\
if ! command -v qemu-ga >/dev/null 2>&1 && [ ! -x /usr/sbin/qemu-ga ] && [ ! -x /usr/bin/qemu-ga ]; then
  pkg_install qemu-guest-agent
fi
if command -v systemctl >/dev/null 2>&1; then
  systemctl enable --now qemu-guest-agent 2>/dev/null || systemctl start qemu-guest-agent
elif command -v rc-service >/dev/null 2>&1; then
  rc-update add qemu-guest-agent default; rc-service qemu-guest-agent start
fi
""").encode("ascii")


def squid_script(squid_conf: str, htpasswd: str | None = None, egress_rules: str | None = None) -> bytes:
    """Return the vendor-data script that installs Squid if missing and runs it with ``squid_conf``.

    With ``htpasswd`` (one ``user:bcrypt`` line), it is installed where the squid.conf's
    basic-auth helper reads it (:data:`app.squid.conf.DEFAULT_HTPASSWD_PATH`), readable by root and
    the ``proxy`` group only.  With ``egress_rules`` (:func:`app.squid.egress.nftables_rules`), they
    are loaded for Squid's user before Squid restarts, and ``squid.service`` loads them before
    every start (:data:`app.squid.egress.INSTALL_EGRESS_SH`); when they cannot be, Squid is stopped
    and the script exits 1.  Everything travels base64-encoded, so no content can end a
    here-document early.
    """
    blob = base64.b64encode(squid_conf.encode("utf-8")).decode("ascii")
    egress = ""
    if egress_rules:
        rules = base64.b64encode(egress_rules.encode("utf-8")).decode("ascii")
        egress = (INSTALL_EGRESS_SH.strip() + "\n"
                  f"echo '{rules}' | base64 -d > /run/proxy-operator-squid-egress.nft\n"
                  "if ! install_egress /run/proxy-operator-squid-egress.nft; then\n"
                  "  echo \"proxy-operator: cannot load the egress rules for Squid's user; stopping Squid\" >&2\n"
                  "  systemctl stop squid 2>/dev/null || rc-service squid stop 2>/dev/null || service squid stop\n"
                  "  exit 1\n"
                  "fi\n")
    auth = ""
    if htpasswd:
        pw = base64.b64encode(htpasswd.encode("utf-8")).decode("ascii")
        # Written under umask 027 (never world-readable), then handed to Squid's group: "proxy"
        # on Debian/Ubuntu, "squid" on Fedora/RHEL/SUSE/Alpine.
        auth = (f"mkdir -p -m 0755 {DEFAULT_HTPASSWD_PATH.rpartition('/')[0]}\n"
                f"(umask 027; echo '{pw}' | base64 -d > {DEFAULT_HTPASSWD_PATH})\n"
                f"chgrp proxy {DEFAULT_HTPASSWD_PATH} 2>/dev/null || chgrp squid {DEFAULT_HTPASSWD_PATH}\n"
                f"chmod 0640 {DEFAULT_HTPASSWD_PATH}\n")
    return ("""\
#!/bin/sh
# proxy-operator vendor-data: run Squid with the operator's squid.conf (app/squid/conf.py);
# configureSquid: false in the kvm provider config turns it off.
""" + _PKG_INSTALL + """\
command -v squid >/dev/null 2>&1 || [ -x /usr/sbin/squid ] || pkg_install squid
mkdir -p /etc/squid
echo '""" + blob + """' | base64 -d > /etc/squid/squid.conf
""" + auth + egress + """\
if command -v systemctl >/dev/null 2>&1; then
  systemctl enable squid 2>/dev/null; systemctl restart squid
elif command -v rc-service >/dev/null 2>&1; then
  rc-update add squid default; rc-service squid restart
else
  service squid restart
fi
""").encode("ascii")


def vendor_data(*, install_guest_agent: bool, squid_conf: str | None, user_vendor_data: bytes | None,
                htpasswd: str | None = None, egress_rules: str | None = None) -> bytes | None:
    """Return the vendor-data document, or ``None`` when there is nothing to send.

    Args:
        install_guest_agent: include :data:`GUEST_AGENT_SCRIPT`.
        squid_conf: when given, include :func:`squid_script` for it.
        htpasswd: basic-auth line for the squid script (see :func:`squid_script`), or ``None``.
        egress_rules: nftables ruleset for the squid script (see :func:`squid_script`), or ``None``.
        user_vendor_data: the Proxy's ``spec.vendorData`` bytes, or ``None``.
    Returns:
        one part alone, byte for byte (our script, or the user's vendorData); several parts as
        a ``multipart/mixed`` MIME document: our scripts as ``text/x-shellscript``, the user's
        vendorData as ``text/plain`` (base64 transfer encoding, so its bytes survive exactly).
    """
    scripts: list[tuple[str, bytes]] = []
    if install_guest_agent:
        scripts.append(("proxy-operator-guest-agent.sh", GUEST_AGENT_SCRIPT))
    if squid_conf:
        scripts.append(("proxy-operator-squid.sh", squid_script(squid_conf, htpasswd, egress_rules)))
    count = len(scripts) + (1 if user_vendor_data else 0)
    if count == 0:
        return None
    if count == 1:
        return user_vendor_data if user_vendor_data else scripts[0][1]
    msg = MIMEMultipart("mixed")
    for filename, body in scripts:
        part = MIMEText(body.decode("ascii"), "x-shellscript", "us-ascii")
        part.add_header("Content-Disposition", "attachment", filename=filename)
        msg.attach(part)
    if user_vendor_data:
        vendor = MIMEBase("text", "plain")
        vendor.set_payload(user_vendor_data)
        encoders.encode_base64(vendor)
        vendor.add_header("Content-Disposition", "attachment", filename="vendor-data")
        msg.attach(vendor)
    return msg.as_bytes()


def meta_data(instance_name: str) -> bytes:
    """Return the NoCloud meta-data: ``instance-id`` and ``local-hostname`` are the instance name."""
    return f"instance-id: {instance_name}\nlocal-hostname: {instance_name}\n".encode("ascii")


def build_iso(files: dict[str, bytes]) -> bytes:
    """Return an ISO 9660 image labelled ``cidata`` holding ``files`` (name -> bytes) at its root.

    Names are written as Rock Ridge and Joliet names as given (``user-data``) and as ISO 9660
    level-3 names upper-cased with ``-`` -> ``_``.
    """
    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=3, joliet=3, rock_ridge="1.09", vol_ident=LABEL)
    for name, data in files.items():
        iso_name = "/" + name.upper().replace("-", "_") + ".;1"
        iso.add_fp(io.BytesIO(data), len(data), iso_name, rr_name=name, joliet_path="/" + name)
    out = io.BytesIO()
    iso.write_fp(out)
    iso.close()
    return out.getvalue()


def build_seed(instance_name: str, user_data: bytes | None, vendor: bytes | None) -> bytes:
    """Return the seed ISO for one VM.

    Args:
        instance_name: the domain name (instance-id and hostname).
        user_data: the Proxy's cloud-init, byte for byte (``None`` -> an empty user-data).
        vendor: from :func:`vendor_data`, or ``None`` for no vendor-data file.
    """
    files = {"user-data": user_data or b"", "meta-data": meta_data(instance_name)}
    if vendor is not None:
        files["vendor-data"] = vendor
    return build_iso(files)
