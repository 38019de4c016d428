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
installed); steps 0, 2 and 3 are the part it shares with the aws per-boot script
(:func:`app.squid.boot.boot_script`), step 1 and 4 are its own:

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

from app.squid.boot import boot_script

#: Metadata key GCE's guest environment runs at every boot.
STARTUP_SCRIPT_KEY = "startup-script"
#: Where the script reads the instance's attributes.
METADATA_ATTRIBUTES_URL = "http://metadata.google.internal/computeMetadata/v1/instance/attributes"

_FETCH = r"""MD="${PROXY_OPERATOR_METADATA_URL:-__METADATA_URL__}"
ATTEMPTS="${PROXY_OPERATOR_FETCH_ATTEMPTS:-60}"
PAUSE="${PROXY_OPERATOR_FETCH_PAUSE:-2}"
CLOUD_INIT_WAIT="${PROXY_OPERATOR_CLOUD_INIT_WAIT:-1800}"

command -v curl >/dev/null 2>&1 || pkg_install curl || fail "curl is missing and cannot be installed"

umask 077
SRC=$(mktemp -d) || fail "cannot create a temporary directory"
trap 'rm -rf "$SRC"' EXIT

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

fetch_retry squid-conf "$SRC/squid.conf"
case $? in
  0) ;;
  1) fail "the instance metadata has no squid-conf" ;;
  *) fail "the metadata server did not answer for squid-conf" ;;
esac
[ -s "$SRC/squid.conf" ] || fail "squid-conf is empty"
fetch_retry squid-egress-nft "$SRC/egress.nft"
case $? in
  0) ;;
  1) fail "the instance metadata has no squid-egress-nft" ;;
  *) fail "the metadata server did not answer for squid-egress-nft" ;;
esac
[ -s "$SRC/egress.nft" ] || fail "squid-egress-nft is empty"
fetch_retry squid-htpasswd "$SRC/htpasswd"
case $? in
  0) AUTH=1 ;;
  1) AUTH=0 ;;
  *) fail "the metadata server did not answer for squid-htpasswd" ;;
esac
# A conf with basic auth needs its password file: without one every client would get 407 (or
# Squid dies when its auth helper cannot read the file) while this script reported success.
if grep -Eq '^[[:space:]]*auth_param[[:space:]]+basic[[:space:]]+program' "$SRC/squid.conf"; then
  [ "$AUTH" = 1 ] || fail "squid-conf turns basic auth on but the instance metadata has no squid-htpasswd"
  [ -s "$SRC/htpasswd" ] || fail "squid-conf turns basic auth on but squid-htpasswd is empty"
fi""".replace("__METADATA_URL__", METADATA_ATTRIBUTES_URL)

_AFTER = r"""same() {
  cmp -s "$SRC/squid.conf" "$CONF" || return 1
  [ "$AUTH" = 0 ] || cmp -s "$SRC/htpasswd" "$HTPASSWD"
}

if command -v cloud-init >/dev/null 2>&1; then
  # The user-data may still install or configure Squid: once cloud-init is done, the
  # operator's files win again.
  timeout "$CLOUD_INIT_WAIT" cloud-init status --wait >/dev/null 2>&1
  if ! same; then
    log "the user-data replaced Squid's configuration; installing the operator's again"
    apply
  fi
fi"""

#: The script itself (:func:`app.squid.boot.boot_script` around the metadata fetch).
STARTUP_SCRIPT = boot_script(
    header="""# proxy-operator startup-script (app/providers/gcp/startup.py): run Squid with the operator's
# squid.conf from the instance metadata (squid-conf, squid-htpasswd) at every boot, whatever the
# user-data does. Fail-closed: Squid is stopped when the conf cannot be installed.""",
    fetch=_FETCH, after=_AFTER)
