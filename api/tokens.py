"""API bearer tokens: a YAML file naming each client.

File shape (mounted from a Secret)::

    sharedNamespaces: [crawl-shared]           # optional: what unscoped clients may use
    clients:
      - name: crawler-a
        token: "a-long-random-string"          # at least 16 characters
        namespaces: [team-a]                   # optional scope: proxies of these namespaces
        pools: [crawl-shared/eu]               # optional scope: members of these ProxyPools
      - name: crawler-b
        tokenSHA256: "<64 hex digits>"         # sha256 of the token, instead of the token
        maxLeases: 20                          # optional: live leases it may hold at once

A client's scope is the trust boundary of leasing (:class:`app.serving.leases.Scope`): a client with
``namespaces`` and/or ``pools`` sees, leases, renews and sticks to proxies of those namespaces
or members of those pools (``<namespace>/<name>``) only; request filters narrow it, never widen
it.  A client with neither is *unscoped*: it gets the proxies of ``sharedNamespaces`` (the
namespaces the operator marks as shared; ``["*"]`` = every namespace, the behaviour before
scopes existed), and none when the file names no shared namespace.

``maxLeases`` (an integer >= 0; absent = unlimited, 0 = may list proxies but lease none) caps
the live leases of the client, counted atomically with each lease in Redis
(:func:`app.serving.leases.acquire`: ``429 client_lease_limit`` beyond it).

Validation is strict: an unknown key, a missing or duplicate name, neither or both of
``token``/``tokenSHA256``, a short token, a malformed digest or a token shared by two clients
is rejected with :class:`app.config.validation.ConfigError` naming the file and the field (never the
token's value).  Only SHA-256 digests are kept in memory after loading; a presented token is
hashed and compared with every client's digest with :func:`hmac.compare_digest`, without an
early exit, so the time taken does not depend on which client (if any) matched.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import threading
import time
from dataclasses import dataclass

from app.serving.leases import EVERYTHING, Scope
from app.config.tenancy import NAMESPACE, namespace_list
from app.config.validation import ConfigError, Reader, load_yaml

log = logging.getLogger(__name__)

MIN_TOKEN_LENGTH = 16
CLIENT_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,62}[A-Za-z0-9])?$")
_HEX64 = re.compile(r"^[0-9a-fA-F]{64}$")
#: A ProxyPool's name: a DNS subdomain, at most 63 characters (the controller's limit,
#: :data:`app.pools.model.MAX_POOL_NAME`: the name is a label value on every member).
POOL_NAME = re.compile(r"^(?=.{1,63}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclass(frozen=True)
class Client:
    """One API client.

    Attributes:
        name: the client's name (leases and cooldowns are kept per name).
        digest: SHA-256 of its token (32 bytes).
        max_leases: live leases the client may hold at once (``maxLeases``), ``None`` for no limit.
        scope: the proxies it may see and lease (its ``namespaces`` and ``pools``; for an
            unscoped client the file's ``sharedNamespaces``).
    """

    name: str
    digest: bytes
    max_leases: int | None = None
    scope: Scope = EVERYTHING

    def __repr__(self) -> str:  # never the digest
        return f"Client(name={self.name!r}, max_leases={self.max_leases!r}, scope={self.scope!r})"


def digest(token: str) -> bytes:
    """Return the SHA-256 digest of ``token`` (UTF-8)."""
    return hashlib.sha256(token.encode("utf-8")).digest()


def parse(data, file: str) -> tuple[Client, ...]:
    """Validate a decoded tokens document and return its clients.

    Args:
        data: the YAML document as decoded (``{"sharedNamespaces"?: [...], "clients": [{name,
            token | tokenSHA256, maxLeases?, namespaces?, pools?}, ...]}``).
        file: the file's path, for messages.
    Returns:
        the clients, in file order.
    Raises:
        ConfigError: the first problem, naming ``file`` and the field (``clients[2].token``,
            ``clients[0].maxLeases``); never a token's value.
    """
    top = Reader(data, file)
    entries = top.items("clients", required=True)
    shared = Scope(namespace_list(top, "sharedNamespaces"))
    top.done()
    if not entries:
        raise top.error("clients", "must list at least one client")
    clients: list[Client] = []
    names: dict[str, int] = {}
    digests: dict[bytes, int] = {}
    for i, r in enumerate(entries):
        name = r.str("name", required=True)
        if not CLIENT_NAME.match(name):
            raise r.error("name", f"{name!r} is not a valid client name (letters, digits, '.', '_', '-'; "
                                  "at most 64 characters)")
        if name in names:
            raise r.error("name", f"duplicate client name {name!r} (also clients[{names[name]}])")
        has_token, has_digest = r.has("token"), r.has("tokenSHA256")
        if has_token == has_digest:
            raise r.error(None, "needs exactly one of token or tokenSHA256")
        if has_token:
            token = r.raw("token")
            if not isinstance(token, str):
                raise r.error("token", f"must be a string, got {type(token).__name__}")
            if len(token) < MIN_TOKEN_LENGTH:
                raise r.error("token", f"too short (at least {MIN_TOKEN_LENGTH} characters)")
            if token != token.strip():
                raise r.error("token", "has leading or trailing whitespace")
            refuse_placeholder(r, token)
            d = digest(token)
        else:
            hexd = r.raw("tokenSHA256")
            if not isinstance(hexd, str) or not _HEX64.match(hexd):
                raise r.error("tokenSHA256", "must be 64 hexadecimal digits (the SHA-256 of the token)")
            d = bytes.fromhex(hexd)
        max_leases = r.int("maxLeases", minimum=0)
        scope = _scope(r) or shared
        r.done()
        if d in digests:
            raise r.error("token" if has_token else "tokenSHA256",
                          f"same token as clients[{digests[d]}]: every client needs its own")
        names[name], digests[d] = i, i
        clients.append(Client(name, d, max_leases, scope))
    return tuple(clients)


def _scope(r: Reader) -> Scope | None:
    """A client entry's own scope (``namespaces``, ``pools``), ``None`` when it names neither."""
    if not r.has("namespaces") and not r.has("pools"):
        return None
    namespaces = namespace_list(r, "namespaces")
    pools = r.str_list("pools")
    for i, pool in enumerate(pools):
        ns, slash, name = pool.partition("/")
        if not slash or not NAMESPACE.match(ns) or not POOL_NAME.match(name):
            raise r.error(f"pools[{i}]", f"{pool!r} is not <namespace>/<pool name> (a pool is named with its "
                                         "namespace: pools of one name in two namespaces are two pools)")
    if not namespaces and not pools:
        raise r.error("namespaces", "a scope with no namespace and no pool leases nothing: name some, or "
                                    "leave both keys out for an unscoped client (sharedNamespaces)")
    return Scope(namespaces, frozenset(pools))


#: Words that mark a sample token (deploy/samples/tokens.yaml, docker-compose.yml): a token that
#: still holds one was never replaced.  Matched in any case.
PLACEHOLDER_WORDS = ("PLACEHOLDER", "CHANGE-ME")
#: Environment variable that admits tokens holding :data:`PLACEHOLDER_WORDS` (a demo stack).
ALLOW_DEMO_TOKENS_ENV = "API_ALLOW_DEMO_TOKENS"


def refuse_placeholder(r: Reader, token: str) -> None:
    """Refuse a ``token`` that still holds a :data:`PLACEHOLDER_WORDS` word, unless
    ``API_ALLOW_DEMO_TOKENS`` is true (``1 true yes on``; a demo stack such as docker-compose.yml).

    Args:
        r: the client's entry, for the message (file and ``clients[i].token``).
        token: the token as written.
    Raises:
        ConfigError: the token is a placeholder (the message names the word, never the token).
        ValueError: ``API_ALLOW_DEMO_TOKENS`` is not a boolean, naming the variable.
    """
    from app.config.settings import env_flag

    word = next((w for w in PLACEHOLDER_WORDS if w in token.upper()), None)
    if word is not None and not env_flag(ALLOW_DEMO_TOKENS_ENV, False):
        raise r.error("token", f"still reads {word}: it is a sample token, set one of your own "
                               f"(or {ALLOW_DEMO_TOKENS_ENV}=true for a demo stack)")


def load(path: str) -> tuple[Client, ...]:
    """Read and validate the tokens file at ``path``.

    Raises:
        ConfigError: unreadable file, bad YAML or bad content (naming file and field).
    """
    data = load_yaml(path, "tokens file")
    return parse(data, path)


def authenticate(clients: tuple[Client, ...], token: str | None) -> Client | None:
    """Return the client whose token is ``token``, or ``None``.

    Every client's digest is compared (``hmac.compare_digest``) whatever the outcome.
    """
    if not token:
        return None
    presented = digest(token)
    match = None
    for c in clients:
        if hmac.compare_digest(presented, c.digest):
            match = c
    return match


class TokenStore:
    """The clients of a tokens file, reloaded when the file changes (a rotated Secret).

    Args:
        path: the tokens file.
        check_every: seconds between checks of the file's modification time.
    Raises:
        ConfigError: the file is invalid at construction (the API refuses to start).  A file
            that turns invalid later is logged and the previous clients stay in force.
    """

    def __init__(self, path: str, check_every: float = 5.0) -> None:
        self.path = path
        self.check_every = check_every
        self._stamp = self._mtime()
        self.clients = load(path)
        self._next_check = time.monotonic() + check_every
        self._lock = threading.Lock()

    def _mtime(self) -> tuple[float, int] | None:
        try:
            st = os.stat(self.path)
            return st.st_mtime, st.st_ino
        except OSError:
            return None

    def _maybe_reload(self) -> None:
        now = time.monotonic()
        if now < self._next_check:
            return
        with self._lock:
            if now < self._next_check:
                return
            self._next_check = now + self.check_every
            stamp = self._mtime()
            if stamp == self._stamp:
                return
            try:
                self.clients = load(self.path)
                self._stamp = stamp
                log.info("api: tokens file %s reloaded (%d clients)", self.path, len(self.clients))
            except ConfigError as exc:
                log.error("api: tokens file changed but is invalid, keeping the previous clients: %s", exc)

    def authenticate(self, token: str | None) -> Client | None:
        """Return the client presenting ``token`` or ``None`` (see :func:`authenticate`)."""
        self._maybe_reload()
        return authenticate(self.clients, token)
