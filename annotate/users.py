"""``smolforge annotate users add|list|remove``: annotator accounts on the embedded Argilla server.

    smolforge annotate users add alice                          # annotator in workspace "argilla"
    smolforge annotate users add bob --role admin --workspace review
    smolforge annotate users list
    smolforge annotate users remove alice

``add`` generates the password (printed once, never logged or stored) and puts the user in the
workspace, which is created when missing. The server is the one ``smolforge annotate serve`` runs
for the home folder; the owner's key comes from ``ARGILLA_API_KEY`` or the home's generated
credentials. Argilla's own rules apply: usernames are lowercase letters, digits, ``-`` and ``_``.

    >>> check_username("alice-2"), check_role("admin")
    ('alice-2', 'admin')
    >>> check_username("Alice Smith")
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: username 'Alice Smith': use lowercase letters, digits, '-' and '_' (1-100 characters)
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from smolforge.access import generate_secret
from smolforge.errors import RecipeError, ServiceError

__all__ = ["ROLES", "check_username", "check_role", "add_user", "list_users", "remove_user", "users_command"]

ROLES = ("annotator", "admin")
USERNAME = re.compile(r"^(?!-|_)[a-z0-9\-_]{1,100}$")   # argilla_server's pattern for usernames


def check_username(name: str) -> str:
    if not USERNAME.match(name):
        raise RecipeError(f"username {name!r}: use lowercase letters, digits, '-' and '_' (1-100 characters)")
    return name


def check_role(role: str) -> str:
    if role not in ROLES:
        raise RecipeError(f"role {role!r}: expected one of {', '.join(ROLES)}")
    return role


def add_user(client: Any, username: str, *, role: str = "annotator", workspace: str = "argilla") -> str:
    """Create ``username`` with a generated password in ``workspace``; returns the password."""
    import argilla as rg

    from .push import quiet

    check_username(username)
    check_role(role)
    if quiet(lambda: client.users(username)) is not None:
        raise RecipeError(f"user '{username}' already exists; remove it first to give it a new password")
    space = quiet(lambda: client.workspaces(workspace))
    if space is None:
        space = rg.Workspace(name=workspace, client=client).create()
    password = generate_secret(12)
    user = rg.User(username=username, password=password, role=role, client=client).create()
    space.add_user(user)
    return password


def list_users(client: Any) -> list[dict]:
    """``[{"username", "role", "workspaces"}]`` of every user, sorted by name."""
    spaces = {space.name: {user.username for user in space.users} for space in client.workspaces}
    return sorted(({"username": user.username, "role": str(getattr(user.role, "value", user.role)),
                    "workspaces": sorted(name for name, members in spaces.items() if user.username in members)}
                   for user in client.users), key=lambda row: row["username"])


def remove_user(client: Any, username: str) -> None:
    from .push import quiet

    if username == "argilla":
        raise RecipeError("the owner 'argilla' cannot be removed")
    user = quiet(lambda: client.users(username))
    if user is None:
        raise RecipeError(f"no user '{username}' on this server (smolforge annotate users list)")
    user.delete()


def users_command(home: Path, words: list[str], *, role: str, workspace: str) -> int:
    """Run ``users add NAME | list | remove NAME`` against the server running for ``home``."""
    from smolforge.table import render_table

    from .server import connect, owner_api_key, running_url

    action, names = (words[0], words[1:]) if words else ("list", [])
    if action not in ("add", "list", "remove") or (action == "list") != (not names) or len(names) > 1:
        raise RecipeError("usage: smolforge annotate users add NAME [--role annotator|admin] [--workspace W] | "
                          "users list | users remove NAME")
    url = running_url(home)
    if url is None:
        raise ServiceError(f"no Argilla server runs for {home}; start it with `smolforge annotate serve`")
    client = connect(url, owner_api_key(home))
    if action == "add":
        password = add_user(client, names[0], role=role, workspace=workspace)
        print(f"added {role} '{names[0]}' to workspace '{workspace}' at {url}; password (shown only now): {password}")
    elif action == "remove":
        remove_user(client, names[0])
        print(f"removed '{names[0]}'")
    else:
        rows = [[row["username"], row["role"], ", ".join(row["workspaces"])] for row in list_users(client)]
        print(render_table(["username", "role", "workspaces"], rows))
    return 0
