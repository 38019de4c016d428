"""Basic auth on KVM proxies: the vendor-data installs the htpasswd line Squid's helper accepts."""

from __future__ import annotations

import base64
import email
import re
import subprocess

from app.squid import conf as squid
from app.providers.kvm import seed


def test_vendor_data_installs_a_working_htpasswd(tmp_path):
    user, password = squid.generate_credentials()
    line = squid.htpasswd_entry(user, password)
    conf = squid.render(3128, squid.SquidPolicy(basic_auth_file=squid.DEFAULT_HTPASSWD_PATH))
    script = seed.squid_script(conf, line).decode()
    writes = dict((path.rstrip(")"), base64.b64decode(blob).decode())
                  for blob, path in re.findall(r"echo '([A-Za-z0-9+/=]+)' \| base64 -d > (\S+)", script))
    assert writes["/etc/squid/squid.conf"] == conf
    assert writes[squid.DEFAULT_HTPASSWD_PATH] == line
    assert f"chmod 0640 {squid.DEFAULT_HTPASSWD_PATH}" in script and "umask 027" in script
    assert password not in script  # only the bcrypt hash travels in the seed

    # Squid's own helper (Debian's squid package) accepts the credentials against that line.
    htpasswd = tmp_path / "htpasswd"
    htpasswd.write_text(writes[squid.DEFAULT_HTPASSWD_PATH] + "\n")
    helper = "/usr/lib/squid/basic_ncsa_auth"
    out = subprocess.run([helper, str(htpasswd)], input=f"{user} {password}\n{user} wrong\n",
                         capture_output=True, text=True, timeout=10)
    answers = [a.strip() for a in out.stdout.splitlines()]
    assert answers[0] == "OK" and answers[1].startswith("ERR")

    # With the guest agent and a user's vendorData beside it, the script still travels intact.
    doc = seed.vendor_data(install_guest_agent=True, squid_conf=conf, user_vendor_data=b"#!/bin/sh\necho hi\n",
                           htpasswd=line)
    parts = {p.get_filename(): p.get_payload(decode=True).decode() for p in email.message_from_bytes(doc).walk()
             if p.get_filename()}
    assert parts["proxy-operator-squid.sh"] == script
