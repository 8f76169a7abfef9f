"""Write docs/reference/openapi.json: the OpenAPI schema of `retr serve`'s FastAPI app (serve/app.py).

    python docs/_gen/openapi.py INDEX_DIR      # any index folder: the schema does not depend on which

The app describes itself with the folder it serves; that line is replaced by a generic one, so the file is the same
whichever index made it. tests/test_docs.py fails when the file differs from what the app says now.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "reference" / "openapi.json"
DESCRIPTION = "Search one retr index folder (`retr serve DIR`)."


def fastapi_app(service):
    """The FastAPI app inside the ASGI middleware `create_app` wraps it in (each layer keeps it as ``app``)."""
    app = service
    while not hasattr(app, "openapi"):
        app = app.app
    return app


def schema(index_dir: str | Path, cfg=None) -> dict:
    from retr.serve.app import create_app
    from retr.serve.config import ServeConfig

    spec = fastapi_app(create_app(index_dir, cfg or ServeConfig())).openapi()
    spec["info"]["description"] = DESCRIPTION
    return spec


def render(spec: dict) -> str:
    return json.dumps(spec, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    OUT.write_text(render(schema(argv[0])), encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
