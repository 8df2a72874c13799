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

DEMO_PASSWORD = "12345678"   # smolforge.annotate.server.DEMO_PASSWORD (this file runs without smolforge)


def register_engine() -> None:
    if os.environ.get("ARGILLA_SEARCH_ENGINE", "").strip().lower() != "smolforge-sql":
        return
    path = Path(__file__).with_name("search_engine.py")
    spec = importlib.util.spec_from_file_location("smolforge_argilla_search_engine", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)


def prepare() -> None:
    """Migrate the database to head, then create the owner ``argilla`` or give it the API key and
    password from the environment (``SMOLFORGE_ARGILLA_OWNER_KEY``, ``SMOLFORGE_ARGILLA_OWNER_PASSWORD``).
    With ``SMOLFORGE_ARGILLA_NETWORK=1`` (a non-loopback bind) a user still on the demo key or
    password stops the start (exit 3, the usernames on stderr)."""
    import asyncio
    from argilla_server.cli.database.migrate import migrate_db
    from argilla_server.cli.database.users.create_default import _create_default
    migrate_db(revision="head")
    key, password = os.environ.pop("SMOLFORGE_ARGILLA_OWNER_KEY"), os.environ.pop("SMOLFORGE_ARGILLA_OWNER_PASSWORD")
    network = os.environ.pop("SMOLFORGE_ARGILLA_NETWORK", "") == "1"
    asyncio.run(_owner(_create_default, key, password, network))   # one event loop: asyncpg's pool is bound to it


async def _owner(create_default, key: str, password: str, network: bool) -> None:
    from argilla_server.database import async_engine

    try:
        await create_default(key, password, quiet=True)
        await _apply_owner(key, password, network=network)
    finally:
        await async_engine.dispose()   # the server's own event loop opens fresh connections


async def _apply_owner(key: str, password: str, *, network: bool) -> None:
    from argilla_server.constants import DEFAULT_API_KEY, DEFAULT_PASSWORD, DEFAULT_USERNAME
    from argilla_server.contexts import accounts
    from argilla_server.database import AsyncSessionLocal

    async with AsyncSessionLocal() as session:
        owner = await accounts.get_user_by_username(session, DEFAULT_USERNAME)
        if owner.api_key != key or not accounts.verify_password(password, owner.password_hash):
            await owner.update(session, api_key=key, password_hash=accounts.hash_password(password))
        if network:
            demo_passwords = (DEFAULT_PASSWORD, DEMO_PASSWORD)     # Argilla's own default is "1234"
            weak = [user.username for user in await accounts.list_users(session)
                    if user.api_key == DEFAULT_API_KEY
                    or any(accounts.verify_password(p, user.password_hash) for p in demo_passwords)]
            if weak:
                print(f"refusing to serve on a network address: users {', '.join(sorted(weak))} still have the demo "
                      "API key or password; remove them (smolforge annotate users remove NAME)", file=sys.stderr)
                sys.exit(3)


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
