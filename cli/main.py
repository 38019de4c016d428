"""The ``proxy-operator`` command.

Subcommands: ``watch`` (the watcher), ``api`` (discovery/lease API), ``worker`` (a Celery
worker; ``--kvm-host P/H`` for a dedicated KVM host worker), ``check-config FILE``, ``crds``
(print the CRD manifests), ``demo`` (the operator on a simulated local cluster:
:mod:`devcluster.demo`), ``version``.  Every process validates the providers config before
doing anything else and exits non-zero with one message naming the file, the provider and the
field when it is bad: it never half-starts.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from pathlib import Path

from app import version
from app.config.settings import env_number
from app.config.validation import ConfigError

log = logging.getLogger("proxy_operator")
ROOT = Path(__file__).resolve().parent.parent


def _positive_int(raw: str) -> int:
    """argparse type: an integer of at least 1."""
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {raw!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--providers-config", metavar="FILE", default=os.environ.get("PROVIDERS_CONFIG"),
                   help="the providers config file, YAML (env PROVIDERS_CONFIG)")


def _validated(path: str | None):
    from app.wiring import load_config

    try:
        return load_config(path)
    except ConfigError as exc:
        print(f"proxy-operator: invalid providers config: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def cmd_check_config(args) -> int:
    cfg = _validated(args.file)
    print(f"{args.file}: OK ({len(cfg.providers)} provider(s): {', '.join(cfg.names()) or 'none'})")
    for pc in cfg.providers:
        if not pc.squid.denied_destinations:
            print(f'proxy-operator: warning: {args.file}: provider "{pc.name}": squid.deniedDestinations is '
                  "empty: crawlers may reach this cluster's Pods and Services and the VPC through its proxies; "
                  "list those ranges", file=sys.stderr)
    if not cfg.providers:
        print(no_providers_note(cfg.tenancy.external_namespaces))
    return 0


def no_providers_note(external_namespaces) -> str:
    """What the operator does with a providers config of no provider (``providers: []`` or none):
    ``external_namespaces`` is ``tenancy.externalProxyNamespaces`` (``"*"``: every namespace)."""
    if "*" in external_namespaces:
        served = "External Proxies of every namespace"
    elif external_namespaces:
        served = f"External Proxies of the namespaces {', '.join(sorted(external_namespaces))}"
    else:
        served = "nothing: tenancy.externalProxyNamespaces allows External Proxies in no namespace"
    return ("note: no providers: the operator creates no proxy; it serves " + served + ". A Managed Proxy is "
            "Failed (UnknownProvider) and a ProxyPool is stalled (UnknownProvider) until its provider is "
            "added to this file.")


def cmd_version(args) -> int:
    print(f"proxy-operator {version.release()} (commit {version.commit()})")
    return 0


def cmd_crds(args) -> int:
    crd_dir = Path(os.environ.get("PROXY_OPERATOR_CRD_DIR") or ROOT / "deploy" / "crd")
    docs = sorted(p for p in crd_dir.glob("*.yaml") if p.name != "kustomization.yaml")
    if not docs:
        print(f"proxy-operator: no CRD manifests under {crd_dir}", file=sys.stderr)
        return 1
    print("\n---\n".join(p.read_text().strip() for p in docs))
    return 0


def cmd_demo(args) -> int:
    """``proxy-operator demo``: hand the flags to :func:`devcluster.demo.main` (imported here
    only, so no operator process loads the dev cluster or its extra's packages)."""
    try:
        from devcluster import demo
    except ImportError as exc:
        print(f"proxy-operator demo: {exc}; the demo needs the project's 'demo' extra: "
              f"pip install -e '.[demo]' from the source checkout (make demo does it)", file=sys.stderr)
        return 2
    return demo.main(args.demo_args)


def cmd_watch(args) -> int:
    from app.observability.logs import setup
    os.environ["PROVIDERS_CONFIG"] = args.providers_config or ""
    cfg = _validated(args.providers_config)
    setup("watch")
    from app.store.check import exit_if_credentials_refused
    from app.config.settings import Settings
    try:
        redis_url = Settings.from_env().redis_url
    except ValueError as exc:
        print(f"proxy-operator: watch: {exc}", file=sys.stderr)
        return 2
    exit_if_credentials_refused(redis_url, "watch")  # a wrong REDIS_PASSWORD never heals by retrying
    from app.kube.gateway import KubernetesGateway
    from app.providers.checks import ProviderHealthWriter
    try:
        pruned = ProviderHealthWriter(KubernetesGateway()).prune(
            cfg.names(), {p.name for p in cfg.providers if p.check_interval})
        if pruned:
            log.info("deleted ProviderHealth of providers no longer checked: %s", ", ".join(pruned))
    except Exception as exc:  # noqa: BLE001 - housekeeping must not stop the watcher
        log.warning("could not prune ProviderHealth objects: %s", exc)
    from app.providers.checks import StaleSweeper
    from app.store.client import client_from_url
    from watchers.main import run
    from watchers.events import make_on_event, make_on_pool_event
    if args.metrics_bind:
        from app.observability import metrics
        try:
            metrics.serve(args.metrics_bind, metrics.registry_for_scrape())
        except (ValueError, OSError) as exc:
            print(f"proxy-operator: watch: metrics: {exc}", file=sys.stderr)
            return 2
        log.info("serving /metrics on %s", args.metrics_bind)
    # The leader marks ProviderHealth targets nobody checks any more as CheckStale.
    sweeper = StaleSweeper(client_from_url(redis_url, decode_responses=True, socket_timeout=10,
                                           socket_connect_timeout=5, socket_keepalive=True),
                           ProviderHealthWriter(KubernetesGateway()), cfg.providers)
    # The composition root injects the fleet's publisher: the watchers package imports nothing from workers/.
    from workers.celery_app import send
    run(make_on_event(send), lease_namespace=args.lease_namespace, lease_name=args.lease_name,
        identity=args.identity, health_bind=args.health_bind, while_leading=sweeper.run if sweeper.configs else None,
        on_pool_event=make_on_pool_event(send))
    return 0


def cmd_api(args) -> int:
    if args.tokens_file:
        os.environ["API_TOKENS_FILE"] = args.tokens_file
    if not os.environ.get("API_TOKENS_FILE"):
        print("proxy-operator: api: no tokens file (--tokens-file or API_TOKENS_FILE)", file=sys.stderr)
        return 2
    from app.observability import multiproc
    from app.observability.logs import setup
    try:
        setup("api")  # the first line: release and commit
    except ValueError as exc:
        print(f"proxy-operator: api: environment variable LOG_LEVEL: {exc}", file=sys.stderr)
        return 2
    # Before anything imports prometheus-client: /metrics sums the workers' files.
    try:
        metrics_dir, made_here = multiproc.prepare("proxy-operator-api-metrics-")
    except OSError as exc:
        print(f"proxy-operator: api: {multiproc.ENV}: {exc}", file=sys.stderr)
        return 2
    try:
        # Validate settings and tokens before listening, so a bad file is one clear line.
        try:
            from api import create_app, server
            settings = server.ServerSettings.from_env(bind=args.bind, workers=args.workers)
            create_app(rebuild_index=False)  # each worker rebuilds the lease index when it starts
        except (ValueError, OSError) as exc:
            print(f"proxy-operator: api: {exc}", file=sys.stderr)
            return 2
        try:
            sock = server.listen(settings.host, settings.port, settings.backlog)
        except OSError as exc:  # server.AddressInUse among others; the message names the address
            print(f"proxy-operator: api: cannot listen: {exc.strerror or exc}", file=sys.stderr)
            return 1
        server.run(settings, sock)  # until SIGTERM; api/server.py says how it serves
        return 0
    finally:
        if made_here:
            multiproc.cleanup(metrics_dir)


def cmd_kvm_ssh_secret(args) -> int:
    from app.providers.kvm import secret_helper
    return secret_helper.run(args)


def cmd_worker(args) -> int:
    os.environ["PROVIDERS_CONFIG"] = args.providers_config or ""
    cfg = _validated(args.providers_config)
    queues = args.queues
    if args.kvm_host:
        provider, _, host = args.kvm_host.partition("/")
        pc = cfg.get(provider)
        if pc is None or pc.type != "kvm" or not host or pc.settings.host(host) is None:
            print(f"proxy-operator: --kvm-host {args.kvm_host}: no kvm provider {provider!r} with host {host!r} "
                  f"in {cfg.source}", file=sys.stderr)
            return 2
        from app.store.queues import kvm_queue
        queues = kvm_queue(provider, host)
        # A first image fetch may take up to kvm.imageTimeout inside one create: the task time
        # limits (and the broker visibility timeout above them) must leave room for it.
        image_timeout = pc.settings.image_timeout
        try:
            soft = env_number("TASK_SOFT_TIME_LIMIT", image_timeout + 300)
            hard = max(env_number("TASK_TIME_LIMIT", soft + 60), soft + 1)
            # kombu restores unacked messages by each worker's own visibility timeout, so every
            # worker sharing the broker must use one above this (docs/kvm-provider.md).
            visibility = env_number("BROKER_VISIBILITY_TIMEOUT", 3600)
        except ValueError as exc:
            print(f"proxy-operator: --kvm-host {args.kvm_host}: {exc}", file=sys.stderr)
            return 2
        if soft <= image_timeout:
            print(f"proxy-operator: --kvm-host {args.kvm_host}: TASK_SOFT_TIME_LIMIT={soft:g}s must exceed "
                  f"kvm.imageTimeout={image_timeout:g}s of provider {provider!r}", file=sys.stderr)
            return 2
        os.environ["TASK_SOFT_TIME_LIMIT"], os.environ["TASK_TIME_LIMIT"] = f"{soft:g}", f"{hard:g}"
        if visibility <= hard:
            print(f"proxy-operator: --kvm-host {args.kvm_host}: BROKER_VISIBILITY_TIMEOUT={visibility:g}s must "
                  f"exceed the task time limit {hard:g}s (set it on every worker)", file=sys.stderr)
            return 2
    concurrency = args.concurrency or (1 if args.kvm_host else 2)
    argv = [sys.executable, "-m", "celery", "-A", "workers", "worker", "-Q", queues, "--without-gossip",
            "--without-mingle", "-E", "--concurrency", str(concurrency), *args.extra]
    os.execvp(argv[0], argv)
    return 0  # not reached


#: ``proxy-operator --help``: what the command is (plain text, argparse wraps it).
DESCRIPTION = ("proxy-operator keeps a fleet of Squid forward proxies alive on Kubernetes, GCP and KVM, and "
               "leases them to crawlers. This one command runs each of its processes (watch, worker, api) "
               "and a few helpers. The processes read the providers config (--providers-config or "
               "PROVIDERS_CONFIG) and check it before anything else: a bad file stops them with one message "
               "naming the file, the provider and the field.")

EPILOG = ("Run 'proxy-operator COMMAND --help' for a command's options. The processes find Redis through "
          "REDIS_URL (default redis://127.0.0.1:6379/0) and REDIS_PASSWORD, and the Kubernetes API through "
          "KUBECONFIG (default ~/.kube/config), else the Pod's service account.")


def parser() -> argparse.ArgumentParser:
    """Build the argument parser (one subparser per subcommand)."""
    p = argparse.ArgumentParser(prog="proxy-operator", description=DESCRIPTION, epilog=EPILOG)
    sub = p.add_subparsers(dest="cmd", title="commands", metavar="COMMAND")

    s = sub.add_parser("watch", help="run the watcher: follows Proxy and ProxyPool objects "
                       "and queues the work for the workers (one leader at a time)",
                       description="Run the watcher. Several replicas may run: they elect one leader through a "
                                   "Kubernetes Lease, and only the leader watches Proxies and ProxyPools and "
                                   "queues tasks for the workers.")
    _config_arg(s)
    s.add_argument("--lease-namespace", metavar="NAMESPACE", default=os.environ.get("POD_NAMESPACE", "proxy-operator"),
                   help="namespace of the leader-election Lease (env POD_NAMESPACE; default proxy-operator)")
    s.add_argument("--lease-name", metavar="NAME", default="proxy-operator-watcher",
                   help="name of the leader-election Lease; watchers sharing it elect one leader "
                        "(default proxy-operator-watcher)")
    s.add_argument("--identity", default=os.environ.get("HOSTNAME") or socket.gethostname(),
                   help="this watcher's name in the Lease; must differ between replicas "
                        "(env HOSTNAME, which is the Pod's name in Kubernetes; default this machine's host name)")
    s.add_argument("--health-bind", metavar="HOST:PORT", default=os.environ.get("WATCHER_HEALTH_BIND"),
                   help="serve /healthz (liveness) here (env WATCHER_HEALTH_BIND; default: not served)")
    s.add_argument("--metrics-bind", metavar="HOST:PORT", default=os.environ.get("METRICS_BIND"),
                   help="serve Prometheus /metrics here (env METRICS_BIND; default: not served)")
    s.set_defaults(fn=cmd_watch)

    s = sub.add_parser("worker", help="run a Celery worker: creates, checks and deletes "
                       "the proxies",
                       description="Run a Celery worker on the task queues: proxies (create, poll, delete, "
                                   "pools, resync), health (health probes, provider checks) and gc (garbage "
                                   "collection of leftover instances). Arguments after the options go to "
                                   "'celery worker' unchanged.")
    _config_arg(s)
    s.add_argument("--queues", "-Q", metavar="QUEUES", default="proxies,health,gc",
                   help="comma-separated queues to take tasks from (default proxies,health,gc; the deployment "
                        "runs -Q proxies,gc and a separate -Q health worker)")
    s.add_argument("--kvm-host", metavar="PROVIDER/HOST",
                   help="be the dedicated worker of one KVM host: take only that host's queue "
                        "(a kvm provider and one of its hosts in the providers config)")
    s.add_argument("--concurrency", type=_positive_int, default=None,
                   help="worker processes (default 2; 1 with --kvm-host: one process owns the host's "
                        "connection and image cache)")
    s.add_argument("extra", nargs=argparse.REMAINDER, metavar="CELERY_ARGS",
                   help="more 'celery worker' arguments, e.g. --loglevel INFO")
    s.set_defaults(fn=cmd_worker)

    s = sub.add_parser("api", help="run the discovery and lease API (HTTP) that crawlers use",
                       description="Run the discovery and lease API: crawlers list the healthy proxies and "
                                   "lease one (bearer tokens from the tokens file). Needs Redis (REDIS_URL).")
    s.add_argument("--bind", metavar="HOST:PORT", default=None,
                   help="where to listen (env API_BIND; default 127.0.0.1:8080; [::1]:8080 for IPv6)")
    s.add_argument("--workers", type=_positive_int, default=None,
                   help="worker processes (env API_WORKERS; default 2)")
    s.add_argument("--tokens-file", metavar="FILE", default=os.environ.get("API_TOKENS_FILE"),
                   help="YAML file of the clients and their bearer tokens (env API_TOKENS_FILE; required; "
                        "see deploy/samples/tokens.yaml)")
    s.set_defaults(fn=cmd_api)

    s = sub.add_parser("check-config", help="validate a providers config file and exit",
                       description="Validate a providers config file, as every process does at start; print "
                                   "its providers, or one message naming the provider and the field that is "
                                   "wrong (exit status 2). Warns (exit status 0) about a provider whose "
                                   "squid.deniedDestinations is empty.")
    s.add_argument("file", metavar="FILE", help="the providers config file (YAML), e.g. "
                                                "deploy/samples/providers.yaml")
    s.set_defaults(fn=cmd_check_config)

    s = sub.add_parser("crds", help="print the CustomResourceDefinitions (Proxy, ProxyPool, ProviderHealth) as "
                                    "YAML, for 'kubectl apply -f -'")
    s.set_defaults(fn=cmd_crds)

    s = sub.add_parser("kvm-ssh-secret", help="print the kvm-ssh Secret (YAML) the KVM provider logs in with, "
                                              "from a private key and a known_hosts file")
    from app.providers.kvm import secret_helper
    secret_helper.add_arguments(s)
    s.set_defaults(fn=cmd_kvm_ssh_secret)

    # The demo's flags (--help included) are devcluster.demo's own: prefix_chars no argument starts
    # with makes every argument after "demo" a positional one, passed through unparsed.
    s = sub.add_parser("demo", add_help=False, prefix_chars="\0",
                       help="run the whole operator on loopback on a SIMULATED cluster (devcluster), "
                            "without Docker; 'proxy-operator demo --help' for its flags")
    s.add_argument("demo_args", nargs="*", metavar="FLAGS",
                   help="the demo's flags (proxy-operator demo --help lists them)")
    s.set_defaults(fn=cmd_demo)

    s = sub.add_parser("version", help="print the release and the git commit")
    s.set_defaults(fn=cmd_version)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``proxy-operator``; returns the exit status (2 and the help on stderr
    when no command is given)."""
    p = parser()
    args = p.parse_args(argv)
    if args.cmd is None:
        p.print_help(sys.stderr)
        return 2
    return args.fn(args) or 0


if __name__ == "__main__":
    sys.exit(main())
