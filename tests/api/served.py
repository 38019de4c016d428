"""``proxy-operator api`` as a test runs it, and a raw HTTP/1.1 client for hostile requests.

The server is the real command (granian, api/server.py) on 127.0.0.1 and a free port; the
client writes bytes as given (half-sent heads, chunked bodies, invalid encodings) and reads
responses framed by Content-Length.
"""

from __future__ import annotations

import socket
import threading
import time

from devcluster.redis_server import free_port
from tests.support.processes import BIN, Process

TOKEN = "server-test-token-0123456789"
CLI = str(BIN / "proxy-operator")


def write_tokens(directory, text: str | None = None) -> str:
    """Write a tokens file in ``directory``: ``text``, or by default one client, ``crawler-a``
    (:data:`TOKEN`); its path."""
    path = directory / "tokens.yaml"
    path.write_text(text if text is not None else f"sharedNamespaces: [\"*\"]\nclients:\n  - {{name: crawler-a, token: {TOKEN}}}\n")
    return str(path)


def start_api(directory, redis_url: str, env: dict | None = None, port: int | None = None,
              tokens: str | None = None) -> tuple[Process, int]:
    """Start ``proxy-operator api`` on 127.0.0.1 (a free port unless ``port``), logging under
    ``directory``, with its own metrics directory and the tokens file ``tokens`` (YAML text;
    default: :func:`write_tokens`'s); wait until ``/healthz`` answers 200.

    Returns:
        ``(process, port)``; the caller stops the process.
    Raises:
        AssertionError: not answering within 30 s (with the log).
    """
    port = port or free_port()
    proc = Process("api", [CLI, "api", "--bind", f"127.0.0.1:{port}", "--tokens-file", write_tokens(directory, tokens)],
                   {"REDIS_URL": redis_url, "PROMETHEUS_MULTIPROC_DIR": "", **(env or {})}, str(directory)).start()
    deadline = time.monotonic() + 30
    while True:
        try:
            if request(port, "GET", "/healthz", timeout=2)[0] == 200:
                return proc, port
        except OSError:
            pass
        assert time.monotonic() < deadline and proc.alive(), proc.log()
        time.sleep(0.2)


def head(method: str, path: str, *, token: str | None = TOKEN, extra: str = "") -> bytes:
    """A request head (HTTP/1.1, keep-alive) ending with the blank line."""
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return f"{method} {path} HTTP/1.1\r\nHost: api\r\n{auth}{extra}\r\n".encode()


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Read one response framed by Content-Length; ``(status, headers, body)``."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a complete response head: {buf[:200]!r}")
        buf += chunk
    raw_head, _, rest = buf.partition(b"\r\n\r\n")
    lines = raw_head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return int(lines[0].split(" ")[1]), headers, rest[:length]


def exchange(port: int, raw: bytes, body_parts: list[bytes] = (), timeout: float = 10) -> tuple[int, dict, bytes]:
    """Send ``raw`` and then ``body_parts`` on a fresh connection (from a thread, so a server
    that answers before reading everything is still heard); return the response."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)

    def send() -> None:
        try:
            sock.sendall(raw)
            for part in body_parts:
                sock.sendall(part)
        except OSError:
            pass  # the server answered and closed without reading the rest: fine

    writer = threading.Thread(target=send, daemon=True)
    writer.start()
    try:
        return read_response(sock)
    finally:
        writer.join(5)
        sock.close()


def request(port: int, method: str, path: str, body: bytes | None = None, *, token: str | None = TOKEN,
            timeout: float = 10, content_type: str = "application/json") -> tuple[int, dict, bytes]:
    """One request with a Content-Length body on a fresh connection."""
    extra = f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n" if body is not None else ""
    return exchange(port, head(method, path, token=token, extra=extra) + (body or b""), timeout=timeout)
