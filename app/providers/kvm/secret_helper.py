"""Build the ``kvm-ssh`` Secret from a private key and a known_hosts file.

The Secret is mounted at ``/etc/proxy-operator/kvm`` (deploy/), so its keys become the files
the kvm config names: ``keyFile: /etc/proxy-operator/kvm/id_ed25519`` and
``knownHostsFile: /etc/proxy-operator/kvm/known_hosts``.  Exposed as
``proxy-operator kvm-ssh-secret --key PATH --known-hosts PATH | kubectl apply -f -``.

Refuses a ``.pub`` file or public-key contents (the classic mistake: the operator needs the
private key), a key paramiko cannot load, and a known_hosts file without a single entry.
Never prints key material except into the manifest itself.
"""

from __future__ import annotations

import argparse
import base64
import sys
from pathlib import Path

import paramiko
import yaml

DEFAULT_NAME = "kvm-ssh"
DEFAULT_NAMESPACE = "proxy-operator"
DEFAULT_KEY_NAME = "id_ed25519"
KNOWN_HOSTS_NAME = "known_hosts"


class SecretInputError(ValueError):
    """An input file is unusable; the message names the file and what is wrong."""


def _read(path: Path, label: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise SecretInputError(f"{label} {path}: cannot read: {exc.strerror or exc}") from None


def check_private_key(path: Path) -> bytes:
    """Return the bytes of the private key at ``path``.

    Raises:
        SecretInputError: a ``.pub`` name, public-key contents, a passphrase-protected key, or
            anything paramiko cannot load as a private key.
    """
    if path.name.endswith(".pub"):
        raise SecretInputError(f"key {path}: this is a public key (.pub); give the private key file "
                               f"(the same path without .pub)")
    data = _read(path, "key")
    if data.lstrip().startswith((b"ssh-", b"ecdsa-", b"sk-")):
        raise SecretInputError(f"key {path}: holds a public key; give the private key file")
    try:
        paramiko.PKey.from_path(str(path))
    except paramiko.PasswordRequiredException:
        raise SecretInputError(f"key {path}: is passphrase-protected; the operator needs a key without one") from None
    except (paramiko.SSHException, ValueError, TypeError) as exc:
        raise SecretInputError(f"key {path}: is not a private key paramiko can load: {exc}") from None
    return data


def check_known_hosts(path: Path) -> bytes:
    """Return the bytes of the known_hosts file at ``path``.

    Raises:
        SecretInputError: unreadable, or no parsable host entry.
    """
    data = _read(path, "known_hosts")
    keys = paramiko.HostKeys()
    try:
        keys.load(str(path))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise SecretInputError(f"known_hosts {path}: cannot be parsed: {exc}") from None
    if not keys.keys():
        raise SecretInputError(f"known_hosts {path}: has no host entries (create it with "
                               f"ssh-keyscan -p PORT ADDRESS, using the address the operator dials)")
    return data


def secret_manifest(key: Path, known_hosts: Path, *, name: str = DEFAULT_NAME,
                    namespace: str = DEFAULT_NAMESPACE, key_name: str = DEFAULT_KEY_NAME) -> dict:
    """Return the Secret as a dict (``data`` values base64-encoded).

    Raises:
        SecretInputError: see :func:`check_private_key` and :func:`check_known_hosts`.
    """
    key_bytes = check_private_key(Path(key))
    hosts_bytes = check_known_hosts(Path(known_hosts))
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"app.kubernetes.io/name": "proxy-operator",
                                "app.kubernetes.io/component": "kvm-ssh"}},
        "type": "Opaque",
        "data": {key_name: base64.b64encode(key_bytes).decode("ascii"),
                 KNOWN_HOSTS_NAME: base64.b64encode(hosts_bytes).decode("ascii")},
    }


def render(key: Path, known_hosts: Path, **kwargs: str) -> str:
    """Return :func:`secret_manifest` as YAML."""
    return yaml.safe_dump(secret_manifest(key, known_hosts, **kwargs), sort_keys=False)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the command's arguments to ``parser`` (for the ``proxy-operator`` CLI)."""
    parser.add_argument("--key", required=True, type=Path, help="private key file (not the .pub)")
    parser.add_argument("--known-hosts", required=True, type=Path,
                        help="known_hosts with the hosts under the address the operator dials")
    parser.add_argument("--name", default=DEFAULT_NAME, help=f"Secret name (default {DEFAULT_NAME})")
    parser.add_argument("--namespace", default=DEFAULT_NAMESPACE, help=f"namespace (default {DEFAULT_NAMESPACE})")
    parser.add_argument("--key-name", default=DEFAULT_KEY_NAME,
                        help=f"file name of the key in the mount (default {DEFAULT_KEY_NAME}; match ssh.keyFile)")


def run(args: argparse.Namespace, out=None, err=None) -> int:
    """Print the manifest for parsed ``args``; return the exit code (2 on bad input)."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        out.write(render(args.key, args.known_hosts, name=args.name, namespace=args.namespace,
                         key_name=args.key_name))
    except SecretInputError as exc:
        err.write(f"kvm-ssh-secret: {exc}\n")
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    """Standalone entry point: ``python -m app.providers.kvm.secret_helper --key K --known-hosts F``."""
    parser = argparse.ArgumentParser(prog="proxy-operator kvm-ssh-secret",
                                     description="Print the kvm-ssh Secret manifest (pipe to kubectl apply -f -).")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
