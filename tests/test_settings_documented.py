"""Every environment variable the product's processes read is documented for users.

The product is app/, api/, workers/, watchers/ and cli/ (not tests/, bench/ or clients/).
A variable is *read* when its name reaches ``os.environ.get`` / ``os.environ[...]`` /
``os.environ.setdefault`` / ``os.getenv``, the project's parsers
(:func:`app.config.settings.env_number`, :func:`app.config.settings.env_flag`), or any function of the
product that passes one of its own parameters on to one of those (``_float``, ``_ranges``,
``num``, ...: found by reading the source, so a new helper needs no change here).  The name
may be a string literal, a module-level constant (``ENV = "..."``) or a loop over a
module-level tuple of them.  ``os.environ.pop`` is not a read (it removes a variable).

A variable is *documented* when it is named, in backticks, in the ``env`` column of a table
of README.md (the "Process settings" table of "Configuration") or in the ``env`` / ``variable``
column of a table in docs/*.md (e.g. the Settings table of docs/discovery-api.md).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("app", "api", "workers", "watchers", "cli")
#: The project's own env parsers (``app.config.settings``); the variable's name is their first argument.
SEED_READERS = {"env_number": 0, "env_flag": 0}
ENV_METHODS = {"get", "setdefault"}
SETTINGS_COLUMNS = {"env", "variable"}
ENV_NAME = re.compile(r"\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b|\b[A-Z]{4,}\b")


def product_sources() -> dict[str, str]:
    """``{"app/config/settings.py": source, ...}`` for every Python file of the product."""
    return {str(p.relative_to(ROOT)): p.read_text()
            for top in PRODUCT for p in sorted((ROOT / top).rglob("*.py"))}


def _is_os_environ(node: ast.AST) -> bool:
    # os.environ only: a bare ``environ`` is a WSGI request's (PATH_INFO, ...), not settings.
    return (isinstance(node, ast.Attribute) and node.attr == "environ"
            and isinstance(node.value, ast.Name) and node.value.id == "os")


def _module_constants(tree: ast.Module) -> dict[str, tuple[str, ...]]:
    """Module-level ``NAME = "X"`` and ``NAME = ("X", "Y")`` bindings."""
    out: dict[str, tuple[str, ...]] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            value = stmt.value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                out[stmt.targets[0].id] = (value.value,)
            elif isinstance(value, (ast.Tuple, ast.List)) and value.elts and all(
                    isinstance(e, ast.Constant) and isinstance(e.value, str) for e in value.elts):
                out[stmt.targets[0].id] = tuple(e.value for e in value.elts)
    return out


class _Reads(ast.NodeVisitor):
    """One module's env reads, given the reader functions known so far."""

    def __init__(self, path: str, constants: dict[str, tuple[str, ...]], readers: dict[str, int]):
        self.path, self.constants, self.readers = path, constants, readers
        self.functions: list[list[str]] = []     # parameter names of the enclosing functions
        self.loops: list[tuple[str, ast.AST]] = []  # (loop variable, iterable) of enclosing for loops
        self.names: dict[str, list[str]] = {}     # variable -> ["path:line", ...]
        self.unresolved: list[str] = []           # "path:line: expression"
        self.new_readers: dict[str, int] = {}     # functions that pass a parameter on to a reader
        self._function_names: list[str] = []

    def visit_FunctionDef(self, node):
        args = [a.arg for a in node.args.posonlyargs + node.args.args]
        self.functions.append(args)
        self._function_names.append(node.name)
        self.generic_visit(node)
        self.functions.pop()
        self._function_names.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_For(self, node):
        if isinstance(node.target, ast.Name):
            self.loops.append((node.target.id, node.iter))
            self.generic_visit(node)
            self.loops.pop()
        else:
            self.generic_visit(node)

    def _values(self, expr: ast.AST) -> tuple[str, ...] | None:
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return (expr.value,)
        if isinstance(expr, (ast.Tuple, ast.List)):
            parts = [self._values(e) for e in expr.elts]
            return None if any(p is None for p in parts) else tuple(v for p in parts for v in p)
        if isinstance(expr, ast.Name):
            for var, iterable in reversed(self.loops):
                if var == expr.id:
                    return self._values(iterable)
            return self.constants.get(expr.id)
        return None

    def _read(self, expr: ast.AST, line: int) -> None:
        if isinstance(expr, ast.Name) and self.functions and expr.id in self.functions[-1] \
                and not any(var == expr.id for var, _ in self.loops):
            self.new_readers[self._function_names[-1]] = self.functions[-1].index(expr.id)
            return
        values = self._values(expr)
        if values is None:
            self.unresolved.append(f"{self.path}:{line}: {ast.unparse(expr)}")
            return
        for value in values:
            self.names.setdefault(value, []).append(f"{self.path}:{line}")

    def visit_Call(self, node):
        func = node.func
        name_arg = None
        if isinstance(func, ast.Attribute) and func.attr in ENV_METHODS and _is_os_environ(func.value):
            name_arg = node.args[0] if node.args else None
        elif isinstance(func, ast.Attribute) and func.attr == "getenv" and isinstance(func.value, ast.Name) \
                and func.value.id == "os":
            name_arg = node.args[0] if node.args else None
        else:
            called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            if called in self.readers:
                index = self.readers[called]
                if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) \
                        and func.value.id in ("self", "cls"):
                    index -= 1  # a method: the first parameter is self / cls
                if 0 <= index < len(node.args):
                    name_arg = node.args[index]
        if name_arg is not None:
            self._read(name_arg, node.lineno)
        self.generic_visit(node)

    def visit_Subscript(self, node):
        if isinstance(node.ctx, ast.Load) and _is_os_environ(node.value):
            self._read(node.slice, node.lineno)
        self.generic_visit(node)


def env_reads(sources: dict[str, str]) -> tuple[dict[str, list[str]], list[str]]:
    """The env variables ``sources`` read.

    Args:
        sources: ``{path: python source}``.
    Returns:
        ``({variable: ["path:line", ...]}, ["path:line: expression", ...])``: the names read,
        and the reads whose name is not a literal or a module constant (so cannot be checked).
    """
    trees = {path: ast.parse(text, filename=path) for path, text in sources.items()}
    constants = {path: _module_constants(tree) for path, tree in trees.items()}
    readers = dict(SEED_READERS)
    while True:  # until no new wrapper of a reader turns up
        names: dict[str, list[str]] = {}
        unresolved: list[str] = []
        found: dict[str, int] = {}
        for path, tree in trees.items():
            visitor = _Reads(path, constants[path], readers)
            visitor.visit(tree)
            for name, where in visitor.names.items():
                names.setdefault(name, []).extend(where)
            unresolved += visitor.unresolved
            found.update(visitor.new_readers)
        added = {k: v for k, v in found.items() if k not in readers}
        if not added:
            return names, unresolved
        readers.update(added)


def _tables(text: str):
    """Yield each markdown table of ``text`` as (header cells, body rows of cells)."""
    block: list[str] = []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            block.append(line)
            continue
        if len(block) >= 2:
            rows = [[c.strip() for c in row.strip().strip("|").split("|")] for row in block]
            yield [c.lower() for c in rows[0]], rows[2:]
        block = []


def documented_names(files: list[Path]) -> set[str]:
    """Variable names written in backticks in the env/variable column of a table of ``files``."""
    out: set[str] = set()
    for path in files:
        for header, rows in _tables(path.read_text()):
            columns = [i for i, cell in enumerate(header) if cell in SETTINGS_COLUMNS]
            for row in rows:
                for i in columns:
                    if i < len(row):
                        for code in re.findall(r"`([^`]*)`", row[i]):
                            out.update(ENV_NAME.findall(code))
    return out


def doc_files() -> list[Path]:
    """README.md and every docs/*.md: where settings are documented."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def undocumented(reads: dict[str, list[str]], documented: set[str]) -> dict[str, list[str]]:
    """The entries of ``reads`` (:func:`env_reads`) whose name is not in ``documented``, sorted by name."""
    return {name: where for name, where in sorted(reads.items()) if name not in documented}


def test_every_env_variable_the_product_reads_is_documented():
    reads, unresolved = env_reads(product_sources())
    missing = undocumented(reads, documented_names(doc_files()))
    assert not missing, (
        "environment variables read by the product but not documented in the env column of README.md's "
        "'Process settings' table (or an env/variable column of a docs/*.md settings table): "
        + "; ".join(f"{name} (read at {', '.join(where)})" for name, where in missing.items()))
    assert not unresolved, ("env reads whose variable name is not a string literal or module constant, so "
                            "their documentation cannot be checked: " + "; ".join(unresolved))


def test_the_collector_finds_reads_through_every_route():
    # Not vacuous: literals, module constants, loops over constant tuples, the project's
    # parsers, and helpers that wrap them (methods and nested functions included).
    reads, _ = env_reads(product_sources())
    for name in ("REDIS_URL",                     # os.environ.get literal (app/config/settings.py)
                 "HEALTH_BATCH_SIZE",             # env_number
                 "POOL_RESYNC_INTERVAL",          # _float -> env_number
                 "WATCH_READ_TIMEOUT",            # nested num() -> env_number(env=...)
                 "PROBE_CA_BUNDLE", "PROBE_DENIED_RANGES",  # literal; _ranges -> os.environ.get
                 "PROMETHEUS_MULTIPROC_DIR",      # module constant ENV
                 "PROXY_OPERATOR_GCP_WIRE_LOG",   # _truthy(ENV_ENABLE)
                 "API_REUSE_PORT",                # for name in RETIRED
                 "API_IDLE_TIMEOUT_SECONDS",      # os.environ[...]
                 "WATCHER_HEALTH_BIND", "POD_NAMESPACE", "GIT_COMMIT"):
        assert name in reads, name
    assert "PATH_INFO" not in reads  # a WSGI environ key, not a setting
    assert "GOOGLE_SDK_PYTHON_LOGGING_SCOPE" not in reads  # only ever removed (os.environ.pop)


def test_a_new_undocumented_variable_fails_the_check():
    new = {"app/new_feature.py": (
        "import os\n"
        "from app.config.settings import env_number, env_flag\n"
        "KNOB_ENV = 'PROXY_OPERATOR_NEW_KNOB'\n"
        "class S:\n"
        "    def _num(self, name, default):\n"
        "        return env_number(name, default)\n"
        "    def load(self):\n"
        "        return (self._num('NEW_INTERVAL', 5), env_flag('NEW_FLAG', False),\n"
        "                os.getenv(KNOB_ENV), os.environ['NEW_REQUIRED'])\n")}
    reads, unresolved = env_reads({**product_sources(), **new})
    missing = undocumented(reads, documented_names(doc_files()))
    assert set(missing) == {"NEW_INTERVAL", "NEW_FLAG", "PROXY_OPERATOR_NEW_KNOB", "NEW_REQUIRED"}
    assert missing["NEW_INTERVAL"] == ["app/new_feature.py:8"]
    assert not unresolved
    _, unresolved = env_reads({"app/dynamic.py": "import os\nos.environ.get(f'X_{1}')\n"})
    assert unresolved == ["app/dynamic.py:2: f'X_{1}'"]
