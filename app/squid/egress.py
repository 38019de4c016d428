"""Egress denial at the network layer, beside Squid's own destination rules.

Squid's ``dst`` rules need DNS; a packet filter does not.  VM guests (gcp instances, kvm
domains) get an nftables ruleset that refuses every *new* connection Squid's user opens to
the destinations the squid.conf refuses (:mod:`app.squid.conf`: the metadata addresses always,
loopback, ``0.0.0.0/8``, link-local and ``squid.deniedDestinations`` unless
``squid.allowedDestinations`` exempts them).  The match is the socket owner (nftables
``meta skuid``, https://wiki.nftables.org/wiki-nftables/index.php/Matching_packet_metainformation),
so other users of the VM (its guest agent, SSH, the metadata client of the startup script)
keep their network; replies on connections Squid accepted are never touched (only ``ct state
new`` is judged).  DNS (UDP and TCP port 53) stays open to Squid's user: on GCE the resolver
*is* the metadata address (169.254.169.254), and many images resolve through a loopback stub
(127.0.0.53).

:func:`nftables_rules` renders the ruleset; it refers to ``$squid_uid``, which
:data:`INSTALL_EGRESS_SH` (the shell function both the gcp startup script and the kvm
vendor-data script run) defines from the uid of the user Squid runs as (``proxy`` on
Debian/Ubuntu, ``squid`` on Fedora/RHEL/SUSE/Alpine), before loading the file with ``nft -f``
and, on systemd, making ``squid.service`` load it again before every start (a drop-in with
``ExecStartPre``: Squid does not start when the rules cannot be loaded).
"""

from __future__ import annotations

import ipaddress

from app.squid.conf import DEFAULT_DENIED_DESTINATIONS, METADATA_ADDRESSES, SquidPolicy

#: nftables table the ruleset owns (replaced as a whole at every load).
TABLE = "proxy_operator_egress"
#: Where the install function writes the ruleset (with its ``define squid_uid``) on a guest.
EGRESS_RULES_PATH = "/etc/proxy-operator/squid-egress.nft"
#: systemd drop-in directory of Squid's unit on a guest.
SQUID_DROPIN_DIR = "/etc/systemd/system/squid.service.d"

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _split(cidrs) -> tuple[list[Network], list[Network]]:
    """Return ``cidrs`` collapsed into (IPv4, IPv6) lists; IPv4-mapped IPv6 ranges count as IPv4."""
    v4: list[ipaddress.IPv4Network] = []
    v6: list[ipaddress.IPv6Network] = []
    for cidr in cidrs:
        net = ipaddress.ip_network(cidr, strict=False)
        if (isinstance(net, ipaddress.IPv6Network) and net.network_address.ipv4_mapped is not None
                and net.prefixlen >= 96):
            net = ipaddress.ip_network(f"{net.network_address.ipv4_mapped}/{net.prefixlen - 96}")
        if isinstance(net, ipaddress.IPv4Network):
            v4.append(net)
        else:
            v6.append(net)
    return list(ipaddress.collapse_addresses(v4)), list(ipaddress.collapse_addresses(v6))


def _rules(verdict: str, cidrs, comment: str, match: str = "") -> list[str]:
    v4, v6 = _split(cidrs)
    return [f"    {match}{family} daddr {{ {', '.join(map(str, nets))} }} counter {verdict} comment \"{comment}\""
            for family, nets in (("ip", v4), ("ip6", v6)) if nets]


def nftables_rules(policy: SquidPolicy | None = None) -> str:
    """Return the nftables ruleset (``nft -f`` text) for the Squid user of a proxy with ``policy``.

    The text refers to ``$squid_uid`` (a numeric uid the loader defines first, see
    :data:`INSTALL_EGRESS_SH`) and replaces the table :data:`TABLE` atomically when loaded.
    Order: connections that are not new pass; users other than ``$squid_uid`` pass; DNS
    (port 53) passes; the metadata addresses are rejected; ``allowed_destinations`` pass;
    :data:`app.squid.conf.DEFAULT_DENIED_DESTINATIONS` and ``denied_destinations`` are rejected
    (TCP with a reset, anything else with ICMP administratively prohibited, so ``connect``
    fails at once).

    Args:
        policy: the proxy's :class:`app.squid.conf.SquidPolicy` (defaults when ``None``).
    Raises:
        ValueError: a bad CIDR in ``policy``.
    """
    policy = policy or SquidPolicy()
    reject = "reject with icmpx type admin-prohibited"
    lines = [
        "# rendered by proxy-operator (app/squid/egress.py): new connections of Squid's user ($squid_uid)",
        "# to the destinations its squid.conf refuses are rejected here too",
        f"table inet {TABLE}",
        f"delete table inet {TABLE}",
        f"table inet {TABLE} {{",
        "  chain output {",
        "    type filter hook output priority filter; policy accept;",
        "    ct state != new accept",
        "    meta skuid != $squid_uid accept",
        "    meta l4proto { tcp, udp } th dport 53 accept comment \"DNS (the GCE resolver is 169.254.169.254)\"",
    ]
    denied = (*DEFAULT_DENIED_DESTINATIONS, *policy.denied_destinations)
    tcp, reset = "meta l4proto tcp ", "reject with tcp reset"
    lines += [*_rules(reset, METADATA_ADDRESSES, "metadata server", tcp),
              *_rules(reject, METADATA_ADDRESSES, "metadata server"),
              *_rules("accept", policy.allowed_destinations, "squid.allowedDestinations"),
              *_rules(reset, denied, "denied destinations", tcp),
              *_rules(reject, denied, "denied destinations")]
    lines += ["  }", "}"]
    return "\n".join(lines) + "\n"


#: POSIX sh function ``install_egress RULES`` (RULES: a file holding :func:`nftables_rules`'
#: text): finds Squid's user, installs nftables when ``nft`` is missing (the caller defines
#: ``pkg_install``), writes ``define squid_uid = <uid>`` and the rules to
#: :data:`EGRESS_RULES_PATH`, loads them, and on systemd adds the ``ExecStartPre`` drop-in to
#: :data:`SQUID_DROPIN_DIR`.  Returns non-zero (after a line on stderr) when any step fails.
#: ``nft`` is looked up on ``PATH`` (cloud-init and GCE's guest environment include ``/usr/sbin``).
#: ``PROXY_OPERATOR_EGRESS_RULES``, ``PROXY_OPERATOR_SQUID_DROPIN_DIR`` and
#: ``PROXY_OPERATOR_SQUID_USER`` override the path, the directory and the user for the tests.
INSTALL_EGRESS_SH = r"""
install_egress() {
  egress_file="${PROXY_OPERATOR_EGRESS_RULES:-__RULES_PATH__}"
  dropin_dir="${PROXY_OPERATOR_SQUID_DROPIN_DIR:-__DROPIN_DIR__}"
  if [ -n "${PROXY_OPERATOR_SQUID_USER:-}" ]; then
    uid=$(id -u "$PROXY_OPERATOR_SQUID_USER" 2>/dev/null)
  else
    uid=$(id -u proxy 2>/dev/null || id -u squid 2>/dev/null)
  fi
  [ -n "$uid" ] || { echo "proxy-operator: neither user proxy nor squid exists for the egress rules" >&2; return 1; }
  nft_bin=$(command -v nft 2>/dev/null)
  if [ -z "$nft_bin" ]; then
    pkg_install nftables || { echo "proxy-operator: nftables is missing and cannot be installed" >&2; return 1; }
    nft_bin=$(command -v nft 2>/dev/null) || { echo "proxy-operator: no nft after installing nftables" >&2; return 1; }
  fi
  (umask 022; mkdir -p "$(dirname "$egress_file")") || return 1
  { echo "define squid_uid = $uid"; cat "$1"; } > "$egress_file.new" && chmod 0644 "$egress_file.new" &&
    mv -f "$egress_file.new" "$egress_file" || { echo "proxy-operator: cannot write $egress_file" >&2; return 1; }
  "$nft_bin" -f "$egress_file" || { echo "proxy-operator: nft refuses $egress_file" >&2; return 1; }
  if [ -d /run/systemd/system ] || [ -n "${PROXY_OPERATOR_SQUID_DROPIN_DIR:-}" ]; then
    (umask 022; mkdir -p "$dropin_dir") &&
      printf '[Service]\nExecStartPre=%s -f %s\n' "$nft_bin" "$egress_file" \
        > "$dropin_dir/proxy-operator-egress.conf" ||
      { echo "proxy-operator: cannot write the squid.service drop-in" >&2; return 1; }
    [ -n "${PROXY_OPERATOR_SQUID_DROPIN_DIR:-}" ] || systemctl daemon-reload
  fi
  return 0
}
""".replace("__RULES_PATH__", EGRESS_RULES_PATH).replace("__DROPIN_DIR__", SQUID_DROPIN_DIR)


#: Name of the NetworkPolicy the kubernetes provider keeps in every namespace it runs Squid Pods in.
NETWORK_POLICY_NAME = "proxy-operator-squid-egress"


def _except(cidr: Network, nets: list[Network]) -> list[str]:
    """``ipBlock.except`` of ``cidr``: the ``nets`` strictly inside it (the API refuses others)."""
    return [str(n) for n in nets
            if n.version == cidr.version and n != cidr and n.subnet_of(cidr)]  # type: ignore[arg-type]  # same version


def squid_network_policy(policy: SquidPolicy | None, namespace: str, pod_labels: dict[str, str]) -> dict:
    """Return the ``networking.k8s.io/v1`` NetworkPolicy that limits the Squid Pods' egress.

    It selects the Pods carrying ``pod_labels`` in ``namespace`` and allows egress to DNS
    (UDP and TCP port 53, any destination), to everything but the metadata addresses,
    :data:`app.squid.conf.DEFAULT_DENIED_DESTINATIONS` and ``denied_destinations`` (``ipBlock``
    ``0.0.0.0/0`` and ``::/0`` with those as ``except``), and to ``allowed_destinations``
    (never the metadata addresses).  A NetworkPolicy allows only what some rule lists
    (https://kubernetes.io/docs/concepts/services-networking/network-policies/); it needs a
    CNI that enforces it, and traffic inside the Pod (its loopback) is never subject to it.

    Args:
        policy: the provider's :class:`app.squid.conf.SquidPolicy` (defaults when ``None``).
        namespace: the Pods' namespace.
        pod_labels: labels every Squid Pod of the provider carries (the ``podSelector``).
    Raises:
        ValueError: a bad CIDR in ``policy``.
    """
    policy = policy or SquidPolicy()
    denied4, denied6 = _split((*METADATA_ADDRESSES, *DEFAULT_DENIED_DESTINATIONS, *policy.denied_destinations))
    meta4, meta6 = _split(METADATA_ADDRESSES)
    peers = [{"ipBlock": {"cidr": "0.0.0.0/0", "except": [str(n) for n in denied4]}},
             {"ipBlock": {"cidr": "::/0", "except": [str(n) for n in denied6]}}]
    allowed4, allowed6 = _split(policy.allowed_destinations)
    for net in (*allowed4, *allowed6):
        if any(net.subnet_of(m) for m in (meta4 if net.version == 4 else meta6)):  # type: ignore[arg-type]  # same version
            continue  # the metadata addresses are never exempted
        block: dict = {"cidr": str(net)}
        inner = _except(net, meta4 if net.version == 4 else meta6)
        if inner:
            block["except"] = inner
        peers.append({"ipBlock": block})
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": NETWORK_POLICY_NAME, "namespace": namespace,
                     "labels": {"app.kubernetes.io/managed-by": "proxy-operator",
                                "app.kubernetes.io/component": "squid-egress"}},
        "spec": {
            "podSelector": {"matchLabels": dict(pod_labels)},
            "policyTypes": ["Egress"],
            "egress": [{"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
                       {"to": peers}],
        },
    }
