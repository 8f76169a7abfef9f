"""The HTTP form of a search request: the JSON body (and the ``GET /search`` parameters) validated against this
server's bounds, then built and checked as ``retr.retrieval.request.SearchRequest``, the value every door
searches with."""

# no `from __future__ import annotations`: pydantic and FastAPI read the model's fields (a class made per server,
# with its bounds) from evaluated annotations
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from retr.retrieval.errors import RetrError
from retr.retrieval.fusion import FUSIONS
from retr.retrieval.pipeline import parse
from retr.retrieval.request import DEFAULT_K, DEFAULT_MODE, MAX_K, SearchRequest
from retr.serve.config import ServeConfig


def request_model(cfg: ServeConfig) -> type[BaseModel]:
    """The request model of a server with ``cfg``'s bounds (and the OpenAPI schema's ``SearchRequest``)."""
    max_k = min(cfg.max_k, MAX_K)

    class SearchBody(BaseModel):
        """The HTTP form of ``retr.retrieval.request.SearchRequest`` (its defaults; this server's bounds), for
        validation of the JSON and the OpenAPI schema; every request is then built and checked as that value."""
        model_config = ConfigDict(extra="forbid", strict=True, title="SearchRequest")
        query: str | None = Field(None, min_length=1, max_length=cfg.max_query_chars)
        queries: list[str] | None = Field(None, min_length=1, max_length=cfg.max_batch)
        k: int = Field(DEFAULT_K, ge=1, le=max_k)
        mode: str = Field(DEFAULT_MODE, min_length=1, max_length=400, validate_default=True, description="a pipeline: bm25, dense, hybrid, "
                          "or an expression such as bm25+rm3 or fuse(bm25,dense)+rerank (+rerank: this server's "
                          "cross-encoder)")
        fusion: Literal[tuple(FUSIONS)] | None = Field(None, description=f"hybrid's fusion (default: "
                                                                          f"{cfg.pipeline.fusion})")
        fusion_depth: int | None = Field(None, ge=1, le=max_k, description=f"hybrid: hits each of BM25 and dense "
                                         f"hands to the fusion, whose scores set its normalisation (default: "
                                         f"{cfg.pipeline.fusion_depth}; each list still searched to k)")
        rerank: bool = False
        filter: dict[str, str | int | float | bool] | None = Field(None, max_length=16)

        @field_validator("mode", mode="after")
        @classmethod
        def pipeline(cls, text: str):
            try:
                return parse(text)  # parsed once, here: the value travels on
            except RetrError as e:
                raise ValueError(str(e)) from None

        @model_validator(mode="after")
        def one_of(self):
            if (self.query is None) == (self.queries is None):
                raise ValueError("give either 'query' or 'queries'")
            for q in self.queries or ():
                if len(q) > cfg.max_query_chars:
                    raise ValueError(f"a query is longer than {cfg.max_query_chars} characters")
            return self

    return SearchBody


def search_request(body, cfg: ServeConfig) -> SearchRequest:
    """The ``SearchRequest`` of a validated body (``rerank``: this server's cross-encoder)."""
    reranks = body.rerank or body.mode.reranks
    options = {"k": body.k, "mode": body.mode, "fusion": body.fusion, "fusion_depth": body.fusion_depth,
               "filter": body.filter, "rerank": cfg.rerank.model if reranks else None}
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
