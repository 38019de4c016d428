"""``proxy-operator check-config`` on the mistakes that sent operators the wrong way: a
misspelt required key (``tpye:``) is named next to the "required" it causes, an unknown key
says which known key it looks like, and a config of no provider says what the operator does
with none.  The real command in a subprocess."""

from __future__ import annotations

import subprocess
import sys

import pytest

from app.config.validation import ConfigError
from app.wiring import load_config


def _check(tmp_path, text: str) -> subprocess.CompletedProcess:
    path = tmp_path / "providers.yaml"
    path.write_text(text)
    return subprocess.run([sys.executable, "-m", "cli", "check-config", str(path)], capture_output=True,
                          text=True, timeout=60)


def test_a_misspelt_required_key_is_named_with_the_required_one(tmp_path):
    out = _check(tmp_path, "providers:\n  - name: k\n    tpye: kubernetes\n")
    assert out.returncode == 2
    assert 'provider "k": type: required (unknown key "tpye": a misspelling of "type"?)' in out.stderr


def test_an_unknown_key_names_the_known_key_it_looks_like(tmp_path):
    out = _check(tmp_path, "providers:\n  - name: k\n    type: kubernetes\n    chekInterval: 1m\n")
    assert out.returncode == 2
    assert 'provider "k": chekInterval: unknown key (did you mean "checkInterval"?)' in out.stderr
    top = _check(tmp_path, "provders:\n  - {name: k, type: kubernetes}\n")
    assert top.returncode == 2 and 'provders: unknown key (did you mean "providers"?)' in top.stderr
    far = _check(tmp_path, "providers:\n  - {name: k, type: kubernetes, bogus: 1}\n")
    assert far.returncode == 2 and far.stderr.strip().endswith("bogus: unknown key")  # nothing alike: no guess


@pytest.mark.parametrize("providers", ["providers: []\n", "providers:\n"])
def test_no_provider_says_what_the_operator_does_with_none(tmp_path, providers):
    out = _check(tmp_path, providers)
    assert out.returncode == 0, out.stderr
    assert "OK (0 provider(s): none)" in out.stdout
    assert ("note: no providers: the operator creates no proxy; it serves nothing: "
            "tenancy.externalProxyNamespaces allows External Proxies in no namespace") in out.stdout
    assert "Managed Proxy is Failed (UnknownProvider)" in out.stdout
    some = _check(tmp_path, providers.rstrip("\n") + "\ntenancy:\n  externalProxyNamespaces: [crawl, b]\n")
    assert some.returncode == 0 and "it serves External Proxies of the namespaces b, crawl." in some.stdout
    one = _check(tmp_path, "providers:\n  - {name: k, type: kubernetes}\n")
    assert one.returncode == 0 and "note:" not in one.stdout


def test_the_hint_is_part_of_the_error_every_process_raises(tmp_path):
    path = tmp_path / "providers.yaml"
    path.write_text("providers:\n  - {name: g, tpye: gcp}\n")
    with pytest.raises(ConfigError) as err:
        load_config(str(path))
    assert err.value.field == "type" and err.value.problem.startswith("required (unknown key \"tpye\"")
