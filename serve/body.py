"""The HTTP form of a search request: the JSON body (and the ``GET /search`` parameters) validated against this
server's bounds, then built and checked as ``retr.retrieval.request.SearchRequest``, the value every door
searches with."""

from __future__ import annotations

import json
from collections.abc import Mapping

from pydantic import BaseModel, ValidationError

from retr.retrieval.errors import RetrError
from retr.retrieval.options import MAX_K, at
from retr.retrieval.request import SearchRequest
from retr.serve.config import ServeConfig


def http_model(max_k: int = MAX_K, max_query_chars: int = 100_000, max_batch: int = 64,
               inherited: Mapping[str, object] | None = None):
    """The pydantic model of a search request over HTTP (`retr serve`'s JSON body and ``GET /search``'s
    parameters, and the OpenAPI schema): ``query`` or ``queries``, then every option the ``http`` door takes,
    with this server's bounds (``max_k`` caps every count of hits) and its own settings (``inherited``) named as
    the defaults of the options left None. The mode is parsed once, here: the value travels on."""
    from typing import Literal

    from pydantic import ConfigDict, Field, create_model, field_validator, model_validator

    from retr.retrieval.pipeline import parse

    class Body(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True, title="SearchRequest")

        @field_validator("mode", mode="after", check_fields=False)
        @classmethod
        def pipeline(cls, text: str):
            try:
                return parse(text)
            except RetrError as e:
                raise ValueError(str(e)) from None

        @model_validator(mode="after")
        def one_of(self):
            if (self.query is None) == (self.queries is None):
                raise ValueError("give either 'query' or 'queries'")
            for q in self.queries or ():
                if len(q) > max_query_chars:
                    raise ValueError(f"a query is longer than {max_query_chars} characters")
            return self

        def options(self) -> dict:
            """The request's options as ``SearchRequest`` takes them (``rerank``: as sent, on or off)."""
            return {o.name: getattr(self, o.name) for o in at("http")}

    fields: dict = {"query": (str | None, Field(None, min_length=1, max_length=max_query_chars)),
                    "queries": (list[str] | None, Field(None, min_length=1, max_length=max_batch))}
    for o in at("http"):
        kind = o.http or o.kind
        default = False if kind is bool else o.default
        if o.choices:
            kind = Literal[o.allowed()]
        elif kind is dict:
            kind = dict[str, str | int | float | bool]
        high = min(o.high, max_k) if o.kind is int and o.high == MAX_K else o.high
        bounds = {"ge": o.low, "le": high} if o.kind is int else {"min_length": o.low, "max_length": high}
        mine = (inherited or {}).get(o.name)
        description = o.help + (f" (default: this server's, {mine})" if mine is not None else "")
        fields[o.name] = (kind | None if default is None else kind,
                          Field(default, description=description, validate_default=o.name == "mode",
                                **{k: v for k, v in bounds.items() if v is not None and kind is not bool}))
    return create_model("SearchBody", __base__=Body, __doc__="A search request: one query (``query``) or a batch "
                        "(``queries``) and its options, as ``retr.SearchRequest`` takes them.", **fields)


def request_model(cfg: ServeConfig) -> type[BaseModel]:
    """The request model of a server with ``cfg``'s bounds (and the OpenAPI schema's ``SearchRequest``): made from
    the options' declarations (``http_model``), this server's settings named as defaults."""
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
