"""``/openapi/v2`` as protobuf: the Swagger 2.0 document in gnostic's ``openapi.v2.Document``
message, the only form of it kubectl decodes.

kube-apiserver serves ``/openapi/v2`` as JSON or, for
``Accept: application/com.github.proto-openapi.spec.v2@v1.0+protobuf`` (or ``.v2.v1.0+``),
as that message
(github.com/google/gnostic-models, ``openapiv2/OpenAPIv2.proto``; the field numbers below
are that file's).  ``kubectl apply`` reads it whenever the OpenAPI v3 document of the
object's group-version lacks its kind (a mistyped ``kind``, an unknown ``apiVersion``): it
validates with v2 instead, finds no schema for the kind, validates nothing and lets the REST
mapping answer ``no matches for kind "Proxi" in version "crawl.example.com/v1alpha1"``.
Without this form kubectl stops at ``failed to download openapi``.

:func:`document` encodes what :func:`devcluster.apiserver.openapi.v2_document` holds: ``swagger``,
``info``, ``paths`` (operations, parameters, responses, vendor extensions) and
``definitions`` (JSON Schema; ``anyOf``, which Swagger 2.0 lacks, is left out as the server's
own v2 conversion does).  Values of ``default``, ``enum``, ``example`` and of the ``x-``
extensions are ``Any`` messages holding YAML text (JSON, which is YAML), as gnostic writes
them.  Encoded by hand in the protobuf wire format (varints, length-delimited fields,
little-endian doubles); fields at their proto3 default are left out.
"""

from __future__ import annotations

import json
import struct
from typing import Any

#: The media type of the protobuf form, as the server names it in ``Content-Type``
#: (kube-openapi's ``pkg/handler``), and the ones it accepts for it in ``Accept`` (kubectl
#: sends the older one, with an ``@`` Go's ``mime`` cannot parse in a ``Content-Type``).
MEDIA_TYPE = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"
ACCEPTED = (MEDIA_TYPE, "application/com.github.proto-openapi.spec.v2@v1.0+protobuf")

_VARINT, _FIXED64, _BYTES = 0, 1, 2


def _varint(n: int) -> bytes:
    if n < 0:
        n += 1 << 64  # int64 as two's complement, as protobuf writes negative varints
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _key(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


class _Msg:
    """One message being written, field by field (proto3: default values are left out)."""

    def __init__(self) -> None:
        self.out = bytearray()

    def bytes_(self, field: int, data: bytes, *, always: bool = False) -> "_Msg":
        if data or always:
            self.out += _key(field, _BYTES) + _varint(len(data)) + data
        return self

    def str(self, field: int, value: Any) -> "_Msg":
        if isinstance(value, str) and value:
            self.bytes_(field, value.encode())
        return self

    def strs(self, field: int, values: Any) -> "_Msg":
        for v in values or ():
            self.bytes_(field, str(v).encode(), always=True)
        return self

    def bool(self, field: int, value: Any) -> "_Msg":
        if value is True:
            self.out += _key(field, _VARINT) + b"\x01"
        return self

    def int(self, field: int, value: Any) -> "_Msg":
        if isinstance(value, int) and not isinstance(value, bool) and value:
            self.out += _key(field, _VARINT) + _varint(value)
        return self

    def double(self, field: int, value: Any) -> "_Msg":
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value:
            self.out += _key(field, _FIXED64) + struct.pack("<d", float(value))
        return self

    def msg(self, field: int, data: bytes | None) -> "_Msg":
        if data is not None:
            self.bytes_(field, data, always=True)
        return self

    def done(self) -> bytes:
        return bytes(self.out)


def _any(value: Any) -> bytes:
    """``Any``: ``yaml`` (field 2) holding the value as JSON text."""
    return _Msg().str(2, json.dumps(value)).done()


def _named_any(name: str, value: Any) -> bytes:
    return _Msg().str(1, name).msg(2, _any(value)).done()


def _extensions(m: _Msg, field: int, doc: dict) -> None:
    for key, value in doc.items():
        if isinstance(key, str) and key.startswith("x-"):
            m.msg(field, _named_any(key, value))


def schema(s: dict) -> bytes:
    """A JSON Schema object as ``openapi.v2.Schema``."""
    m = _Msg().str(1, s.get("$ref")).str(2, s.get("format")).str(3, s.get("title")).str(4, s.get("description"))
    if "default" in s:
        m.msg(5, _any(s["default"]))
    m.double(6, s.get("multipleOf")).double(7, s.get("maximum")).bool(8, s.get("exclusiveMaximum"))
    m.double(9, s.get("minimum")).bool(10, s.get("exclusiveMinimum"))
    m.int(11, s.get("maxLength")).int(12, s.get("minLength")).str(13, s.get("pattern"))
    m.int(14, s.get("maxItems")).int(15, s.get("minItems")).bool(16, s.get("uniqueItems"))
    m.int(17, s.get("maxProperties")).int(18, s.get("minProperties")).strs(19, s.get("required"))
    for value in s.get("enum") or ():
        m.msg(20, _any(value))
    extra = s.get("additionalProperties")
    if isinstance(extra, dict):
        m.msg(21, _Msg().msg(1, schema(extra)).done())
    elif isinstance(extra, bool):  # AdditionalPropertiesItem.boolean: false must be written
        m.msg(21, _key(2, _VARINT) + (b"\x01" if extra else b"\x00"))
    kind = s.get("type")
    if kind:
        m.msg(22, _Msg().strs(1, [kind] if isinstance(kind, str) else kind).done())
    items = s.get("items")
    if items is not None:
        items_msg = _Msg()
        for item in items if isinstance(items, list) else [items]:
            items_msg.msg(1, schema(item))
        m.msg(23, items_msg.done())
    for part in s.get("allOf") or ():
        m.msg(24, schema(part))
    if "properties" in s:
        props = _Msg()
        for name, sub in (s.get("properties") or {}).items():
            props.msg(1, _Msg().str(1, name).msg(2, schema(sub)).done())
        m.msg(25, props.done())
    m.str(26, s.get("discriminator")).bool(27, s.get("readOnly"))
    if "example" in s:
        m.msg(30, _any(s["example"]))
    _extensions(m, 31, s)
    return m.done()


#: Non-body parameter kinds: (``NonBodyParameter`` field, whether the sub-schema has
#: ``allow_empty_value`` (field 5), shifting the later fields by one).
_NON_BODY = {"header": (1, False), "formData": (2, True), "query": (3, True), "path": (4, False)}


def _parameter(p: dict) -> bytes:
    """A parameter or a ``$ref`` to one as ``ParametersItem``."""
    if "$ref" in p:
        return _Msg().msg(2, _Msg().str(1, p["$ref"]).str(2, p.get("description")).done()).done()
    where = p.get("in")
    if where == "body":
        body = (_Msg().str(1, p.get("description")).str(2, p.get("name")).str(3, where).bool(4, p.get("required"))
                .msg(5, schema(p.get("schema") or {})))
        _extensions(body, 6, p)
        return _Msg().msg(1, _Msg().msg(1, body.done()).done()).done()
    field, empty_value = _NON_BODY.get(where, (3, True))
    sub = _Msg().bool(1, p.get("required")).str(2, where).str(3, p.get("description")).str(4, p.get("name"))
    shift = 1 if empty_value else 0
    if empty_value:
        sub.bool(5, p.get("allowEmptyValue"))
    sub.str(5 + shift, p.get("type")).str(6 + shift, p.get("format"))
    sub.str(8 + shift, p.get("collectionFormat"))
    if "default" in p:
        sub.msg(9 + shift, _any(p["default"]))
    sub.bool(19 + shift, p.get("uniqueItems"))
    _extensions(sub, 22 + shift, p)
    return _Msg().msg(1, _Msg().msg(2, _Msg().msg(field, sub.done()).done()).done()).done()


def _operation(op: dict) -> bytes:
    m = _Msg().strs(1, op.get("tags")).str(2, op.get("summary")).str(3, op.get("description"))
    m.str(5, op.get("operationId")).strs(6, op.get("produces")).strs(7, op.get("consumes"))
    for p in op.get("parameters") or ():
        m.msg(8, _parameter(p))
    responses = _Msg()
    for code, r in (op.get("responses") or {}).items():
        response = _Msg().str(1, r.get("description"))
        if "schema" in r:
            response.msg(2, _Msg().msg(1, schema(r["schema"])).done())
        responses.msg(1, _Msg().str(1, str(code)).msg(2, _Msg().msg(1, response.done()).done()).done())
    m.msg(9, responses.done())
    m.strs(10, op.get("schemes")).bool(11, op.get("deprecated"))
    _extensions(m, 13, op)
    return m.done()


_METHODS = {"get": 2, "put": 3, "post": 4, "delete": 5, "options": 6, "head": 7, "patch": 8}


def document(doc: dict) -> bytes:
    """The Swagger 2.0 document ``doc`` (:func:`devcluster.apiserver.openapi.v2_document`) as an
    ``openapi.v2.Document`` message."""
    info = doc.get("info") or {}
    m = _Msg().str(1, doc.get("swagger")).msg(2, _Msg().str(1, info.get("title")).str(2, info.get("version")).done())
    paths = _Msg()
    for path, item in (doc.get("paths") or {}).items():
        pi = _Msg()
        for method, field in _METHODS.items():
            if method in item:
                pi.msg(field, _operation(item[method]))
        for p in item.get("parameters") or ():
            pi.msg(9, _parameter(p))
        _extensions(pi, 10, item)
        paths.msg(2, _Msg().str(1, path).msg(2, pi.done()).done())
    m.msg(8, paths.done())
    definitions = _Msg()
    for name, s in (doc.get("definitions") or {}).items():
        definitions.msg(1, _Msg().str(1, name).msg(2, schema(s)).done())
    m.msg(9, definitions.done())
    return m.done()
