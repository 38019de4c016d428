"""The user-data every aws instance gets: the Proxy's cloud-init plus the operator's Squid setup.

EC2 has one user-data document per instance (at most 16 KiB before base64) and no other
instance metadata a guest could read the squid.conf from, so the provider sends a gzip-compressed
MIME multipart document (cloud-init decompresses and splits it:
https://cloudinit.readthedocs.io/en/latest/explanation/format.html#mime-multi-part-archive):

1. the Proxy's own cloud-init, unchanged, as a ``text/plain`` part (cloud-init reads its type
   from its first line: ``#cloud-config``, ``#!``, a MIME archive ...); never parsed or merged
   by the operator;
2. :data:`FIRST_BOOT`, a ``text/x-shellscript`` part named ``zz-proxy-operator.sh``: it writes the
   squid.conf, the htpasswd line and the nftables ruleset (carried in it base64-encoded) to
   ``/etc/proxy-operator/`` (root only), installs :data:`PER_BOOT` as
   ``/var/lib/cloud/scripts/per-boot/proxy-operator.sh`` and runs it.  cloud-init runs user
   scripts in name order after the user's ``runcmd``, so the operator's files win over whatever
   the user-data installed.

:data:`PER_BOOT` runs at every later boot too (cloud-init's ``scripts_per_boot``), fail-closed
with the gcp startup-script's install part (:func:`app.squid.boot.boot_script`): it stops a running Squid,
installs Squid when missing (Debian's ``policy-rc.d`` answering 101 meanwhile), loads the egress
ruleset (:data:`app.squid.egress.INSTALL_EGRESS_SH`), installs the conf (0644) and htpasswd
(0640, Squid's group), checks the conf with ``squid -k parse`` and restarts Squid; any failure
stops Squid.
"""

from __future__ import annotations

import base64
import gzip
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText

from app.squid.boot import boot_script

#: EC2's limit on user-data, in bytes before base64 encoding.
MAX_USER_DATA = 16 * 1024
#: Where the first-boot part leaves the operator's files on the instance.
FILES_DIR = "/etc/proxy-operator"
#: The per-boot script's path (cloud-init runs every executable there at every boot).
PER_BOOT_PATH = "/var/lib/cloud/scripts/per-boot/proxy-operator.sh"
#: The MIME part name of the first-boot script: sorts after the user's ``runcmd`` script.
FIRST_BOOT_NAME = "zz-proxy-operator.sh"

_FETCH = r"""SRC="${PROXY_OPERATOR_FILES:-__FILES__}"
[ -s "$SRC/squid.conf" ] || fail "$SRC/squid.conf is missing or empty"
[ -s "$SRC/egress.nft" ] || fail "$SRC/egress.nft is missing or empty"
AUTH=0
[ -s "$SRC/htpasswd" ] && AUTH=1
if grep -Eq '^[[:space:]]*auth_param[[:space:]]+basic[[:space:]]+program' "$SRC/squid.conf"; then
  [ "$AUTH" = 1 ] || fail "squid.conf turns basic auth on but $SRC/htpasswd is missing or empty"
fi""".replace("__FILES__", FILES_DIR)

#: The per-boot script (:func:`app.squid.boot.boot_script` around reading :data:`FILES_DIR`).
PER_BOOT = boot_script(
    header="""# proxy-operator per-boot script (app/providers/aws/bootstrap.py): run Squid with the operator's
# squid.conf from /etc/proxy-operator at every boot. Fail-closed: Squid is stopped when the conf
# cannot be installed.""",
    fetch=_FETCH)

FIRST_BOOT = r"""#!/bin/sh
# proxy-operator first boot (app/providers/aws/bootstrap.py): leave the operator's files in
# __FILES__, install the per-boot script and run it.
set -u
DIR="${PROXY_OPERATOR_FILES:-__FILES__}"
PER_BOOT="${PROXY_OPERATOR_PER_BOOT:-__PER_BOOT__}"
umask 077
mkdir -p "$DIR" "$(dirname "$PER_BOOT")" || exit 1
put() {  # put FILE BASE64
  printf '%s' "$2" | base64 -d > "$DIR/$1.new" && mv -f "$DIR/$1.new" "$DIR/$1"
}
put squid.conf '__SQUID_CONF__' || exit 1
put egress.nft '__EGRESS__' || exit 1
if [ -n '__HTPASSWD_LINE__' ]; then put htpasswd '__HTPASSWD_LINE__' || exit 1; else rm -f "$DIR/htpasswd"; fi
put per-boot.sh '__PER_BOOT_SCRIPT__' || exit 1
mv -f "$DIR/per-boot.sh" "$PER_BOOT" && chmod 0700 "$PER_BOOT" || exit 1
exec "$PER_BOOT"
"""


def _b64(text: str | None) -> str:
    return base64.b64encode((text or "").encode("utf-8")).decode("ascii")


def first_boot_script(squid_config: str, egress_rules: str, htpasswd: str | None) -> str:
    """Return the first-boot shell script carrying the operator's files (base64, so no quoting issue).

    Args:
        squid_config: the rendered squid.conf.
        egress_rules: the nftables ruleset for Squid's user.
        htpasswd: the Proxy's htpasswd line (basic auth), or ``None``.
    Returns:
        the script's text.
    """
    return (FIRST_BOOT.replace("__FILES__", FILES_DIR).replace("__PER_BOOT__", PER_BOOT_PATH)
            .replace("__SQUID_CONF__", _b64(squid_config)).replace("__EGRESS__", _b64(egress_rules))
            .replace("__HTPASSWD_LINE__", _b64(htpasswd) if htpasswd else "")
            .replace("__PER_BOOT_SCRIPT__", _b64(PER_BOOT)))


def user_data(*, user: bytes | None, squid_config: str | None, egress_rules: str | None,
              htpasswd: str | None) -> bytes:
    """Return the instance's user-data: gzip of a MIME multipart of the user's part and the operator's.

    Args:
        user: the Proxy's cloud-init (bytes as given), or ``None``.
        squid_config: the rendered squid.conf, or ``None`` (then no operator part: nothing to install).
        egress_rules: the nftables ruleset; required with ``squid_config``.
        htpasswd: the htpasswd line, or ``None``.
    Returns:
        the gzip-compressed document (cloud-init recognises gzip by its magic bytes).
    Raises:
        ValueError: ``user`` is not UTF-8 (naming the byte), ``squid_config`` comes without
            ``egress_rules``, or the result exceeds :data:`MAX_USER_DATA` bytes (naming both sizes).
    """
    doc = MIMEMultipart()
    if user is not None:
        try:
            text = user.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"cloud-init user-data is not UTF-8: byte {exc.start}") from None
        part = MIMEText(text, "plain", "utf-8")
        part.add_header("Content-Disposition", "attachment", filename="user-data")
        doc.attach(part)
    if squid_config:
        if not egress_rules:
            raise ValueError("the squid.conf comes without its egress ruleset")
        script = MIMEText(first_boot_script(squid_config, egress_rules, htpasswd), "x-shellscript", "utf-8")
        script.add_header("Content-Disposition", "attachment", filename=FIRST_BOOT_NAME)
        doc.attach(script)
    raw = gzip.compress(doc.as_bytes(), compresslevel=9, mtime=0)
    if len(raw) > MAX_USER_DATA:
        raise ValueError(f"the user-data is {len(raw)} bytes gzip-compressed, over EC2's limit of {MAX_USER_DATA}")
    return raw
