"""Admit an object against a CustomResourceDefinition the way kube-apiserver does.

The dev cluster's HTTP fake of the Kubernetes API (:mod:`devcluster.apiserver`, through
:func:`devcluster.cluster.crd_admission`) and the tests admit custom resources through :func:`admit`. It
mirrors what ``apiextensions-apiserver`` does with a create or update of a custom resource,
as far as this project relies on it:

1. **Pruning** of fields the schema does not declare (dropped; with
   ``field_validation="Strict"`` they are an error, like ``kubectl apply`` sends by default).
2. **Structural defaulting**: a missing property with a ``default`` gets a deep copy of it,
   then defaulting recurses into every present property, so nested defaults apply inside a
   defaulted ``{}``.  A ``null`` in a non-nullable field is defaulted, else dropped.
3. **OpenAPI validation**: ``type``, ``required``, ``enum``, ``minLength``/``maxLength``,
   ``pattern``, ``minimum``/``maximum``, ``minItems``/``maxItems``,
   ``minProperties``/``maxProperties``, ``format: date-time``,
   ``additionalProperties`` and ``x-kubernetes-list-type: map|set`` uniqueness.
4. **CEL rules** (``x-kubernetes-validations``) evaluated with cel-python: ``self`` is the
   node's value; a rule that mentions ``oldSelf`` is a transition rule and runs only on
   update and only where the old object has a value at the same place (list items are
   correlated only in ``map``/``set`` lists).  Like the API server, rules are not evaluated
   when the OpenAPI step found a *blocking* error (type, required, enum, too long, too
   many) and the message ``some validation rules were not checked ...`` is added instead.

Error strings have the API server's format (``k8s.io/apimachinery/pkg/util/validation/field``,
``Error.Error()``), e.g.::

    spec: Invalid value: "object": spec.provider is required when spec.mode is Managed
    spec.mode: Unsupported value: "Foo": supported values: "Managed", "External"
    spec.maxLeases: Invalid value: -1: spec.maxLeases in body should be greater than or equal to 0

Not modelled: ``metadata`` validation (left to the caller), ``messageExpression``,
validation ratcheting of unchanged values (Kubernetes >= 1.30), CEL cost limits, and
status/spec reset of the status subresource (the caller decides what ``obj`` holds:
the API server validates the whole object on both the main resource and ``/status``).
"""

from __future__ import annotations

import copy
import datetime
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import celpy
import yaml

__all__ = [
    "FieldError", "Invalid", "StrictDecodingError", "admit", "default", "load_crd",
    "schema_of", "validate",
]

_MISSING = object()  # "no value here" (distinct from JSON null)
_OMIT = object()     # a FieldError without a bad value

# field.ErrorType -> (Reason used in a Status cause, text printed by Error())
_TYPES = {
    "Required": ("FieldValueRequired", "Required value"),
    "Invalid": ("FieldValueInvalid", "Invalid value"),
    "TypeInvalid": ("FieldValueTypeInvalid", "Invalid value"),
    "NotSupported": ("FieldValueNotSupported", "Unsupported value"),
    "Duplicate": ("FieldValueDuplicate", "Duplicate value"),
    "TooLong": ("FieldValueTooLong", "Too long"),
    "TooMany": ("FieldValueTooMany", "Too many"),
    "Forbidden": ("FieldValueForbidden", "Forbidden"),
    "Internal": ("InternalError", "Internal error"),
}
# Errors after which the API server does not evaluate CEL rules
# (apiextensions-apiserver pkg/registry/customresource/strategy.go, hasBlockingErr).
_BLOCKING = {"Required", "NotSupported", "TooLong", "TooMany", "TypeInvalid"}
_NOT_CHECKED = ("some validation rules were not checked because the object was invalid; "
                "correct the existing errors to complete validation")
# Rule "reason" values (apiextensions v1 FieldValueErrorReason) -> error type.
_RULE_REASONS = {
    "FieldValueInvalid": "Invalid", "FieldValueForbidden": "Forbidden",
    "FieldValueRequired": "Required", "FieldValueDuplicate": "Duplicate",
}
# strfmt IsDateTime (go-openapi), used by format: date-time.
_DATE_TIME = re.compile(r"^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")
_ROOT_KEEP = ("apiVersion", "kind", "metadata")


def _go_value(value: Any) -> str:
    """Render a bad value like Go's field.Error does (strings quoted, scalars bare)."""
    if value is None:
        return '"null"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, dict) and all(isinstance(v, (str, int, bool)) for v in value.values()):
        return "map[string]interface {}{" + ", ".join(
            f"{json.dumps(k)}:{json.dumps(v)}" for k, v in value.items()) + "}"
    return json.dumps(value, sort_keys=True)


@dataclass(frozen=True)
class FieldError:
    """One field error, as ``k8s.io/apimachinery/pkg/util/validation/field.Error``.

    Attributes:
        type: ``"Required"``, ``"Invalid"``, ``"TypeInvalid"``, ``"NotSupported"``,
            ``"Duplicate"``, ``"TooLong"``, ``"TooMany"``, ``"Forbidden"`` or ``"Internal"``.
        field: dotted path, e.g. ``"spec.endpoint.host"`` (``""`` for the whole object).
        value: the bad value (printed for the value-carrying types).
        detail: the explanation (a rule's message for CEL errors).
    """

    type: str
    field: str
    value: Any = _OMIT
    detail: str = ""

    @property
    def reason(self) -> str:
        """The ``reason`` of this error as a cause in a ``Status`` (``FieldValueInvalid``...)."""
        return _TYPES[self.type][0]

    def body(self) -> str:
        """The message without the field path (the ``message`` of a Status cause)."""
        label = _TYPES[self.type][1]
        if self.type in ("Required", "Forbidden", "TooLong", "Internal") or self.value is _OMIT:
            text = label
        else:
            text = f"{label}: {_go_value(self.value)}"
        return f"{text}: {self.detail}" if self.detail else text

    def __str__(self) -> str:
        return f"{self.field or '<nil>'}: {self.body()}"


class Invalid(ValueError):
    """The object failed validation (the API server answers 422 ``Invalid``).

    Attributes:
        errors: the error strings, API-server format, in the order found.
        causes: the same as :class:`FieldError` values.
    """

    def __init__(self, causes: list[FieldError]) -> None:
        self.causes = list(causes)
        self.errors = [str(c) for c in self.causes]
        super().__init__("; ".join(self.errors))

    def status(self, kind: str, group: str, name: str) -> dict:
        """Return the ``Status`` body kube-apiserver sends for this failure (HTTP 422).

        Args:
            kind: the resource kind, e.g. ``"Proxy"``.
            group: the API group, e.g. ``"crawl.example.com"``.
            name: ``metadata.name`` of the object.
        """
        joined = self.errors[0] if len(self.errors) == 1 else "[" + ", ".join(self.errors) + "]"
        qualified = f"{kind}.{group}" if group else kind
        return {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": f'{qualified} "{name}" is invalid: {joined}',
            "reason": "Invalid",
            "details": {
                "name": name, "group": group, "kind": kind,
                "causes": [{"reason": c.reason, "message": c.body(), "field": c.field} for c in self.causes],
            },
            "code": 422,
        }


class StrictDecodingError(ValueError):
    """Unknown fields under ``fieldValidation=Strict`` (the API server answers 400 BadRequest).

    Attributes:
        fields: dotted paths of the undeclared fields, e.g. ``["spec.foo"]``.
    """

    def __init__(self, fields: list[str]) -> None:
        self.fields = list(fields)
        super().__init__("strict decoding error: " + ", ".join(f'unknown field "{f}"' for f in self.fields))


# -- CRD access ---------------------------------------------------------------------------

def load_crd(path: str | Path) -> dict:
    """Read a CRD manifest (YAML, the first ``CustomResourceDefinition`` document in it).

    Raises:
        ValueError: the file holds no CustomResourceDefinition.
    """
    for doc in yaml.safe_load_all(Path(path).read_text(encoding="utf-8")):
        if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
            return doc
    raise ValueError(f"{path}: no CustomResourceDefinition in this file")


def schema_of(crd_doc: dict, version: str | None = None) -> dict:
    """Return ``openAPIV3Schema`` of ``version`` (default: the storage version).

    Raises:
        KeyError: no such version, or it has no schema.
    """
    for v in crd_doc["spec"]["versions"]:
        if (version is None and v.get("storage")) or v["name"] == version:
            return v["schema"]["openAPIV3Schema"]
    raise KeyError(f"CRD {crd_doc['metadata']['name']} has no version {version!r}")


# -- pruning and defaulting ---------------------------------------------------------------

def _nullable(schema: dict) -> bool:
    return bool(schema.get("nullable"))


def _prune(schema: dict, value: Any, path: str, unknown: list[str]) -> None:
    """Drop undeclared fields in place (apiextensions-apiserver pruning); record their paths.

    ``apiVersion``, ``kind`` and ``metadata`` at the root are always kept.
    """
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return
    if isinstance(value, dict) and schema.get("type", "object") == "object":
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for key in list(value):
            if not path and key in _ROOT_KEEP:
                continue
            if key in props:
                _prune(props[key], value[key], _join(path, key), unknown)
            elif isinstance(extra, dict):
                _prune(extra, value[key], _join(path, key), unknown)
            elif extra is True:
                continue
            else:
                unknown.append(_join(path, key))
                del value[key]
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            _prune(schema["items"], item, f"{path}[{i}]", unknown)


def default(schema: dict, value: Any) -> Any:
    """Apply structural defaults in place and return ``value``.

    For an object, every declared property that is missing (or a ``null`` the schema does
    not allow) gets a deep copy of its ``default``; then defaulting recurses into every
    present property, so a defaulted ``{}`` receives its nested defaults.  A non-nullable
    ``null`` without a default is dropped.  Source: apiextensions-apiserver
    ``pkg/apiserver/schema/defaulting`` (``Default``, ``PruneNonNullableNullsWithoutDefaults``).
    """
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for key, prop in props.items():
            if key in value and value[key] is None and not _nullable(prop):
                if "default" in prop:
                    value[key] = copy.deepcopy(prop["default"])
                else:
                    del value[key]
            elif key not in value and "default" in prop:
                value[key] = copy.deepcopy(prop["default"])
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            if key in props:
                default(props[key], item)
            elif isinstance(extra, dict):
                default(extra, item)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            default(schema["items"], item)
    return value


# -- OpenAPI validation -------------------------------------------------------------------

def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


#: JSON type names of parsed JSON values, in the order they are tested (``bool`` before ``int``).
_JSON_TYPES = ((type(None), "null"), (bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"),
               (list, "array"), (dict, "object"))


def _json_type(value: Any) -> str:
    for kind, name in _JSON_TYPES:
        if isinstance(value, kind):
            return name
    return type(value).__name__


def _type_ok(want: str, value: Any) -> bool:
    got = _json_type(value)
    if want == "number":
        return got in ("number", "integer")
    if want == "integer" and got == "number":
        return float(value).is_integer()
    return got == want


def _is_date_time(text: str) -> bool:
    m = _DATE_TIME.match(text)
    if not m:
        return False
    try:
        datetime.date(int(m[1]), int(m[2]), int(m[3]))
    except ValueError:
        return False
    return int(m[4]) < 24 and int(m[5]) < 60 and int(m[6]) < 61


def _num(n: float) -> str:
    return str(int(n)) if float(n).is_integer() else repr(n)


def _validate(schema: dict, value: Any, path: str, errors: list[FieldError]) -> None:
    """Append OpenAPI schema violations of ``value`` at ``path`` to ``errors``."""
    name = path or "."
    if value is None and _nullable(schema):
        return
    if schema.get("x-kubernetes-int-or-string"):
        if _json_type(value) not in ("integer", "string"):
            errors.append(FieldError("TypeInvalid", path, _json_type(value),
                                     f"{name} in body must be of type integer,string: {json.dumps(_json_type(value))}"))
            return
    elif "type" in schema and not _type_ok(schema["type"], value):
        got = _json_type(value)
        errors.append(FieldError("TypeInvalid", path, got,
                                 f"{name} in body must be of type {schema['type']}: {json.dumps(got)}"))
        return
    if "enum" in schema and value not in schema["enum"]:
        errors.append(FieldError("NotSupported", path, value, "supported values: " + ", ".join(
            json.dumps(v if isinstance(v, str) else json.dumps(v)) for v in schema["enum"])))
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            errors.append(FieldError("Invalid", path, value,
                                     f"{name} in body should be at least {schema['minLength']} chars long"))
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(FieldError("TooLong", path, value, f"may not be more than {schema['maxLength']} bytes"))
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append(FieldError("Invalid", path, value, f"{name} in body should match '{schema['pattern']}'"))
        if schema.get("format") == "date-time" and not _is_date_time(value):
            errors.append(FieldError("TypeInvalid", path, value,
                                     f"{name} in body must be of type date-time: {json.dumps(value)}"))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema:
            lo = schema["minimum"]
            if value < lo or (schema.get("exclusiveMinimum") and value == lo):
                word = "greater than" if schema.get("exclusiveMinimum") else "greater than or equal to"
                errors.append(FieldError("Invalid", path, value, f"{name} in body should be {word} {_num(lo)}"))
        if "maximum" in schema:
            hi = schema["maximum"]
            if value > hi or (schema.get("exclusiveMaximum") and value == hi):
                word = "less than" if schema.get("exclusiveMaximum") else "less than or equal to"
                errors.append(FieldError("Invalid", path, value, f"{name} in body should be {word} {_num(hi)}"))
    if isinstance(value, dict):
        if "minProperties" in schema and len(value) < schema["minProperties"]:
            errors.append(FieldError("Invalid", path, len(value),
                                     f"{name} in body should have at least {schema['minProperties']} properties"))
        if "maxProperties" in schema and len(value) > schema["maxProperties"]:
            errors.append(FieldError("TooMany", path, len(value),
                                     f"must have at most {schema['maxProperties']} items"))
        for key in schema.get("required") or ():
            if key not in value:
                errors.append(FieldError("Required", _join(path, key)))
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            if key in props:
                _validate(props[key], item, _join(path, key), errors)
            elif isinstance(extra, dict):
                _validate(extra, item, _join(path, key), errors)
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            errors.append(FieldError("Invalid", path, value,
                                     f"{name} in body should have at least {schema['minItems']} items"))
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append(FieldError("TooMany", path, len(value), f"must have at most {schema['maxItems']} items"))
        items = schema.get("items")
        if isinstance(items, dict):
            for i, item in enumerate(value):
                _validate(items, item, f"{path}[{i}]", errors)
        _validate_list_type(schema, value, path, errors)


def _list_key(schema: dict, item: Any) -> Any:
    """The identity of a list item: its map keys (list-type map) or itself (set)."""
    if schema.get("x-kubernetes-list-type") == "map" and isinstance(item, dict):
        return {k: item.get(k) for k in schema.get("x-kubernetes-list-map-keys") or ()}
    return item


def _validate_list_type(schema: dict, value: list, path: str, errors: list[FieldError]) -> None:
    """Reject duplicate keys in ``map`` lists and duplicate items in ``set`` lists
    (apiextensions-apiserver ``pkg/apiserver/schema/listtype``)."""
    if schema.get("x-kubernetes-list-type") not in ("map", "set"):
        return
    seen: list[str] = []
    for i, item in enumerate(value):
        key = json.dumps(_list_key(schema, item), sort_keys=True)
        if key in seen:
            errors.append(FieldError("Duplicate", f"{path}[{i}]", _list_key(schema, item)))
        seen.append(key)


def validate(schema: dict, obj: dict) -> list[FieldError]:
    """Return the OpenAPI violations of ``obj`` (already pruned and defaulted); [] if valid.

    ``metadata`` is checked only against the schema's ``type: object``.
    """
    errors: list[FieldError] = []
    _validate(schema, obj, "", errors)
    return errors


# -- CEL ----------------------------------------------------------------------------------

_ENV = celpy.Environment()  # the interpreter: cel-python 0.5's CompiledRunner mis-evaluates `!has(...)`
_OLD_SELF = re.compile(r"\boldSelf\b")


@lru_cache(maxsize=256)
def _program(rule: str) -> Any:
    return _ENV.program(_ENV.compile(rule))


def _rule_path(path: str, field_path: str | None) -> str:
    if not field_path:
        return path
    extra = field_path.lstrip(".")
    return _join(path, extra)


def _cel(schema: dict, value: Any, old: Any, path: str, errors: list[FieldError]) -> None:
    """Evaluate the ``x-kubernetes-validations`` of ``schema`` on ``value`` and below."""
    if value is None:
        return
    rules = schema.get("x-kubernetes-validations") or ()
    cel_self = celpy.json_to_cel(value) if rules else None
    cel_old = celpy.json_to_cel(old) if rules and old is not _MISSING else None
    for rule in rules:
        text = rule["rule"]
        transition = bool(_OLD_SELF.search(text))
        if transition and old is _MISSING:
            continue
        activation = {"self": cel_self}
        if transition:
            activation["oldSelf"] = cel_old
        where = _rule_path(path, rule.get("fieldPath"))
        try:
            result = _program(text).evaluate(activation)
        except celpy.CELEvalError as exc:
            result = exc
        if isinstance(result, celpy.CELEvalError):
            errors.append(FieldError("Invalid", where, schema.get("type", ""),
                                     f"{result.args[0] if result.args else result} evaluating rule: {text}"))
            continue
        if result is True or (isinstance(result, celpy.celtypes.BoolType) and bool(result)):
            continue
        message = rule.get("message") or f"failed rule: {text}"
        kind = _RULE_REASONS.get(rule.get("reason") or "FieldValueInvalid", "Invalid")
        if kind in ("Required", "Forbidden"):
            errors.append(FieldError(kind, where, _OMIT, message))
        else:
            # the node's type, as the server prints it ("" for x-kubernetes-int-or-string)
            errors.append(FieldError(kind, where, schema.get("type", ""), message))
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            sub = props.get(key) if key in props else (extra if isinstance(extra, dict) else None)
            if sub is None or (not path and key in _ROOT_KEEP):
                continue
            old_item = old.get(key, _MISSING) if isinstance(old, dict) else _MISSING
            _cel(sub, item, old_item, _join(path, key), errors)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        items = schema["items"]
        correlate = schema.get("x-kubernetes-list-type") in ("map", "set") and isinstance(old, list)
        old_by_key = {}
        if correlate:
            old_by_key = {json.dumps(_list_key(schema, o), sort_keys=True): o for o in old}
        for i, item in enumerate(value):
            old_item = old_by_key.get(json.dumps(_list_key(schema, item), sort_keys=True), _MISSING)
            _cel(items, item, old_item, f"{path}[{i}]", errors)


# -- admission ----------------------------------------------------------------------------

def admit(crd_doc: dict, obj: dict, old: dict | None = None, *, version: str | None = None,
          field_validation: str = "Warn", warnings: list[str] | None = None) -> dict:
    """Prune, default and validate ``obj`` like kube-apiserver admits a custom resource.

    Args:
        crd_doc: the CustomResourceDefinition (a dict, e.g. from :func:`load_crd`).
        obj: the object as sent by the client (not modified).
        old: the stored object on update (``None`` on create); it is defaulted too, as the
            API server defaults what it reads from storage.  Transition rules (those that
            mention ``oldSelf``) run only when this is given.
        version: the CRD version to use (default: the one named by ``obj["apiVersion"]``,
            else the storage version).
        field_validation: ``"Strict"`` rejects undeclared fields; ``"Warn"`` (the
            server's default) and ``"Ignore"`` drop them.
        warnings: when a list is given and ``field_validation == "Warn"``, one
            ``unknown field "<path>"`` string per dropped field is appended (the API
            server sends them as ``Warning`` headers).

    Returns:
        A new dict: ``obj`` pruned and defaulted.

    Raises:
        StrictDecodingError: undeclared fields with ``field_validation="Strict"``.
        Invalid: schema or CEL violations; ``.errors`` holds API-server-style strings.
    """
    if version is None:
        api_version = str(obj.get("apiVersion") or "")
        wanted = api_version.rpartition("/")[2] if "/" in api_version else None
        names = [v["name"] for v in crd_doc["spec"]["versions"]]
        version = wanted if wanted in names else None
    schema = schema_of(crd_doc, version)
    new = copy.deepcopy(obj)
    unknown: list[str] = []
    _prune(schema, new, "", unknown)
    if unknown and field_validation == "Strict":
        raise StrictDecodingError(unknown)
    if unknown and field_validation == "Warn" and warnings is not None:
        warnings.extend(f'unknown field "{u}"' for u in unknown)
    default(schema, new)
    errors = validate(schema, new)
    if any(e.type in _BLOCKING for e in errors):
        if _has_rules(schema):
            errors.append(FieldError("Invalid", "", None, _NOT_CHECKED))
    else:
        old_value: Any = _MISSING
        if old is not None:
            old_value = copy.deepcopy(old)
            _prune(schema, old_value, "", [])
            default(schema, old_value)
        _cel(schema, new, old_value, "", errors)
    if errors:
        raise Invalid(errors)
    return new


def _has_rules(schema: Any) -> bool:
    if isinstance(schema, dict):
        if schema.get("x-kubernetes-validations"):
            return True
        return any(_has_rules(v) for v in schema.values() if isinstance(v, (dict, list)))
    if isinstance(schema, list):
        return any(_has_rules(v) for v in schema)
    return False
