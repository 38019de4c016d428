"""Strict readers for user-written mappings (providers config, token files).

A :class:`Reader` walks one mapping, remembers where it is (``file``, ``provider``, dotted
``field`` path) and raises :class:`ConfigError` naming all three for the first problem:
a missing required key, a value of the wrong type or shape, or an unknown key.
"""

from __future__ import annotations

import builtins
import difflib
import re
from dataclasses import dataclass
from typing import Any, Callable, Literal, overload

IDENTIFIER = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


class ConfigError(ValueError):
    """A configuration problem, with its location.

    Attributes:
        file: the file that holds the problem (or ``"<env>"``).
        provider: provider name, or ``None`` when the problem is outside a provider entry.
        field: dotted path of the offending key inside the entry, e.g. ``"gcp.project"``.
        problem: what is wrong, e.g. ``"required"``.
    """

    def __init__(self, file: str, provider: str | None, field: str | None, *, problem: str) -> None:
        self.file, self.provider, self.field, self.problem = file, provider, field, problem
        parts = [file]
        if provider is not None:
            parts.append(f'provider "{provider}"')
        if field:
            parts.append(field)
        super().__init__(": ".join(parts) + ": " + problem)


def parse_duration(value: Any) -> float:
    """Parse a duration: ``"1m"``, ``"1m30s"``, ``"15s"``, ``"2h"``, ``"0"`` or a number of seconds.

    Returns:
        seconds as a float.
    Raises:
        ValueError: the value is not a duration.
    """
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"negative duration: {value!r}")
        return float(value)
    if not isinstance(value, str) or not value:
        raise ValueError(f"not a duration: {value!r}")
    if value == "0":
        return 0.0
    m = _DURATION.match(value)
    if not m or not any(m.groups()):
        raise ValueError(f'not a duration: {value!r} (use forms like "30s", "1m", "1m30s")')
    h, mi, s = (int(g) if g else 0 for g in m.groups())
    return float(h * 3600 + mi * 60 + s)


@dataclass
class Reader:
    """Reads one mapping strictly.

    Args:
        data: the mapping to read (anything else raises :class:`ConfigError` at construction).
        file: file name for messages.
        provider: provider name for messages, or ``None``.
        path: dotted prefix of this mapping inside the provider entry (``""`` at top level).
    """

    data: Any
    file: str
    provider: str | None = None
    path: str = ""

    def __post_init__(self) -> None:
        if self.data is None:
            self.data = {}
        if not isinstance(self.data, dict):
            raise self.error(None, f"must be a mapping, got {type(self.data).__name__}")
        self._seen: set[str] = set()

    # -- helpers -----------------------------------------------------------------------
    def where(self, key: str | None) -> str | None:
        """Return the dotted path of ``key`` inside this mapping."""
        if key is None:
            return self.path or None
        return f"{self.path}.{key}" if self.path else key

    def error(self, key: str | None, problem: str) -> ConfigError:
        """Build a :class:`ConfigError` located at ``key``."""
        return ConfigError(self.file, self.provider, self.where(key), problem=problem)

    def has(self, key: str) -> bool:
        """Return whether ``key`` is present (and mark it as seen)."""
        self._seen.add(key)
        return key in self.data

    def raw(self, key: str, default: Any = None, *, required: bool = False) -> Any:
        """Return the raw value of ``key`` (``default`` if absent); raise if required and absent."""
        self._seen.add(key)
        if key not in self.data or self.data[key] is None:
            if required:
                raise self.error(key, "required" + self._misspelt(key))
            return default
        return self.data[key]

    def _misspelt(self, key: str) -> str:
        """For a missing required ``key``: the keys of this mapping no reader asked for yet that
        look like a misspelling of it (``difflib`` ratio 0.6 or more), as ``' (unknown key
        "tpye": a misspelling of "type"?)'``; ``""`` when there is none."""
        unread = [k for k in self.data if isinstance(k, str) and k not in self._seen]
        close = difflib.get_close_matches(key, unread, n=3, cutoff=0.6)
        if not close:
            return ""
        names = ", ".join(f'"{k}"' for k in close)
        return f' (unknown key{"s" if len(close) > 1 else ""} {names}: a misspelling of "{key}"?)'


    # -- typed readers -----------------------------------------------------------------
    # Each reader returns ``None`` only for an absent optional key without a default; the
    # overloads tell the type checker so (a required key or a default gives a value).
    @overload
    def str(self, key: builtins.str, default: builtins.str, *, required: builtins.bool = ...,
            pattern: re.Pattern[builtins.str] | None = ...,
            choices: tuple[builtins.str, ...] | None = ...) -> builtins.str: ...

    @overload
    def str(self, key: builtins.str, default: None = ..., *, required: Literal[True],
            pattern: re.Pattern[builtins.str] | None = ...,
            choices: tuple[builtins.str, ...] | None = ...) -> builtins.str: ...

    @overload
    def str(self, key: builtins.str, default: builtins.str | None = ..., *, required: builtins.bool = ...,
            pattern: re.Pattern[builtins.str] | None = ...,
            choices: tuple[builtins.str, ...] | None = ...) -> builtins.str | None: ...

    def str(self, key: builtins.str, default: builtins.str | None = None, *, required: builtins.bool = False,
            pattern: re.Pattern[builtins.str] | None = None,
            choices: tuple[builtins.str, ...] | None = None) -> builtins.str | None:
        """Return a non-empty string; check ``pattern``/``choices`` when given."""
        value = self.raw(key, default, required=required)
        if value is None:
            return None
        if not isinstance(value, str):
            raise self.error(key, f"must be a string, got {type(value).__name__}")
        if value == "":
            raise self.error(key, "must not be empty")
        if pattern is not None and not pattern.match(value):
            raise self.error(key, f"{value!r} is not a plain identifier matching {pattern.pattern}")
        if choices is not None and value not in choices:
            raise self.error(key, f"{value!r} is not one of {', '.join(choices)}")
        return value

    @overload
    def int(self, key: builtins.str, default: builtins.int, *, required: builtins.bool = ...,
            minimum: builtins.int | None = ..., maximum: builtins.int | None = ...) -> builtins.int: ...

    @overload
    def int(self, key: builtins.str, default: None = ..., *, required: Literal[True],
            minimum: builtins.int | None = ..., maximum: builtins.int | None = ...) -> builtins.int: ...

    @overload
    def int(self, key: builtins.str, default: builtins.int | None = ..., *, required: builtins.bool = ...,
            minimum: builtins.int | None = ..., maximum: builtins.int | None = ...) -> builtins.int | None: ...

    def int(self, key: builtins.str, default: builtins.int | None = None, *, required: builtins.bool = False,
            minimum: builtins.int | None = None, maximum: builtins.int | None = None) -> builtins.int | None:
        """Return an integer within ``[minimum, maximum]``."""
        value = self.raw(key, default, required=required)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, f"must be an integer, got {type(value).__name__}")
        if minimum is not None and value < minimum:
            raise self.error(key, f"must be at least {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise self.error(key, f"must be at most {maximum}, got {value}")
        return value

    @overload
    def bool(self, key: builtins.str, default: builtins.bool, *, required: builtins.bool = ...) -> builtins.bool: ...

    @overload
    def bool(self, key: builtins.str, default: None = ..., *, required: Literal[True]) -> builtins.bool: ...

    @overload
    def bool(self, key: builtins.str, default: builtins.bool | None = ..., *,
             required: builtins.bool = ...) -> builtins.bool | None: ...

    def bool(self, key: builtins.str, default: builtins.bool | None = None, *,
             required: builtins.bool = False) -> builtins.bool | None:
        """Return a boolean (YAML ``true``/``false`` only)."""
        value = self.raw(key, default, required=required)
        if value is None:
            return None
        if not isinstance(value, bool):
            raise self.error(key, f"must be true or false, got {value!r}")
        return value

    @overload
    def duration(self, key: builtins.str, default: float, *, required: builtins.bool = ...) -> float: ...

    @overload
    def duration(self, key: builtins.str, default: None = ..., *, required: Literal[True]) -> float: ...

    @overload
    def duration(self, key: builtins.str, default: float | None = ..., *,
                 required: builtins.bool = ...) -> float | None: ...

    def duration(self, key: builtins.str, default: float | None = None, *,
                 required: builtins.bool = False) -> float | None:
        """Return a duration in seconds (see :func:`parse_duration`)."""
        value = self.raw(key, default, required=required)
        if value is None:
            return None
        try:
            return parse_duration(value)
        except ValueError as exc:
            raise self.error(key, str(exc)) from None

    def str_list(self, key: builtins.str, default: list[builtins.str] | None = None, *,
                 required: builtins.bool = False) -> list[builtins.str]:
        """Return a list of non-empty strings."""
        value = self.raw(key, default if default is not None else [], required=required)
        if not isinstance(value, list):
            raise self.error(key, f"must be a list, got {type(value).__name__}")
        for i, item in enumerate(value):
            if not isinstance(item, str) or not item:
                raise self.error(f"{key}[{i}]", "must be a non-empty string")
        return list(value)

    def child(self, key: builtins.str, *, required: builtins.bool = False) -> "Reader":
        """Return a :class:`Reader` over the mapping at ``key`` (empty when absent and optional)."""
        value = self.raw(key, None, required=required)
        return Reader(value if value is not None else {}, self.file, self.provider, self.where(key) or key)

    def items(self, key: builtins.str, *, required: builtins.bool = False) -> list["Reader"]:
        """Return one :class:`Reader` per mapping in the list at ``key``."""
        value = self.raw(key, [], required=required)
        if not isinstance(value, list):
            raise self.error(key, f"must be a list, got {type(value).__name__}")
        return [Reader(v, self.file, self.provider, f"{self.where(key)}[{i}]") for i, v in enumerate(value)]

    def mapping(self, key: builtins.str, *, required: builtins.bool = False) -> dict[builtins.str, "Reader"]:
        """Return ``{name: Reader}`` for a mapping of mappings at ``key``."""
        value = self.raw(key, {}, required=required)
        if not isinstance(value, dict):
            raise self.error(key, f"must be a mapping, got {type(value).__name__}")
        return {str(k): Reader(v, self.file, self.provider, f"{self.where(key)}.{k}") for k, v in value.items()}

    def done(self) -> None:
        """Raise :class:`ConfigError` for the first key that no reader asked for (strict mode),
        naming the known key it looks like a misspelling of, if any (``unknown key (did you mean
        "type"?)``)."""
        for key in self.data:
            if key not in self._seen:
                close = difflib.get_close_matches(str(key), sorted(self._seen), n=1, cutoff=0.6)
                hint = f' (did you mean "{close[0]}"?)' if close else ""
                raise self.error(key, "unknown key" + hint)


ParseBlock = Callable[[Reader], Any]


def load_yaml(path: str, what: str = "") -> Any:
    """Read and decode the YAML file ``path``.

    Args:
        what: what the file is, for messages (``"tokens file"``); may be empty.
    Raises:
        ConfigError: the file cannot be read or is not valid YAML (with line and column).
    """
    import yaml

    label = f" {what}" if what else ""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise ConfigError(path, None, None, problem=f"cannot read{label}: {exc.strerror or exc}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(path, None, None, problem=f"not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
