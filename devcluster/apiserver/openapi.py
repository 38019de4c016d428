"""What the fake publishes about its types for ``kubectl``: CRD facts, OpenAPI v2/v3, discovery v2.

kube-apiserver builds these from the CustomResourceDefinitions it serves
(apiextensions-apiserver's ``controller/openapi/builder``): each CRD version's
``openAPIV3Schema`` becomes a definition named by the reversed group
(``com.example.crawl.v1alpha1.Proxy``) with ``metadata`` replaced by a reference to
``ObjectMeta`` and an ``x-kubernetes-group-version-kind`` extension; every REST path gets its
operations with the same extension and their query parameters, among them
``fieldValidation``, which tells kubectl (``resource.QueryParamVerifierV3``) that the server
validates fields itself, so ``kubectl apply`` (validation on) sends ``fieldValidation=Strict``
instead of validating client-side with the OpenAPI v2 protobuf document.

* :func:`load_crds` reads ``deploy/crd/*.yaml`` (schemas and printer columns, by type).
* :func:`v3_root` / :func:`v3_group_version`: ``/openapi/v3`` and ``/openapi/v3/<gv path>``
  (what ``kubectl explain`` and the verifier read).
* :func:`v2_document`: ``/openapi/v2`` as JSON, and as the protobuf kubectl asks for
  (:mod:`devcluster.apiserver.openapi_proto`): kubectl reads it only for a kind the v3 document of
  its group-version lacks, then lists the CRDs (:func:`crd_objects`) before the REST mapping
  refuses the kind as kube-apiserver's discovery does (``no matches for kind``).
* :func:`aggregated_discovery`: ``apidiscovery.k8s.io/v2`` ``APIGroupDiscoveryList`` for
  ``/api`` and ``/apis`` (kubectl asks for it first and falls back to the legacy documents).

A type with a ``scale`` subresource also gets its ``/scale`` path (operations on
``io.k8s.api.autoscaling.v1.Scale``) and, in discovery, the ``scale`` subresource whose
response kind is ``autoscaling/v1`` ``Scale``: client-go's scale client (``kubectl scale``)
finds the kind to send there that way.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import yaml

from devcluster import CRD_DIR
from devcluster.apiserver.resources import ResourceType

OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
LIST_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta"
VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]

#: The part of ObjectMeta clients write or read (the server's definition has a few more).
_OBJECT_META_SCHEMA = {
    "description": "ObjectMeta is metadata that all persisted resources must have, which includes all objects "
                   "users must create.",
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "Name must be unique within a namespace."},
        "generateName": {"type": "string"},
        "namespace": {"type": "string", "description": "Namespace defines the space within which each name "
                                                       "must be unique."},
        "uid": {"type": "string"}, "resourceVersion": {"type": "string"},
        "generation": {"type": "integer", "format": "int64"},
        "creationTimestamp": {"type": "string", "format": "date-time"},
        "deletionTimestamp": {"type": "string", "format": "date-time"},
        "deletionGracePeriodSeconds": {"type": "integer", "format": "int64"},
        "labels": {"type": "object", "additionalProperties": {"type": "string", "default": ""},
                   "description": "Map of string keys and values that can be used to organize and categorize "
                                  "(scope and select) objects."},
        "annotations": {"type": "object", "additionalProperties": {"type": "string", "default": ""},
                        "description": "Annotations is an unstructured key value map stored with a resource."},
        "finalizers": {"type": "array", "items": {"type": "string", "default": ""},
                       "x-kubernetes-list-type": "set"},
        "ownerReferences": {"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
        "managedFields": {"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
    },
}
SCALE = "io.k8s.api.autoscaling.v1.Scale"
SCALE_GVK = {"group": "autoscaling", "version": "v1", "kind": "Scale"}
#: ``autoscaling/v1`` ``Scale``, what ``.../<name>/scale`` answers and accepts.
_SCALE_SCHEMA = {
    "description": "Scale represents a scaling request for a resource.",
    "type": "object",
    "properties": {
        "apiVersion": {"type": "string"}, "kind": {"type": "string"},
        "metadata": {"allOf": [{"$ref": "#/components/schemas/" + OBJECT_META}], "default": {}},
        "spec": {"type": "object", "default": {}, "properties": {"replicas": {
            "type": "integer", "format": "int32", "description": "replicas is the desired number of instances "
                                                                 "for the scaled object."}}},
        "status": {"type": "object", "default": {}, "required": ["replicas"], "properties": {
            "replicas": {"type": "integer", "format": "int32", "default": 0,
                         "description": "replicas is the actual number of observed instances of the scaled object."},
            "selector": {"type": "string", "description": "selector is the label query over pods that should "
                                                          "match the replicas count."}}},
    },
    "x-kubernetes-group-version-kind": [SCALE_GVK],
}
_LIST_META_SCHEMA = {"type": "object", "properties": {"resourceVersion": {"type": "string"},
                                                       "continue": {"type": "string"},
                                                       "remainingItemCount": {"type": "integer"}}}


class CRDInfo:
    """One served version of a CustomResourceDefinition: schema, printer columns, names."""

    def __init__(self, doc: dict, version: dict) -> None:
        spec = doc["spec"]
        self.doc = doc
        self.group, self.version = spec["group"], version["name"]
        self.kind, self.plural = spec["names"]["kind"], spec["names"]["plural"]
        self.singular = spec["names"].get("singular") or self.kind.lower()
        self.short_names = list(spec["names"].get("shortNames") or [])
        self.categories = list(spec["names"].get("categories") or [])
        self.namespaced = spec.get("scope", "Namespaced") == "Namespaced"
        self.schema = copy.deepcopy((version.get("schema") or {}).get("openAPIV3Schema") or {"type": "object"})
        self.columns = list(version.get("additionalPrinterColumns") or [])
        self.has_status = "status" in (version.get("subresources") or {})

    @property
    def definition_name(self) -> str:
        """``com.example.crawl.v1alpha1.Proxy``: the group reversed, as kube-apiserver names CRD schemas."""
        return ".".join(reversed(self.group.split("."))) + f".{self.version}.{self.kind}"


def load_crds(directory: Path = CRD_DIR) -> dict[tuple[str, str, str], CRDInfo]:
    """Return ``{(group, version, plural): CRDInfo}`` for every served version in ``directory``."""
    out: dict[tuple[str, str, str], CRDInfo] = {}
    for path in sorted(Path(directory).glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not isinstance(doc, dict) or doc.get("kind") != "CustomResourceDefinition":
                continue
            for version in doc["spec"]["versions"]:
                if version.get("served", True):
                    info = CRDInfo(doc, version)
                    out[(info.group, info.version, info.plural)] = info
    return out


def crd_objects(crds: dict) -> list[dict]:
    """The CustomResourceDefinitions behind ``crds`` (:func:`load_crds`) as the server lists them
    (``apiextensions.k8s.io/v1``): each once, by name, ``Established`` with its names accepted.
    kubectl lists them when a manifest's kind has no schema (its ``failed to check CRD``
    otherwise)."""
    out: dict[str, dict] = {}
    for info in crds.values():
        doc = info.doc
        name = doc["metadata"]["name"]
        if name not in out:
            out[name] = {**copy.deepcopy(doc), "apiVersion": "apiextensions.k8s.io/v1",
                         "kind": "CustomResourceDefinition",
                         "status": {"acceptedNames": copy.deepcopy(doc["spec"]["names"]),
                                    "storedVersions": [v["name"] for v in doc["spec"]["versions"] if v.get("storage")],
                                    "conditions": [{"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                                                    "message": "the initial names have been accepted",
                                                    "lastTransitionTime": "2030-01-01T00:00:00Z"}]}}
    return [out[name] for name in sorted(out)]


def _gvk(rt: ResourceType) -> dict:
    return {"group": rt.group, "version": rt.version, "kind": rt.kind}


def _definition_name(rt: ResourceType, crd: CRDInfo | None) -> str:
    if crd is not None:
        return crd.definition_name
    if rt.group:
        return ".".join(reversed(rt.group.split("."))) + f".{rt.version}.{rt.kind}"
    return f"io.k8s.api.core.{rt.version}.{rt.kind}"


def _schema(rt: ResourceType, crd: CRDInfo | None, ref: str) -> dict:
    """The object schema as published: the CRD's, with ``metadata`` referring to ObjectMeta."""
    if crd is not None:
        schema = _int_or_string_any_of(copy.deepcopy(crd.schema))
    else:  # built-in types: their fields are not modelled; anything goes
        schema = {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                  "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"}}}
    schema.setdefault("properties", {})["metadata"] = {"allOf": [{"$ref": ref + OBJECT_META}], "default": {}}
    schema["x-kubernetes-group-version-kind"] = [_gvk(rt)]
    return schema


def _int_or_string_any_of(node):
    """``x-kubernetes-int-or-string`` nodes as the server publishes them: with
    ``anyOf: [{type: integer}, {type: string}]`` (``kubectl explain`` shows ``<IntOrString>``)."""
    if isinstance(node, list):
        return [_int_or_string_any_of(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _int_or_string_any_of(v) for k, v in node.items()}
    if out.get("x-kubernetes-int-or-string") and "anyOf" not in out:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    return out


def _v2_schema(schema):
    """OpenAPI v3 schema -> Swagger 2.0 (``allOf`` of one ``$ref`` becomes the ``$ref``)."""
    if isinstance(schema, list):
        return [_v2_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "nullable" or key == "x-kubernetes-validations":
            continue
        if key == "allOf" and len(value) == 1 and "$ref" in value[0]:
            out["$ref"] = value[0]["$ref"].replace("#/components/schemas/", "#/definitions/")
            continue
        if key == "$ref":
            out[key] = value.replace("#/components/schemas/", "#/definitions/")
        elif key in ("properties", "definitions"):
            out[key] = {k: _v2_schema(v) for k, v in value.items()}
        else:
            out[key] = _v2_schema(value)
    return out


def _parameters(names: list[str]) -> list[dict]:
    common = {
        "name": {"in": "path", "required": True, "description": "name of the resource"},
        "namespace": {"in": "path", "required": True, "description": "object name and auth scope"},
        "dryRun": {"in": "query"}, "fieldManager": {"in": "query"}, "fieldValidation": {"in": "query",
            "description": "fieldValidation instructs the server on how to handle objects in the request "
                           "containing unknown or duplicate fields. Valid values are: Ignore, Warn, Strict."},
        "force": {"in": "query", "type": "boolean"}, "labelSelector": {"in": "query"},
        "fieldSelector": {"in": "query"}, "watch": {"in": "query", "type": "boolean"},
        "resourceVersion": {"in": "query"}, "limit": {"in": "query", "type": "integer"},
        "continue": {"in": "query"}, "timeoutSeconds": {"in": "query", "type": "integer"},
        "allowWatchBookmarks": {"in": "query", "type": "boolean"}, "pretty": {"in": "query"},
    }
    out = []
    for name in names:
        spec = dict(common[name])
        typ = spec.pop("type", "string")
        out.append({"name": name, "schema": {"type": typ, "uniqueItems": True}, **spec})
    return out


def _paths(rt: ResourceType, crd: CRDInfo | None, ref: str, v2: bool) -> dict:
    """The REST paths of one type with their operations (enough for kubectl's verifiers)."""
    definition = _definition_name(rt, crd)
    base = rt.base_path()
    if rt.namespaced:
        collection, scope = f"{base}/namespaces/{{namespace}}/{rt.plural}", ["namespace"]
    else:
        collection, scope = f"{base}/{rt.plural}", []
    item = collection + "/{name}"

    def op(action: str, params: list[str], body: bool = False, *, what: str = definition,
           gvk: dict | None = None, suffix: str = "") -> dict:
        o = {"operationId": f"{action}{rt.kind}{suffix}", "x-kubernetes-action": action,
             "x-kubernetes-group-version-kind": gvk or _gvk(rt), "tags": [rt.group or "core"],
             "responses": {"200": {"description": "OK"}}}
        if v2:
            o["parameters"] = [_v2_param(p) for p in _parameters(params)]
            if body:
                o["parameters"].append({"name": "body", "in": "body", "required": True,
                                        "schema": {"$ref": f"#/definitions/{what}"}})
        else:
            o["parameters"] = _parameters(params)
            if body:
                o["requestBody"] = {"content": {"*/*": {"schema": {"$ref": ref + what}}}, "required": True}
        return o

    write = ["dryRun", "fieldManager", "fieldValidation"]
    read_list = ["labelSelector", "fieldSelector", "watch", "resourceVersion", "limit", "continue",
                 "timeoutSeconds", "allowWatchBookmarks"]
    path_params = lambda names: [_v2_param(p) for p in _parameters(names)] if v2 else _parameters(names)  # noqa: E731
    paths = {
        collection: {"get": op("list", read_list), "post": op("post", write, body=True),
                     "parameters": path_params(scope + ["pretty"])},
        item: {"get": op("get", []), "put": op("put", write, body=True),
               "patch": op("patch", write + ["force"], body=True), "delete": op("delete", ["dryRun"]),
               "parameters": path_params(["name"] + scope + ["pretty"])},
    }
    if rt.status_subresource:
        paths[item + "/status"] = {"get": op("get", []), "put": op("put", write, body=True),
                                   "patch": op("patch", write + ["force"], body=True),
                                   "parameters": path_params(["name"] + scope + ["pretty"])}
    if rt.scale is not None:
        scale = {"what": SCALE, "gvk": SCALE_GVK, "suffix": "Scale"}
        paths[item + "/scale"] = {"get": op("get", [], **scale), "put": op("put", write, body=True, **scale),
                                  "patch": op("patch", write + ["force"], body=True, **scale),
                                  "parameters": path_params(["name"] + scope + ["pretty"])}
    return paths


def _v2_param(p: dict) -> dict:
    out = {k: v for k, v in p.items() if k != "schema"}
    out["type"] = p["schema"]["type"]
    out["uniqueItems"] = True
    return out


def _list_schema(rt: ResourceType, ref: str, definition: str) -> dict:
    return {"type": "object", "required": ["items"],
            "x-kubernetes-group-version-kind": [{**_gvk(rt), "kind": rt.list_kind}],
            "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                           "items": {"type": "array", "items": {"$ref": ref + definition}},
                           "metadata": {"allOf": [{"$ref": ref + LIST_META}], "default": {}}}}


def gv_path(rt: ResourceType) -> str:
    """``apis/<group>/<version>`` or ``api/v1``: the key of the type's group-version in /openapi/v3."""
    return rt.base_path().lstrip("/")


def v3_group_version(types: list[ResourceType], crds: dict) -> dict:
    """The OpenAPI v3 document of one group-version (``/openapi/v3/apis/<group>/<version>``)."""
    ref = "#/components/schemas/"
    schemas = {OBJECT_META: copy.deepcopy(_OBJECT_META_SCHEMA), LIST_META: copy.deepcopy(_LIST_META_SCHEMA)}
    paths: dict = {}
    for rt in types:
        crd = crds.get((rt.group, rt.version, rt.plural))
        name = _definition_name(rt, crd)
        schemas[name] = _schema(rt, crd, ref)
        schemas[name + "List"] = _list_schema(rt, ref, name)
        if rt.scale is not None:
            schemas[SCALE] = copy.deepcopy(_SCALE_SCHEMA)
        paths.update(_paths(rt, crd, ref, v2=False))
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.31.0-kubefake"},
            "paths": paths, "components": {"schemas": schemas}}


def v3_root(gv_docs: dict[str, bytes]) -> dict:
    """``/openapi/v3``: one ``serverRelativeURL`` per group-version, with the hash of its document."""
    return {"paths": {gv: {"serverRelativeURL": f"/openapi/v3/{gv}?hash={content_hash(body)}"}
                      for gv, body in sorted(gv_docs.items())}}


def content_hash(body: bytes) -> str:
    """The hash kube-apiserver puts in ``serverRelativeURL`` (an uppercase hex digest of the document)."""
    return hashlib.sha512(body).hexdigest()[:128].upper()


def v2_document(types: list[ResourceType], crds: dict) -> dict:
    """``/openapi/v2`` (Swagger 2.0) for every served type."""
    ref = "#/definitions/"
    definitions = {OBJECT_META: _v2_schema(_OBJECT_META_SCHEMA), LIST_META: _LIST_META_SCHEMA}
    paths: dict = {}
    for rt in types:
        crd = crds.get((rt.group, rt.version, rt.plural))
        name = _definition_name(rt, crd)
        definitions[name] = _v2_schema(_schema(rt, crd, "#/components/schemas/"))
        definitions[name + "List"] = _v2_schema(_list_schema(rt, "#/components/schemas/", name))
        if rt.scale is not None:
            definitions[SCALE] = _v2_schema(_SCALE_SCHEMA)
        paths.update(_paths(rt, crd, ref, v2=True))
    return {"swagger": "2.0", "info": {"title": "Kubernetes", "version": "v1.31.0-kubefake"},
            "paths": paths, "definitions": definitions}


def _resource_entry(rt: ResourceType, crd: CRDInfo | None) -> dict:
    entry = {"resource": rt.plural, "responseKind": _gvk(rt), "scope": "Namespaced" if rt.namespaced else "Cluster",
             "singularResource": crd.singular if crd else rt.kind.lower(), "verbs": VERBS,
             "shortNames": list(rt.short_names)}
    if crd is not None and crd.categories:
        entry["categories"] = crd.categories
    if rt.status_subresource:
        entry["subresources"] = [{"subresource": "status", "responseKind": _gvk(rt), "verbs": ["get", "patch", "update"]}]
    if rt.scale is not None:
        entry.setdefault("subresources", []).append({"subresource": "scale", "responseKind": dict(SCALE_GVK),
                                                     "verbs": ["get", "patch", "update"]})
    return entry


def aggregated_discovery(types: list[ResourceType], crds: dict, *, legacy: bool) -> dict:
    """An ``apidiscovery.k8s.io/v2`` ``APIGroupDiscoveryList`` of the core group (``legacy``) or the others."""
    groups: dict[str, dict[str, list[ResourceType]]] = {}
    for rt in types:
        if bool(rt.group) == legacy:
            continue
        groups.setdefault(rt.group, {}).setdefault(rt.version, []).append(rt)
    items = []
    for group, versions in sorted(groups.items()):
        items.append({"metadata": {"name": group} if group else {},
                      "versions": [{"version": v, "freshness": "Current",
                                    "resources": [_resource_entry(rt, crds.get((rt.group, rt.version, rt.plural)))
                                                  for rt in sorted(rts, key=lambda t: t.plural)]}
                                   for v, rts in versions.items()]})
    return {"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items}


def dumps(doc) -> bytes:
    """Compact JSON."""
    return json.dumps(doc, separators=(",", ":")).encode()
