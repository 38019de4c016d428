"""The Redis key table (app/store/keys.py) and the Lua scripts (app/store/lua/*.lua).

* The keys on the wire are the ones every earlier release used (a rolling upgrade shares Redis).
* No module but the key table spells a ``po:`` key, and no Lua script spells one at all.
* The scripts are package data: found through ``importlib.resources``, named by pyproject.toml's
  package-data, and in the wheel.
"""

from __future__ import annotations

import ast
import fnmatch
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from importlib import resources
from pathlib import Path

import pytest

from app.store import lua, keys as redis_keys

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("app", "api", "watchers", "workers", "cli")


def test_key_names_on_the_wire_are_unchanged():
    assert (redis_keys.PROXIES, redis_keys.HEALTH_DUE, redis_keys.HEALTH_OK, redis_keys.HEALTH_FAILING,
            redis_keys.HEALTH_OUTAGE, redis_keys.LOAD, redis_keys.FULL, redis_keys.UNHEALTHY,
            redis_keys.DRAINING, redis_keys.LEASE_EXPIRY, redis_keys.ABANDONED, redis_keys.REDBEAT_PREFIX) == (
        "po:proxies", "po:health:due", "po:health:ok", "po:health:failing", "po:health:outage", "po:load",
        "po:full", "po:unhealthy", "po:draining", "po:lease-expiry", "po:abandoned", "po:redbeat")
    assert [redis_keys.proxy("u"), redis_keys.auth("u"), redis_keys.proxy_leases("u"), redis_keys.lease("l"),
            redis_keys.client_leases("c"), redis_keys.cooldown("c"), redis_keys.sticky("c", "s"),
            redis_keys.health_origin("d"), redis_keys.health_origin_refresh("d"), redis_keys.proxy_lock("u"),
            redis_keys.gc_sweep("g"), redis_keys.queued("poll", "u"), redis_keys.own_writes("u"),
            redis_keys.busy("u"), redis_keys.parked("u"), redis_keys.provider_health("p"),
            redis_keys.provider_health_since("p")] == [
        "po:proxy:u", "po:auth:u", "po:leases:u", "po:lease:l", "po:client-leases:c", "po:cooldown:c",
        "po:sticky:c:s", "po:health:origin:d", "po:health:origin:d:refresh", "po:lock:u", "po:gc:g",
        "po:queued:poll:u", "po:own:u", "po:busy:u", "po:parked:u", "po:phealth:p", "po:phealth-since:p"]


def test_the_lua_header_declares_the_table_s_names():
    header = redis_keys.lua_header()
    for name, value in redis_keys.LUA_NAMES.items():
        assert f"local {name} = '{value}'\n" in header
        assert value.startswith(redis_keys.PREFIX)


def _python_files():
    for top in SOURCES:
        yield from sorted((ROOT / top).rglob("*.py"))


def test_only_the_key_table_spells_a_key():
    offenders = []
    for path in _python_files():
        if path == ROOT / "app" / "store" / "keys.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                # a key literal, or Lua source holding one (docstrings only mention keys in prose)
                if re.match(r"po:", node.value) or re.search(r"'po:|\"po:", node.value):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value[:60]!r}")
    assert offenders == []


def test_no_lua_script_spells_a_key():
    for name in lua.names():
        assert "po:" not in lua.source(name), name


def test_every_script_file_is_found_and_used():
    """Each ``.lua`` file is package data the loader finds, and each is part of a script
    (``Lua("now", "lease_index", ...)`` somewhere in the sources), and each one named exists."""
    files = lua.names()
    assert files and all(resources.files("app.store.lua").joinpath(f"{n}.lua").is_file() for n in files)
    used = set()
    for path in _python_files():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Lua":
                used.update(a.value for a in node.args if isinstance(a, ast.Constant))
    assert used == set(files)
    for name in used:
        lua.Lua(name)  # reads it through importlib.resources


def test_pyproject_ships_every_script():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    globs = config["tool"]["setuptools"]["package-data"]["app.store.lua"]
    for path in (ROOT / "app" / "store" / "lua").glob("*.lua"):
        assert any(fnmatch.fnmatch(path.name, g) for g in globs), path.name


_OFFLINE = ("No matching distribution", "Could not find a version", "connection", "Connection",
            "Temporary failure", "Network is unreachable", "Name or service not known")


@pytest.mark.slow
def test_the_wheel_carries_the_scripts(tmp_path):
    """Build the wheel from a copy of the sources (pip, build isolation) and look inside."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for top in SOURCES:
        shutil.copytree(ROOT / top, src / top, ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "dist"),
                           str(src)], capture_output=True, text=True, timeout=600)
    if done.returncode != 0 and any(s in done.stdout + done.stderr for s in _OFFLINE):
        pytest.skip("pip cannot fetch the build backend (offline)")
    assert done.returncode == 0, done.stdout + done.stderr
    wheel, = (tmp_path / "dist").glob("*.whl")
    shipped = {n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("app/store/lua/")}
    assert {f"app/store/lua/{n}.lua" for n in lua.names()} <= shipped
    assert "app/store/lua/__init__.py" in shipped
