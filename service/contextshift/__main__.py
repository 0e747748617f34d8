"""`contextshift` and `python -m contextshift`: the command line, or, when the extra a command
needs is not installed (the library alone installs light), which one to install."""

from __future__ import annotations

import sys

# A missing module's top-level name, and the extra that installs it.
EXTRAS = {
    "rich": "cli",
    "grpc": "cli",
    "grpc_status": "cli",
    "google": "cli",
    "grpc_health": "server",
    "grpc_reflection": "server",
    "starlette": "server",
    "uvicorn": "server",
    "jsonschema": "server",
    "prometheus_client": "server",
    "lz4": "server",
    "psycopg": "postgres",
    "psycopg_pool": "postgres",
    "httpx": "llm",
    "numpy": "embeddings",
}


def main() -> int:
    try:
        from contextshift.cli import main as run

        return run()
    except ModuleNotFoundError as e:
        missing = (e.name or "").partition(".")[0]
        if missing not in EXTRAS:
            raise
        extra = EXTRAS[missing]
        print(f"error: this needs {missing}: python3 -m pip install 'contextshift[{extra}]'", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
