"""A DNS server whose failures a test controls (twisted.names), for Squid's resolver.

Run it as a script, usually inside a test network namespace::

    python -m tests.support.flaky_dns ADDRESS RECORDS_JSON STATE_FILE

It serves UDP and TCP port 53 on ``ADDRESS``.  ``RECORDS_JSON`` maps names to one address
(``{"evil.test": "169.254.169.254"}``): an A or AAAA answer by the address's family, an empty
answer for the other type, NXDOMAIN for unknown names.  ``STATE_FILE`` decides, at every
query, how the server behaves:

* ``up`` (or a missing file): answer;
* ``down``: answer SERVFAIL (the resolver cannot reach anything);
* ``flap N``: SERVFAIL for the first ``N`` queries of each (name, type), then answer (the
  resolver comes back in the middle of a request's lookups).

It prints ``READY`` once it listens, then ``QUERY <name> <type> <count> <verdict>`` per query.
"""

from __future__ import annotations

import json
import sys

from twisted.internet import defer, reactor
from twisted.names import dns, error, server


class Resolver:
    """The resolver behind :class:`twisted.names.server.DNSServerFactory` (its ``query`` interface)."""

    def __init__(self, records: dict[str, str], state_file: str) -> None:
        self.records = {name.lower().rstrip("."): addr for name, addr in records.items()}
        self.state_file = state_file
        self.counts: dict[tuple[str, int], int] = {}

    def state(self) -> tuple[str, int]:
        try:
            with open(self.state_file) as fh:
                words = fh.read().split()
        except FileNotFoundError:
            words = []
        if not words:
            return "up", 0
        return words[0], int(words[1]) if len(words) > 1 else 0

    def query(self, query, timeout=None):
        name = query.name.name.decode("ascii", "replace").lower().rstrip(".")
        key = (name, query.type)
        count = self.counts[key] = self.counts.get(key, 0) + 1
        mode, n = self.state()
        fail = mode == "down" or (mode == "flap" and count <= n)
        print("QUERY", name, dns.QUERY_TYPES.get(query.type, query.type), count, "SERVFAIL" if fail else "answer",
              flush=True)
        if fail:
            return defer.fail(error.DNSServerError("resolver down (test)"))
        if name not in self.records:
            return defer.fail(error.DomainError(name))
        addr = self.records[name]
        rtype, record = (dns.AAAA, dns.Record_AAAA) if ":" in addr else (dns.A, dns.Record_A)
        if query.type != rtype:
            return defer.succeed(([], [], []))
        answer = dns.RRHeader(name=query.name.name, type=rtype, ttl=60, payload=record(addr, ttl=60))
        return defer.succeed(([answer], [], []))


def main(argv: list[str]) -> None:
    address, records, state_file = argv
    factory = server.DNSServerFactory(clients=[Resolver(json.loads(records), state_file)])
    reactor.listenUDP(53, dns.DNSDatagramProtocol(controller=factory), interface=address)
    reactor.listenTCP(53, factory, interface=address)
    print("READY", flush=True)
    reactor.run()


if __name__ == "__main__":
    main(sys.argv[1:])
