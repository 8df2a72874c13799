"""Entry point run with the argilla-server venv's python: registers the search engine, then serves.

    .argilla-venv/bin/python annotate/argilla_launch.py server --port 6900   # prepare, then uvicorn on 127.0.0.1
    .argilla-venv/bin/python annotate/argilla_launch.py worker               # rq worker (background jobs)
    .argilla-venv/bin/python annotate/argilla_launch.py prepare              # migrate + default owner

Started by :class:`smolforge.annotate.server.ArgillaServer`; the environment (``ARGILLA_HOME_PATH``,
``ARGILLA_REDIS_URL``, ``ARGILLA_SEARCH_ENGINE``…) comes from it. The smolforge-sql engine is
imported only when ``ARGILLA_SEARCH_ENGINE`` asks for it.
"""
import argparse
import importlib.util
import os
import sys
from pathlib import Path


def register_engine() -> None:
    if os.environ.get("ARGILLA_SEARCH_ENGINE", "").strip().lower() != "smolforge-sql":
        return
    path = Path(__file__).with_name("search_engine.py")
    spec = importlib.util.spec_from_file_location("smolforge_argilla_search_engine", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)


def prepare() -> None:
    """Migrate the database to head, then create the owner ``argilla`` (API key and password from the
    environment: ``SMOLFORGE_ARGILLA_OWNER_KEY``, ``SMOLFORGE_ARGILLA_OWNER_PASSWORD``) if missing."""
    import asyncio
    from argilla_server.cli.database.migrate import migrate_db
    from argilla_server.cli.database.users.create_default import _create_default
    migrate_db(revision="head")
    asyncio.run(_create_default(os.environ.pop("SMOLFORGE_ARGILLA_OWNER_KEY"),
                                os.environ.pop("SMOLFORGE_ARGILLA_OWNER_PASSWORD"), quiet=True))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["server", "worker", "prepare"])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=6900)
    args = parser.parse_args()
    register_engine()
    if args.what == "prepare":
        prepare()
    elif args.what == "server":
        prepare()  # in the same process: one import of argilla_server instead of two (≈3 s)
        import uvicorn
        uvicorn.run("argilla_server._app:app", host=args.host, port=args.port, log_level="info", access_log=False)
    else:
        from rq import Worker
        from argilla_server.jobs.queues import DEFAULT_QUEUE, HIGH_QUEUE, REDIS_CONNECTION
        Worker([HIGH_QUEUE, DEFAULT_QUEUE], connection=REDIS_CONNECTION).work()


if __name__ == "__main__":
    main()
