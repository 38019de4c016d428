"""What the probe says about, and where it refuses to go for, endpoints a Proxy author picks.

An External Proxy's endpoint may point at any TCP service the health worker reaches: the probe
must not turn into a banner grabber (the Healthy condition is readable by the Proxy author), and
it refuses every metadata-server name Squid refuses.  Real listeners on loopback, the real probe.
"""

from __future__ import annotations

import socket
import threading

import pytest

from app.probes import probe as p
from app.probes.destinations import DestinationPolicy, parse_ranges

pytestmark = pytest.mark.timeout(120)


class _Talker:
    """A TCP listener on loopback that answers every connection with ``reply`` and closes."""

    def __init__(self, reply: bytes) -> None:
        self.reply = reply
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    conn.recv(65536)
                    conn.sendall(self.reply)
                except OSError:
                    pass

    def close(self) -> None:
        self._stop = True
        self.sock.close()


@pytest.fixture()
def talker():
    made: list[_Talker] = []

    def start(reply: bytes) -> _Talker:
        made.append(_Talker(reply))
        return made[-1]

    yield start
    for t in made:
        t.close()


BANNER = b"secret-banner-7f3a"
#: How the test suite lets probes reach loopback (production denies it; the point here is what
#: a reachable non-proxy service leaks, e.g. one in the cluster's ranges).
LOOPBACK_ALLOWED = DestinationPolicy(allowed=parse_ranges("127.0.0.0/8"))


@pytest.mark.parametrize("reply", [
    b"SSH-2.0-OpenSSH_9.2 " + BANNER + b"\r\n",             # not HTTP at all
    b"-NOAUTH Authentication required. " + BANNER + b"\r\n",  # Redis
    b"HTTP/1.1 400 " + BANNER + b"\r\nX-Squid-Error: " + BANNER + b"\r\nContent-Length: 0\r\n\r\n",
])
@pytest.mark.parametrize("url", ["http://192.0.2.1/generate_204", "https://192.0.2.1/generate_204"])
def test_the_probe_never_copies_what_a_non_proxy_service_says_into_the_condition(talker, reply, url):
    """An External Proxy's endpoint pointed at any TCP service the health worker reaches (Redis, an
    SSH daemon, an internal web app): the probe's message (the Healthy condition, readable by the
    Proxy author) used to carry the service's first line, a reason phrase or a header of its
    choice: a banner grabber.  Now only the reason, the status code and Squid's own error codes."""
    server = talker(reply)
    result = p.probe(p.ProbeTarget("uid-banner", "127.0.0.1", server.port, url, timeout=5), policy=LOOPBACK_ALLOWED)
    assert not result.ok
    assert BANNER.decode() not in result.message, result.message
    assert "secret" not in result.message


def test_squid_error_codes_and_standard_phrases_are_still_shown(talker):
    squid_like = talker(b"HTTP/1.1 403 Forbidden\r\nX-Squid-Error: ERR_ACCESS_DENIED 0\r\nContent-Length: 0\r\n\r\n")
    plain = p.probe(p.ProbeTarget("u1", "127.0.0.1", squid_like.port, "http://192.0.2.1/", timeout=5),
                    policy=LOOPBACK_ALLOWED)
    assert plain.reason == p.UNEXPECTED_STATUS and "ERR_ACCESS_DENIED 0" in plain.message, plain.message
    tunnel = p.probe(p.ProbeTarget("u2", "127.0.0.1", squid_like.port, "https://192.0.2.1/", timeout=5),
                     policy=LOOPBACK_ALLOWED)
    assert tunnel.reason == p.TUNNEL_FAILED and tunnel.message.endswith("403 Forbidden"), tunnel.message


@pytest.mark.parametrize("host", ["metadata.goog", "METADATA.GOOG.", "metadata.google.internal."])
def test_the_probe_refuses_every_metadata_name_squid_refuses(host):
    """``metadata.goog`` was refused by Squid but not by the probe's policy (which only denies it
    when it resolves here to a link-local address)."""
    from app.probes.destinations import DestinationDenied

    with pytest.raises(DestinationDenied, match="metadata"):
        DestinationPolicy().endpoint_address(host, 80)
    with pytest.raises(DestinationDenied, match="metadata"):
        DestinationPolicy().check_url(f"http://{host}/computeMetadata/v1/")
