"""What runs on every proxy instance: the squid.conf and the egress rules below Squid.

Owns :mod:`app.squid.conf` (``SquidPolicy`` and the rendered squid.conf),
:mod:`app.squid.egress` (nftables for guests, the Squid Pods' egress NetworkPolicy), both
from the same policy, and :mod:`app.squid.boot` (the per-boot shell cloud instances install
them with).  Pure rendering: must not import a provider, the gateway or Redis.
"""
