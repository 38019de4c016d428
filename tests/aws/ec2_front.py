"""moto's EC2/SSM emulator in server mode, with a small HTTP front that records and injects faults.

:class:`Moto` starts ``moto.server.ThreadedMotoServer`` on ``127.0.0.1:<free port>`` and, in
front of it, :class:`Front`, a ``ThreadingHTTPServer`` on another free port that forwards
every request unchanged (the real boto3 client talks HTTP to it, signed as for AWS) except:

* :meth:`Front.fail`: the next matching call(s) of an operation answer an EC2 error document
  (``<Response><Errors><Error><Code>...``) with the given HTTP status, as EC2 does for
  ``RequestLimitExceeded`` (503), ``InstanceLimitExceeded`` (400) and the like;
* :meth:`Front.lag`: the next ``DescribeInstances`` call(s) answer an empty reservation set, as
  EC2's eventually consistent reads do right after a ``RunInstances``;
* :attr:`Front.page_size`: ``MaxResults`` of ``DescribeInstances`` is rewritten to this (moto
  pages by it), so paging shows with a handful of instances.

Every call is recorded in :attr:`Front.calls` (operation name and decoded form parameters), so
tests (and bench/aws_create_delete.py) count the API calls a step makes.  moto does not check
signatures, so a rewritten body is accepted.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlencode

import requests


ACCOUNT = "123456789012"  # moto's default account
#: The one public image the emulator knows (``MOTO_AMIS_PATH``): loading moto's stock catalogue at
#: every reset costs seconds, and an AMI outside it answers ``InvalidAMIID.NotFound`` as EC2 does.
DEBIAN_AMI = "ami-0d6e2b3b4c5d6e7f8"
_AMIS = [{"ami_id": DEBIAN_AMI, "state": "available", "public": True, "owner_id": "136693071363",
          "image_location": "debian/debian-12-amd64", "root_device_type": "ebs", "root_device_name": "/dev/xvda",
          "description": "Debian 12 (stand-in)", "image_type": "machine", "architecture": "x86_64",
          "name": "debian-12-amd64", "virtualization_type": "hvm", "hypervisor": "xen", "sriov": "simple"}]


@dataclass
class Call:
    """One call the front received."""

    operation: str
    params: dict[str, str]
    at: float = field(default_factory=time.monotonic)


@dataclass
class _Rule:
    operation: str
    times: int
    status: int = 0
    code: str = ""
    message: str = ""
    lag: bool = False


_EMPTY_DESCRIBE = ('<?xml version="1.0" encoding="UTF-8"?>\n<DescribeInstancesResponse '
                   'xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>lag</requestId>'
                   '<reservationSet/></DescribeInstancesResponse>')


class Front:
    """The recording, fault-injecting HTTP front of a moto server (see the module docstring)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.calls: list[Call] = []
        self.page_size: int | None = None
        self._rules: list[_Rule] = []
        self._lock = threading.Lock()
        self._session = requests.Session()
        front = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                front._handle(self)

            def do_GET(self) -> None:
                front._handle(self)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    # -- faults --------------------------------------------------------------------------
    def fail(self, operation: str, code: str, *, status: int = 400, message: str = "", times: int = 1) -> None:
        """Answer the next ``times`` calls of ``operation`` with the EC2 error ``code``."""
        with self._lock:
            self._rules.append(_Rule(operation, times, status, code, message or f"{code} (injected)"))

    def lag(self, times: int = 1) -> None:
        """Answer the next ``times`` ``DescribeInstances`` calls with no instance at all."""
        with self._lock:
            self._rules.append(_Rule("DescribeInstances", times, lag=True))

    def count(self, operation: str | None = None) -> int:
        """The number of calls received (of ``operation``)."""
        return sum(1 for c in self.calls if operation is None or c.operation == operation)

    def of(self, operation: str) -> list[Call]:
        """The calls of ``operation``, in order."""
        return [c for c in self.calls if c.operation == operation]

    def reset(self) -> None:
        """Forget calls, rules and the page size."""
        with self._lock:
            self.calls.clear()
            self._rules.clear()
            self.page_size = None

    def close(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()

    # -- serving -------------------------------------------------------------------------
    def _rule(self, operation: str) -> _Rule | None:
        with self._lock:
            for rule in self._rules:
                if rule.operation == operation and rule.times > 0:
                    rule.times -= 1
                    return rule
        return None

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        target = h.headers.get("X-Amz-Target") or ""
        params: dict[str, str] = {}
        if target:
            operation = target.rsplit(".", 1)[-1]
        else:
            params = dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
            operation = params.get("Action", "?")
        with self._lock:
            self.calls.append(Call(operation, params))
        rule = self._rule(operation)
        if rule is not None and rule.lag:
            return self._answer(h, 200, _EMPTY_DESCRIBE.encode(), "text/xml")
        if rule is not None:
            doc = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>{rule.code}</Code>'
                   f'<Message>{rule.message}</Message></Error></Errors><RequestID>injected</RequestID></Response>')
            return self._answer(h, rule.status, doc.encode(), "text/xml")
        if operation == "DescribeInstances" and self.page_size and "MaxResults" in params:
            params["MaxResults"] = str(self.page_size)
            body = urlencode(params).encode()
        headers = {k: v for k, v in h.headers.items() if k.lower() not in ("host", "content-length")}
        answer = self._session.request(h.command, self.upstream + h.path, data=body, headers=headers, timeout=30)
        self._answer(h, answer.status_code, answer.content, answer.headers.get("Content-Type", "text/xml"))

    @staticmethod
    def _answer(h: BaseHTTPRequestHandler, status: int, body: bytes, ctype: str) -> None:
        h.send_response(status)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)


class Moto:
    """moto's server on a free loopback port, with a :class:`Front` before it.

    Attributes:
        url: the front's URL (give it to the provider as ``endpointUrl``).
        front: the :class:`Front`.
    """

    def __init__(self) -> None:
        if "MOTO_AMIS_PATH" not in os.environ:  # read when moto's EC2 models are first imported
            fd, path = tempfile.mkstemp(prefix="moto-amis-", suffix=".json")
            with os.fdopen(fd, "w") as fh:
                json.dump(_AMIS, fh)
            os.environ["MOTO_AMIS_PATH"] = path
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0,  # the kernel picks a free port
                                          verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.moto_url = f"http://{host}:{port}"
        self.front = Front(self.moto_url)
        self.url = self.front.url

    def reset(self) -> None:
        """Empty the emulator (every backend) and the front."""
        requests.post(f"{self.moto_url}/moto-api/reset", timeout=30).raise_for_status()
        self.front.reset()

    def backend(self, region: str) -> Any:
        """moto's in-process EC2 backend of ``region`` (to do what EC2 does behind the provider's back)."""
        from moto.ec2.models import ec2_backends

        return ec2_backends[ACCOUNT][region]

    def interrupt(self, region: str, instance_id: str) -> None:
        """Terminate ``instance_id`` as EC2 does when it reclaims a spot instance."""
        from moto.ec2.models.instances import StateReason

        from moto.core.utils import utcnow

        instance = self.backend(region).get_instance(instance_id)
        instance.terminate()
        instance._reason = f"Service initiated ({utcnow().strftime('%Y-%m-%d %H:%M:%S')} GMT)"
        instance.state_reason = StateReason("Server.SpotInstanceTermination: Spot instance termination",
                                            "Server.SpotInstanceTermination")

    def stop(self) -> None:
        """Stop the front and the emulator."""
        self.front.close()
        self._server.stop()
