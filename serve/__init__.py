"""`retr serve`'s HTTP service: FastAPI over one index folder, on the same Searcher as `retr search`.

``config`` (``ServeConfig``, the Host names served), ``generations`` (the served generation, the next one opened
and warmed on a thread of its own), ``guard`` (Host, content type, body bound, read deadline, connection cap),
``metrics`` (Prometheus text), ``app`` (the routes and the uvicorn server), ``page.html`` (the search page).
Nothing is imported here: the command imports ``retr.serve.app`` only when a server runs.
"""
