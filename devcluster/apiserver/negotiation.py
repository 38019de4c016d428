"""Which representation a request's ``Accept`` header asks for, as kube-apiserver negotiates it.

Besides plain JSON, the server answers ``meta.k8s.io/v1`` transformations of an object or a
list (API concepts, "Receiving resources as Tables" and "Receiving resources as
PartialObjectMetadata"): the media type carries ``as=<Kind>;g=meta.k8s.io;v=v1``.  The media
ranges of the header are tried in order and the first one the server can produce wins, so a
client may offer a fallback (``...;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json``).
The fake produces JSON only: ranges of other encodings (protobuf, YAML, CBOR) are skipped.

Upstream then refuses (406 Not Acceptable) a form that does not fit what the request returns:
``PartialObjectMetadataList`` for a single object, ``PartialObjectMetadata`` for a list
(``k8s.io/apiserver/pkg/endpoints/handlers/response.go``); :func:`check_fits` does the same.
"""

from __future__ import annotations

from devcluster.apiserver.errors import ApiError

TABLE = "Table"
PARTIAL = "PartialObjectMetadata"
PARTIAL_LIST = "PartialObjectMetadataList"
_FORMS = (TABLE, PARTIAL, PARTIAL_LIST)


def requested_form(accept: str | None) -> str | None:
    """Return the form the first producible media range asks for: ``"Table"``,
    ``"PartialObjectMetadata"``, ``"PartialObjectMetadataList"``, or ``None`` for the plain object.

    A range with ``as=`` needs ``g=meta.k8s.io`` and ``v=v1`` and a known kind, else it is
    skipped (as a server skips what it cannot produce).  No header, or nothing producible:
    ``None`` (the fake then answers plain JSON rather than 406).
    """
    for part in (accept or "").split(","):
        pieces = [p.strip() for p in part.split(";")]
        if pieces[0] not in ("application/json", "application/*", "*/*"):
            continue
        params = {k.strip(): v.strip() for k, _, v in (p.partition("=") for p in pieces[1:]) if k.strip()}
        form = params.get("as")
        if form is None:
            return None
        if form in _FORMS and params.get("g") == "meta.k8s.io" and params.get("v") == "v1":
            return form
    return None


def check_fits(form: str | None, *, is_list: bool) -> None:
    """Raise 406 Not Acceptable when ``form`` cannot represent the answer (a list or one object).

    Raises:
        ApiError: 406, worded like upstream.
    """
    if form == PARTIAL and is_list:
        raise ApiError.not_acceptable("you requested PartialObjectMetadata, but the requested object is a list "
                                      "(*unstructured.UnstructuredList)")
    if form == PARTIAL_LIST and not is_list:
        raise ApiError.not_acceptable("you requested PartialObjectMetadataList, but the requested object is not a "
                                      "list (*unstructured.Unstructured)")


def partial(obj: dict) -> dict:
    """The ``PartialObjectMetadata`` of ``obj``: its whole ``metadata`` and nothing else."""
    return {"kind": PARTIAL, "apiVersion": "meta.k8s.io/v1", "metadata": obj.get("metadata", {})}
