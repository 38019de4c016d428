"""The shell a cloud instance runs at every boot to serve the operator's squid.conf, fail-closed.

The gcp startup-script (:mod:`app.providers.gcp.startup`) and the aws per-boot script
(:mod:`app.providers.aws.bootstrap`) differ only in where they find the operator's files (the
instance metadata server, or a root-only directory the first boot left) and in what they do
once Squid runs.  :func:`boot_script` wraps a provider's "fetch the files" snippet in the part
they share:

0. stop a Squid that is already running (the image's, or the last boot's), so that nothing
   serves a conf other than the operator's while the script works;
1. the provider's snippet leaves ``squid.conf``, ``egress.nft`` and, with basic auth,
   ``htpasswd`` in ``$SRC`` and sets ``AUTH`` to 1 (htpasswd present) or 0; it calls ``fail``
   when a file is missing;
2. install Squid when it is missing, with Debian's ``policy-rc.d`` answering 101 so the
   package's stock squid.conf never starts serving;
3. load the egress ruleset for Squid's user (:data:`app.squid.egress.INSTALL_EGRESS_SH`);
4. ``apply``: write the conf (0644) and the htpasswd (0640, group ``proxy`` or ``squid``, never
   world-readable) atomically, check the conf with ``squid -k parse``, restart Squid;
5. the provider's optional closing snippet (it may call ``apply`` again).

Any failure stops Squid (``fail``) and exits 1.  ``CONF``, ``HTPASSWD`` and ``POLICY_RC_D`` are
overridable through ``PROXY_OPERATOR_*`` environment variables, so the script can run outside a
cloud; the cloud runs it with none of them set.
"""

from __future__ import annotations

from app.squid.conf import DEFAULT_HTPASSWD_PATH
from app.squid.egress import INSTALL_EGRESS_SH

_TEMPLATE = r"""#!/bin/sh
__HEADER__
set -u
CONF="${PROXY_OPERATOR_SQUID_CONF:-/etc/squid/squid.conf}"
HTPASSWD="${PROXY_OPERATOR_HTPASSWD:-__HTPASSWD__}"
POLICY_RC_D="${PROXY_OPERATOR_POLICY_RC_D:-/usr/sbin/policy-rc.d}"

log() { echo "proxy-operator: $*" >&2; }

squid_service() {  # squid_service stop|restart
  if command -v systemctl >/dev/null 2>&1; then
    [ "$1" = restart ] && systemctl enable squid >/dev/null 2>&1
    systemctl "$1" squid
  elif command -v rc-service >/dev/null 2>&1; then
    [ "$1" = restart ] && rc-update add squid default >/dev/null 2>&1
    rc-service squid "$1"
  else
    service squid "$1"
  fi
}

fail() {
  log "$*; stopping Squid"
  command -v squid >/dev/null 2>&1 && squid_service stop
  exit 1
}

pkg_install() {
  if command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=600 install -y -q "$@" ||
      { apt-get -o DPkg::Lock::Timeout=600 update -q && apt-get -o DPkg::Lock::Timeout=600 install -y -q "$@"; }
  elif command -v dnf >/dev/null 2>&1; then dnf install -y "$@"
  elif command -v yum >/dev/null 2>&1; then yum install -y "$@"
  elif command -v zypper >/dev/null 2>&1; then zypper --non-interactive install "$@"
  elif command -v apk >/dev/null 2>&1; then apk add "$@"
  else log "no known package manager to install $*"; return 1
  fi
}

# A Squid the image enables (or the last boot's user-data left) starts before this script and may
# serve a conf that is not the operator's (a stock squid.conf reaches the metadata server): stop it
# first, so nothing serves until the operator's conf is installed.
if command -v squid >/dev/null 2>&1; then
  squid_service stop >/dev/null 2>&1 || log "cannot stop squid before installing the conf"
fi

__FETCH__

if ! command -v squid >/dev/null 2>&1; then
  guard=0
  if command -v apt-get >/dev/null 2>&1 && [ ! -e "$POLICY_RC_D" ]; then
    # Debian starts a service on install: policy-rc.d answering 101 keeps the stock squid.conf
    # from ever serving (invoke-rc.d, deb-systemd-invoke honour it).
    printf '#!/bin/sh\nexit 101\n' > "$POLICY_RC_D" && chmod 0755 "$POLICY_RC_D" && guard=1
  fi
  pkg_install squid; rc=$?
  [ "$guard" = 1 ] && rm -f "$POLICY_RC_D"
  [ "$rc" -eq 0 ] || fail "cannot install squid"
fi
__INSTALL_EGRESS__
# Squid's user may not reach the metadata server, loopback or the denied ranges, whatever its
# squid.conf says: loaded before Squid serves, and again by squid.service before every start.
install_egress "$SRC/egress.nft" || fail "cannot load the egress rules for Squid's user"

install_files() {
  (umask 022; mkdir -p "$(dirname "$CONF")") || fail "cannot create $(dirname "$CONF")"
  cp "$SRC/squid.conf" "$CONF.proxy-operator.new" && chmod 0644 "$CONF.proxy-operator.new" &&
    mv -f "$CONF.proxy-operator.new" "$CONF" || fail "cannot write $CONF"
  if [ "$AUTH" = 1 ]; then
    dir=$(dirname "$HTPASSWD")
    (umask 022; mkdir -p "$dir") && chmod 0755 "$dir" || fail "cannot create $dir"
    cp "$SRC/htpasswd" "$HTPASSWD.new" || fail "cannot write $HTPASSWD"
    # Squid's group reads it: "proxy" on Debian/Ubuntu, "squid" on Fedora/RHEL/SUSE/Alpine.
    chgrp proxy "$HTPASSWD.new" 2>/dev/null || chgrp squid "$HTPASSWD.new" 2>/dev/null ||
      log "neither group proxy nor squid exists; $HTPASSWD stays root's"
    chmod 0640 "$HTPASSWD.new" && mv -f "$HTPASSWD.new" "$HTPASSWD" || fail "cannot write $HTPASSWD"
  else
    rm -f "$HTPASSWD"
  fi
}

apply() {
  install_files
  squid -k parse -f "$CONF" >/dev/null 2>&1 || fail "squid -k parse refuses the operator's squid.conf"
  squid_service restart || fail "cannot restart squid"
  log "squid runs the operator's squid.conf"
}

apply
__AFTER__
exit 0
"""


def boot_script(*, header: str, fetch: str, after: str = "") -> str:
    """Return the per-boot shell script: the provider's ``fetch`` snippet inside the shared install.

    Args:
        header: comment lines (each starting with ``#``) saying which provider's script this is
            and where it reads the files.
        fetch: POSIX shell run after a running Squid is stopped: it must leave ``squid.conf``,
            ``egress.nft`` and (when ``AUTH=1``) ``htpasswd`` in the directory ``$SRC`` and set
            ``AUTH`` to 1 or 0, calling ``fail MESSAGE`` when it cannot.
        after: POSIX shell run once Squid serves the operator's conf (it may call ``apply``
            again), or empty.
    Returns:
        the script's text, starting with ``#!/bin/sh``.
    Raises:
        ValueError: ``header`` has a line that is not a shell comment, naming the line.
    """
    for line in header.splitlines():
        if not line.startswith("#"):
            raise ValueError(f"boot script header line {line!r} is not a shell comment")
    return (_TEMPLATE.replace("__HEADER__", header.strip())
            .replace("__HTPASSWD__", DEFAULT_HTPASSWD_PATH)
            .replace("__INSTALL_EGRESS__", INSTALL_EGRESS_SH.strip())
            .replace("__FETCH__", fetch.strip())
            .replace("__AFTER__", after.strip()))
