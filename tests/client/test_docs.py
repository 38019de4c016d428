"""The crawler client's documentation: its Python examples compile, and the guide is linked."""

from __future__ import annotations

import re
import textwrap

import pytest

from tests.support.processes import ROOT

DOCS = ["docs/crawler-client.md", "clients/python/README.md", "README.md"]


@pytest.mark.parametrize("path", DOCS)
def test_the_python_examples_compile(path):
    text = (ROOT / path).read_text()
    blocks = [textwrap.dedent(b) for b in re.findall(r"```python\n(.*?)```", text, re.S)]
    assert blocks
    for i, block in enumerate(blocks):
        name = f"{path} example {i + 1}"
        try:
            compile(block, name, "exec")
        except SyntaxError as exc:
            if "outside function" not in str(exc):
                raise
            # a fragment of a callback (``yield scrapy.Request(...)``)
            compile("def example():\n" + textwrap.indent(block, "    "), name, "exec")


def test_the_guide_is_linked_and_names_every_setting():
    assert "docs/crawler-client.md" in (ROOT / "README.md").read_text()
    guide = (ROOT / "docs/crawler-client.md").read_text()
    module = (ROOT / "clients/python/src/proxy_operator_client/scrapy.py").read_text()
    settings = set(re.findall(r'"(PROXY_OPERATOR_[A-Z_]+)"', module))
    assert len(settings) >= 12 and not {s for s in settings if s not in guide}
