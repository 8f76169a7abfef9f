"""The HTTP form of a search request: the JSON body (and the ``GET /search`` parameters) validated against this
server's bounds, then built and checked as ``retr.retrieval.request.SearchRequest``, the value every door
searches with."""

from __future__ import annotations

import json

from pydantic import BaseModel, ValidationError

from retr.retrieval.errors import RetrError
from retr.retrieval.options import http_model
from retr.retrieval.request import MAX_K, SearchRequest
from retr.serve.config import ServeConfig


def request_model(cfg: ServeConfig) -> type[BaseModel]:
    """The request model of a server with ``cfg``'s bounds (and the OpenAPI schema's ``SearchRequest``): made from
    the options' declarations (``retr.retrieval.options.http_model``), this server's settings named as defaults."""
    return http_model(min(cfg.max_k, MAX_K), cfg.max_query_chars, cfg.max_batch,
                      {"fusion": cfg.pipeline.fusion, "fusion_depth": cfg.pipeline.fusion_depth})


def search_request(body, cfg: ServeConfig) -> SearchRequest:
    """The ``SearchRequest`` of a validated body (``rerank``: this server's cross-encoder)."""
    reranks = body.rerank or body.mode.reranks
    options = {**body.options(), "rerank": cfg.rerank.model if reranks else None}
    if body.query is not None:
        return SearchRequest.one(body.query, **options)
    return SearchRequest.batch(body.queries, **options)


def from_parameters(model: type[BaseModel], items: list[tuple[str, str]]):
    """The body of ``GET /search``: ``q`` (the query), the other fields by name, ``filter=FIELD=VALUE``
    (repeatable); checked as the POST body is."""
    from fastapi.exceptions import RequestValidationError

    fields: dict = {}
    for name, value in items:
        key = "query" if name == "q" else name
        if key == "filter":
            field_name, eq, wanted = value.partition("=")
            if not eq or not field_name.strip():
                raise RetrError(f"filter {value!r}: give FIELD=VALUE")
            fields.setdefault("filter", {})[field_name.strip()] = wanted
        elif key in fields or key in ("query", "queries") and name != "q":
            raise RetrError(f"give {name!r} once" if key in fields else "give the query as q=...")
        else:
            fields[key] = value
    try:
        return model.model_validate_strings(fields)
    except ValidationError as e:
        raise RequestValidationError(e.errors()) from None


def validation_message(errors) -> str:
    """A request model's first validation error as one line: ``field: what is wrong``."""
    first = errors[0] if errors else {}
    where = ".".join(_field(p) for p in first.get("loc", ()) if p != "body")
    return f"{where + ': ' if where else ''}{first.get('msg', 'invalid request')}"


def _field(part) -> str:
    """A field name or index as a message shows it: a key that is not a plain name (a client's filter key may hold
    anything, newlines included) quoted and escaped, and cut at 40 characters."""
    if isinstance(part, str) and not part.isidentifier():
        part = json.dumps(part[:40])
    return str(part)
