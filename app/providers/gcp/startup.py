"""The ``startup-script`` every gcp instance gets: it installs the operator's squid.conf itself.

The squid.conf (:mod:`app.squid.conf`: loopback, link-local and the metadata server refused, plus
``squid.deniedDestinations``) and the htpasswd line travel in instance metadata
(``squid-conf``, ``squid-htpasswd``).  Nothing on the instance would read them unless the
Proxy's cloud-init did, so a VM running the user's own Squid setup would be an open proxy to
the metadata server (docs/security.md).  The provider therefore adds this
script as the ``startup-script`` metadata item, which GCE's guest environment runs as root at
**every** boot (https://cloud.google.com/compute/docs/instances/startup-scripts/linux),
whatever the user-data says.

Why a startup script and not a cloud-init part: docs/gcp-provider.md, "Squid on the instance".

What the script does, fail-closed (Squid is stopped whenever the operator's conf cannot be
installed):

0. stop a Squid that is already running (the image's, or the last boot's), so that nothing
   serves a conf other than the operator's while the script works;
1. fetch ``squid-conf`` (required, not empty) and ``squid-htpasswd`` (optional: a 404 means
   no basic auth; missing or empty while the conf turns basic auth on, it is a failure) from
   the metadata server with ``Metadata-Flavor: Google``, retrying while it is not reachable
   yet or answers anything but 200 or 404;
2. install Squid when it is missing, with Debian's ``policy-rc.d`` answering 101 so the
   package's stock squid.conf never starts serving;
3. write the conf (0644) and the htpasswd (0640, group ``proxy`` or ``squid``, never
   world-readable) atomically, check the conf with ``squid -k parse``, restart Squid;
4. when cloud-init is present, wait for it to finish and install the operator's files again if
   the user-data replaced them.

Between 2 and 3 it loads ``squid-egress-nft`` (required), the nftables ruleset that rejects
Squid's user's new connections to the denied destinations, and makes ``squid.service`` load it
before every start (:mod:`app.squid.egress`); when it cannot, Squid is stopped.

Every path is overridable through ``PROXY_OPERATOR_*`` environment variables, so the script
can run outside GCE against a stand-in metadata server; GCE runs it with none of them set.
"""

from __future__ import annotations

from app.squid.egress import INSTALL_EGRESS_SH
from app.squid.conf import DEFAULT_HTPASSWD_PATH

#: Metadata key GCE's guest environment runs at every boot.
STARTUP_SCRIPT_KEY = "startup-script"
#: Where the script reads the instance's attributes.
METADATA_ATTRIBUTES_URL = "http://metadata.google.internal/computeMetadata/v1/instance/attributes"

STARTUP_SCRIPT = r"""#!/bin/sh
# proxy-operator startup-script (app/providers/gcp/startup.py): run Squid with the operator's
# squid.conf from the instance metadata (squid-conf, squid-htpasswd) at every boot, whatever the
# user-data does. Fail-closed: Squid is stopped when the conf cannot be installed.
set -u
MD="${PROXY_OPERATOR_METADATA_URL:-__METADATA_URL__}"
CONF="${PROXY_OPERATOR_SQUID_CONF:-/etc/squid/squid.conf}"
HTPASSWD="${PROXY_OPERATOR_HTPASSWD:-__HTPASSWD__}"
POLICY_RC_D="${PROXY_OPERATOR_POLICY_RC_D:-/usr/sbin/policy-rc.d}"
ATTEMPTS="${PROXY_OPERATOR_FETCH_ATTEMPTS:-60}"
PAUSE="${PROXY_OPERATOR_FETCH_PAUSE:-2}"
CLOUD_INIT_WAIT="${PROXY_OPERATOR_CLOUD_INIT_WAIT:-1800}"

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

command -v curl >/dev/null 2>&1 || pkg_install curl || fail "curl is missing and cannot be installed"

umask 077
TMP=$(mktemp -d) || fail "cannot create a temporary directory"
trap 'rm -rf "$TMP"' EXIT

# fetch KEY FILE: 0 written, 1 no such attribute (404), 2 the metadata server did not answer.
fetch() {
  code=$(curl -sS -o "$2" -w '%{http_code}' --max-time 10 -H 'Metadata-Flavor: Google' "$MD/$1") || code=000
  case "$code" in
    200) return 0 ;;
    404) return 1 ;;
    *) log "metadata $1: HTTP $code"; return 2 ;;
  esac
}

# fetch_retry KEY FILE: as fetch, retrying while the metadata server does not answer.
fetch_retry() {
  n=1
  while :; do
    fetch "$1" "$2"; rc=$?
    [ "$rc" -ne 2 ] && return "$rc"
    [ "$n" -ge "$ATTEMPTS" ] && return 2
    n=$((n + 1)); sleep "$PAUSE"
  done
}

fetch_retry squid-conf "$TMP/squid.conf"
case $? in
  0) ;;
  1) fail "the instance metadata has no squid-conf" ;;
  *) fail "the metadata server did not answer for squid-conf" ;;
esac
[ -s "$TMP/squid.conf" ] || fail "squid-conf is empty"
fetch_retry squid-egress-nft "$TMP/egress.nft"
case $? in
  0) ;;
  1) fail "the instance metadata has no squid-egress-nft" ;;
  *) fail "the metadata server did not answer for squid-egress-nft" ;;
esac
[ -s "$TMP/egress.nft" ] || fail "squid-egress-nft is empty"
fetch_retry squid-htpasswd "$TMP/htpasswd"
case $? in
  0) AUTH=1 ;;
  1) AUTH=0 ;;
  *) fail "the metadata server did not answer for squid-htpasswd" ;;
esac
# A conf with basic auth needs its password file: without one every client would get 407 (or
# Squid dies when its auth helper cannot read the file) while this script reported success.
if grep -Eq '^[[:space:]]*auth_param[[:space:]]+basic[[:space:]]+program' "$TMP/squid.conf"; then
  [ "$AUTH" = 1 ] || fail "squid-conf turns basic auth on but the instance metadata has no squid-htpasswd"
  [ -s "$TMP/htpasswd" ] || fail "squid-conf turns basic auth on but squid-htpasswd is empty"
fi

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
install_egress "$TMP/egress.nft" || fail "cannot load the egress rules for Squid's user"

install_files() {
  (umask 022; mkdir -p "$(dirname "$CONF")") || return 1
  cp "$TMP/squid.conf" "$CONF.proxy-operator.new" && chmod 0644 "$CONF.proxy-operator.new" &&
    mv -f "$CONF.proxy-operator.new" "$CONF" || return 1
  if [ "$AUTH" = 1 ]; then
    dir=$(dirname "$HTPASSWD")
    (umask 022; mkdir -p "$dir") && chmod 0755 "$dir" || return 1
    cp "$TMP/htpasswd" "$HTPASSWD.new" || return 1
    # Squid's group reads it: "proxy" on Debian/Ubuntu, "squid" on Fedora/RHEL/SUSE/Alpine.
    chgrp proxy "$HTPASSWD.new" 2>/dev/null || chgrp squid "$HTPASSWD.new" 2>/dev/null ||
      log "neither group proxy nor squid exists; $HTPASSWD stays root's"
    chmod 0640 "$HTPASSWD.new" && mv -f "$HTPASSWD.new" "$HTPASSWD" || return 1
  else
    rm -f "$HTPASSWD"
  fi
}

apply() {
  install_files || fail "cannot write $CONF or $HTPASSWD"
  squid -k parse -f "$CONF" >/dev/null 2>&1 || fail "squid -k parse refuses the operator's squid.conf"
  squid_service restart || fail "cannot restart squid"
  log "squid runs the operator's squid.conf"
}

same() {
  cmp -s "$TMP/squid.conf" "$CONF" || return 1
  [ "$AUTH" = 0 ] || cmp -s "$TMP/htpasswd" "$HTPASSWD"
}

apply
if command -v cloud-init >/dev/null 2>&1; then
  # The user-data may still install or configure Squid: once cloud-init is done, the
  # operator's files win again.
  timeout "$CLOUD_INIT_WAIT" cloud-init status --wait >/dev/null 2>&1
  if ! same; then
    log "the user-data replaced Squid's configuration; installing the operator's again"
    apply
  fi
fi
exit 0
""".replace("__METADATA_URL__", METADATA_ATTRIBUTES_URL).replace("__HTPASSWD__", DEFAULT_HTPASSWD_PATH).replace(
    "__INSTALL_EGRESS__", INSTALL_EGRESS_SH.strip())
