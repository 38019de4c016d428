"""Real local servers for the health and API tests (loopback only).

* :class:`OriginServer` — an HTTP origin: ``/generate_204`` answers 204, ``/status/<n>`` answers
  ``n``, ``/ratelimit/<s>`` answers 429 with ``Retry-After: <s>``, ``/headers`` echoes the request headers as JSON, ``/ip`` echoes the client's address
  (the IP-echo service; ``/ip.json`` answers ``{"ip": ...}``).
* :class:`TLSOrigin` — an HTTPS origin with a self-signed certificate for ``127.0.0.1``-style
  addresses (a probe that does not trust it fails with a TLS error).
* :class:`Blackhole` — a TCP listener that accepts and never answers (probe timeouts).
* :func:`free_port` — a free TCP port on a loopback address.
"""

from __future__ import annotations

import datetime
import http.server
import ipaddress
import json
import os
import shutil
import socket
import ssl
import tempfile
import threading

from devcluster.loopback import free_port  # noqa: F401 - re-exported: the health tests use it


class _OriginHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, *args) -> None:  # keep test output quiet
        pass

    def _send(self, status: int, body: bytes = b"", ctype: str = "text/plain") -> None:
        self.send_response(status)
        if status != 204:
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if status != 204 and body:
            self.wfile.write(body)

    def do_GET(self) -> None:  # http.server API
        self.server.requests.append({"path": self.path, "headers": dict(self.headers.items())})
        path = self.path.split("?")[0]
        if path == "/generate_204":
            self._send(204)
        elif path.startswith("/status/"):
            self._send(int(path.rsplit("/", 1)[1]), b"status\n")
        elif path.startswith("/ratelimit/"):
            body = b"slow down\n"
            self.send_response(429)
            self.send_header("Retry-After", path.rsplit("/", 1)[1])
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif path == "/headers":
            self._send(200, json.dumps(dict(self.headers.items())).encode(), "application/json")
        elif path == "/ip":
            self._send(200, (self.client_address[0] + "\n").encode())
        elif path == "/ip.json":
            self._send(200, json.dumps({"ip": self.client_address[0]}).encode(), "application/json")
        elif path == "/garbage":
            self._send(200, b"not an address")
        else:
            self._send(404, b"no such path\n")


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr, handler) -> None:
        super().__init__(addr, handler)
        self.requests: list[dict] = []


class _OneShotHandler(_OriginHandler):
    protocol_version = "HTTP/1.0"  # one request per connection: a stopped origin serves nothing more


class OriginServer:
    """A plain-HTTP origin on ``address:port`` (see the module docstring for its paths).

    Args:
        address / port: where to listen (port ``None``: any free one).
        keep_alive: HTTP/1.1 persistent connections; ``False`` closes each connection after one
            answer, so :meth:`stop` really takes the origin down for a proxy that pools its
            connections to it (an outage test).

    Attributes:
        requests: every request received, as ``{"path", "headers"}`` dicts.
    """

    def __init__(self, address: str = "127.0.0.1", port: int | None = None, *, keep_alive: bool = True) -> None:
        self.address = address
        self.server = _Server((address, port or 0), _OriginHandler if keep_alive else _OneShotHandler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def requests(self) -> list[dict]:
        """Requests received so far."""
        return self.server.requests

    def url(self, path: str) -> str:
        """Return ``http://address:port`` + ``path``."""
        return f"http://{self.address}:{self.port}{path}"

    def start(self) -> "OriginServer":
        """Serve in a daemon thread."""
        self.thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self.server.shutdown()
        self.server.server_close()


def self_signed_cert(address: str, directory: str) -> tuple[str, str]:
    """Write a self-signed CA:TRUE certificate for IP ``address``; return ``(cert_path, key_path)``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "proxy-operator test origin")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(address))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
    with open(cert_path, "wb") as fh:
        fh.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(key_path, "wb") as fh:
        fh.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                   serialization.NoEncryption()))
    return cert_path, key_path


class TLSOrigin(OriginServer):
    """An HTTPS origin with a fresh self-signed certificate (``cert_path`` trusts it)."""

    def __init__(self, address: str = "127.0.0.1", port: int | None = None) -> None:
        super().__init__(address, port)
        self.dir = tempfile.mkdtemp(prefix="tls-origin-")
        self.cert_path, key_path = self_signed_cert(address, self.dir)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.cert_path, key_path)
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)

    def url(self, path: str) -> str:
        """Return ``https://address:port`` + ``path``."""
        return f"https://{self.address}:{self.port}{path}"

    def stop(self) -> None:
        """Stop serving and remove the certificate files."""
        super().stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class Blackhole:
    """A TCP listener on ``address`` that lets the kernel accept connections and never answers."""

    def __init__(self, address: str = "127.0.0.1") -> None:
        self.sock = socket.socket()
        self.sock.bind((address, 0))
        self.sock.listen(128)
        self.address, self.port = address, self.sock.getsockname()[1]

    def stop(self) -> None:
        """Close the listener."""
        self.sock.close()
