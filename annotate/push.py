"""Create or extend an Argilla review dataset and log records into it (stable ids: no duplicates).

    client = connect(url, api_key)
    schema = review_schema(2, sampling={"temperature": 0.8}, min_submitted=2)
    items = [build_record(prompt, [a, b], ["sft-demo", "dpo-demo"], {"temperature": 0.8}), ...]
    summary = push_records(client, "review-demo", "argilla", schema, items)
    # {"dataset": "review-demo", "workspace": "argilla", "records": 64, "new": 64, "updated": 0, ...}

A dataset that exists already must hold the same fields, questions and metadata
(:func:`smolforge.annotate.records.check_schema`: a mismatch is a RecipeError naming what differs, and
nothing is logged); a changed guideline text or number of annotators per record is applied to
it. Records are logged in batches with their stable ids, so an item pushed again updates its
record (its submitted responses are kept) instead of adding a second one.
"""
from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from smolforge.errors import RecipeError, ServiceError

from .records import build_settings, check_schema, schema_of, to_record

log = logging.getLogger(__name__)

__all__ = ["MAX_CHARS", "quiet", "find_dataset", "open_dataset", "ensure_dataset", "check_size", "push_records"]

MAX_CHARS = 200_000    # per field: far beyond what a reviewer reads; a longer one is a runaway generation


def check_size(item: Mapping, number: int, max_chars: int = MAX_CHARS) -> None:
    """A RecipeError when a field of ``item`` (the ``number``-th pushed) is longer than ``max_chars``.

    >>> check_size({"id": "ab" * 32, "fields": {"prompt": "Hi", "response_1": "x" * 12}}, 3, max_chars=10)
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: push: record 3 (abababababab…, prompt 'Hi'): response_1 has 12 characters, more than max_chars=10; lower sampling.max_new_tokens, or raise max_chars in the recipe to review it anyway
    """
    for field_name, value in item["fields"].items():
        size = len(value) if isinstance(value, str) else sum(len(str(m.get("content", ""))) for m in value)
        if size > max_chars:
            prompt = item["fields"].get("prompt")
            shown = prompt if isinstance(prompt, str) else (prompt[-1].get("content", "") if prompt else "")
            raise RecipeError(f"push: record {number} ({item['id'][:12]}…, prompt {shown[:60]!r}): {field_name} has "
                              f"{size:,} characters, more than max_chars={max_chars:,}; lower "
                              "sampling.max_new_tokens, or raise max_chars in the recipe to review it anyway")


def quiet(call: Callable[[], Any]) -> Any:
    """The SDK warns (rather than returns quietly) when a lookup finds nothing."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return call()


def find_dataset(client: Any, name: str, workspace: str) -> Any:
    """The dataset ``name`` in ``workspace``, or None."""
    if quiet(lambda: client.workspaces(workspace)) is None:
        return None
    return quiet(lambda: client.datasets(name=name, workspace=workspace))


def open_dataset(url: str, api_key: str, name: str, workspace: str) -> Any:
    """The dataset ``name`` at ``url``; a RecipeError that says to push first when it does not exist."""
    from .server import connect

    dataset = find_dataset(connect(url, api_key), name, workspace)
    if dataset is None:
        raise RecipeError(f"no dataset '{name}' in workspace '{workspace}' at {url}; push first")
    return dataset


def ensure_dataset(client: Any, name: str, workspace: str, schema: Mapping) -> tuple[Any, bool]:
    """``(dataset, created)``: the existing dataset checked against ``schema``, or a new one."""
    import argilla as rg

    existing = find_dataset(client, name, workspace)
    if existing is not None:
        changed = check_schema(schema_of(existing.settings), schema)
        if changed:
            if "guidelines" in changed:
                existing.settings.guidelines = schema["guidelines"]
            if "distribution" in changed:
                existing.settings.distribution = rg.TaskDistribution(
                    min_submitted=schema["distribution"]["min_submitted"])
            existing.update()
            log.info("push: dataset %s/%s: updated %s", workspace, name, " and ".join(changed))
        return existing, False
    if quiet(lambda: client.workspaces(workspace)) is None:
        rg.Workspace(name=workspace, client=client).create()
        client.workspaces(workspace).add_user(client.me)
    dataset = rg.Dataset(name=name, workspace=workspace, settings=build_settings(schema), client=client)
    return dataset.create(), True


def push_records(client: Any, name: str, workspace: str, schema: Mapping, items: Sequence[Mapping],
                 batch_size: int = 256, max_chars: int = MAX_CHARS) -> dict:
    """Log ``items`` (:func:`smolforge.annotate.records.build_record` dicts) into the dataset; a summary dict.

    A field longer than ``max_chars`` characters (a runaway generation) is a RecipeError naming the
    record, its field and its length, raised before anything is logged.
    """
    ids = [item["id"] for item in items]
    if len(set(ids)) != len(ids):
        raise RecipeError("push: two items share a record id (the same prompt, runs and sampling twice)")
    for number, item in enumerate(items, start=1):
        missing = set(schema["fields"]) - set(item["fields"])
        if missing:
            raise RecipeError(f"push: record {item['id'][:12]}… lacks field(s) {', '.join(sorted(missing))}")
        check_size(item, number, max_chars)
    started = time.perf_counter()
    dataset, created = ensure_dataset(client, name, workspace, schema)
    before = 0 if created else int(dataset.progress()["total"])
    try:
        dataset.records.log([to_record(item) for item in items], batch_size=max(1, min(batch_size, len(items))))
    except Exception as exc:  # the SDK wraps HTTP failures in its own exception types
        raise ServiceError(f"push: logging {len(items)} records to {workspace}/{name} failed: {exc}") from None
    total = int(dataset.progress()["total"])
    seconds = time.perf_counter() - started
    return {"dataset": name, "workspace": workspace, "created": created, "records": len(items),
            "new": total - before, "updated": len(items) - (total - before), "total": total,
            "seconds": round(seconds, 2), "records_per_s": round(len(items) / seconds, 1) if seconds else None}
