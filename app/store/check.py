"""Start-up check: stop at once, with one clear line, when Redis refuses our credentials.

Redis requires a user and password in deploy/ and docker-compose (an ACL user per component,
:mod:`app.store.acl`; Redis docs, "Authentication":
https://redis.io/docs/latest/operate/oss_and_stack/management/security/#authentication).
A missing or wrong ``REDIS_PASSWORD`` never heals by waiting, unlike an outage, so the
processes that would otherwise retry forever (Celery workers, beat, the watcher) check once as
they start and exit with status 2 and a message that names the Redis (password redacted) and
what to fix.  Redis being down or unreachable is not this check's business: the processes
ride that out (workers/celery_app.py, workers/beat_scheduler.py).
"""

from __future__ import annotations

import logging
import os

import redis

from app.store.client import client_from_url
from app.config.settings import redact_redis_url

log = logging.getLogger("proxy_operator")

#: Exit status of a process stopped by :func:`exit_if_credentials_refused` (a configuration error).
EXIT_STATUS = 2


def refused_credentials(url: str, timeout: float = 5.0) -> str | None:
    """Return why Redis at ``url`` refuses our credentials, or ``None`` when it accepts them
    or cannot be asked (down, unreachable: not a credentials problem).

    The answer is Redis's own reason (``Authentication required.``, ``invalid username-password
    pair or user is disabled.``, a ``NOPERM`` line): it never contains the password.
    """
    client = client_from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
    try:
        client.ping()
    except redis.AuthenticationError as exc:
        return str(exc) or type(exc).__name__
    except redis.exceptions.NoPermissionError as exc:
        return str(exc) or type(exc).__name__
    except redis.RedisError:
        return None
    finally:
        client.close()
    return None


def exit_if_credentials_refused(url: str, process: str) -> None:
    """Log one error and exit with :data:`EXIT_STATUS` if Redis at ``url`` refuses our credentials.

    Args:
        url: the Redis URL the process uses (with its password; it is redacted in the message).
        process: the process's name for the message (``"worker"``, ``"beat"``, ``"watch"``).
    Raises:
        SystemExit: the credentials were refused.
    """
    reason = refused_credentials(url)
    if reason is None:
        return
    given = "REDIS_PASSWORD is set" if os.environ.get("REDIS_PASSWORD") else "no REDIS_PASSWORD is set"
    log.critical("%s: Redis at %s refused the connection's credentials (%s; %s): set REDIS_PASSWORD to the "
                 "password Redis requires of the user REDIS_USERNAME (deploy/: the Secret "
                 "proxy-operator-redis-<user>, key password; docker-compose.yml: REDIS_PASSWORD_<USER>)",
                 process, redact_redis_url(url), reason.rstrip("."), given)
    raise SystemExit(EXIT_STATUS)
