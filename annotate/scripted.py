"""Scripted annotators for the demo and the tests: real Argilla users who answer through the SDK.

A person reviews in Argilla's UI; the demo pipeline and the tests have nobody to click, so
``scripted:`` in an annotate recipe creates annotator users (``scripted-1``, ``scripted-2``, …) and
each answers every record with its own API key, exactly as the SDK would for a person.

Their judgement is a verifier: a response that states the prompt's reference answer beats one that
does not (:func:`smolforge.generation.verifiers.answer_match`: 1 exact, 0.5 right key value, 0 otherwise).
Equal scores are a ``tie`` (two responses) or a shared rank. With ``noise`` > 0 each annotator
answers something else at that rate (seeded per annotator and record), so agreement is below 1
as with people. A record whose responses are all empty is discarded.

    >>> verdict(["Nelzu lives in Omberton.", "Nelzu lives in Drummo."], "Nelzu lives in Omberton.")
    'response_1'
    >>> verdict(["", "x"], "y"), verdict(["b 3", "a 3"], "3")
    ('tie', 'tie')
    >>> verdict(["4", "7", "7 and 4"], "7")
    [{'value': 'response_1', 'rank': 2}, {'value': 'response_2', 'rank': 1}, {'value': 'response_3', 'rank': 2}]
"""
from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from smolforge.generation.verifiers import answer_match
from smolforge.errors import RecipeError, ServiceError

from .records import TIE, exact_fields

__all__ = ["verdict", "noisy", "verifier", "scripted_users", "records_to_answer", "answer_all"]

SCRIPTED_PASSWORD = "scripted-annotator"  # demo users only: they never face a person


def verdict(responses: Sequence[str], answer: str) -> Any:
    """The preference answer a verifier gives: a label for two responses, a ranking for more."""
    scores = answer_match([None] * len(responses), list(responses), answer=[answer] * len(responses))
    names = [f"response_{i}" for i in range(1, len(responses) + 1)]
    if len(responses) == 2:
        return TIE if scores[0] == scores[1] else names[scores.index(max(scores))]
    levels = sorted(set(scores), reverse=True)
    return [{"value": name, "rank": levels.index(score) + 1} for name, score in zip(names, scores)]


def noisy(value: Any, k: int, rng: random.Random) -> Any:
    """Another valid answer than ``value``: a different label, or a reshuffled ranking."""
    if k == 2:
        return rng.choice([v for v in ("response_1", "response_2", TIE) if v != value])
    ranks = list(range(1, k + 1))
    rng.shuffle(ranks)
    return [{"value": f"response_{i}", "rank": rank} for i, rank in enumerate(ranks, start=1)]


def scripted_users(url: str, owner_key: str, workspace: str, count: int) -> list[tuple[str, str]]:
    """``[(username, api_key)]`` of ``count`` annotator users in ``workspace``, created when missing."""
    import argilla as rg

    from .push import quiet
    from .server import connect

    owner = connect(url, owner_key)
    space = quiet(lambda: owner.workspaces(workspace))
    if space is None:
        raise RecipeError(f"scripted annotators: workspace '{workspace}' does not exist (push first)")
    out = []
    for i in range(1, count + 1):
        name = f"scripted-{i}"
        user = quiet(lambda: owner.users(name))
        if user is None:
            user = rg.User(username=name, password=SCRIPTED_PASSWORD, role="annotator", client=owner).create()
        if name not in {u.username for u in space.users}:
            space.add_user(user)
        # the SDK's user model drops the key; the v1 route (through the SDK's own client) has it
        reply = owner.api.http_client.get(f"/api/v1/users/{user.id}")
        if reply.status_code != 200 or "api_key" not in reply.json():
            raise ServiceError(f"scripted annotators: cannot read {name}'s API key (HTTP {reply.status_code})")
        out.append((name, reply.json()["api_key"]))
    return out


def records_to_answer(url: str, owner_key: str, dataset_name: str, workspace: str) -> list[dict]:
    """``[{"server_id", "id", "responses", "answered_by"}]`` of every record (read with the owner's key:
    annotators may answer records but not list a dataset through the SDK)."""
    from .push import open_dataset

    dataset = open_dataset(url, owner_key, dataset_name, workspace)
    out = []
    for record in dataset.records(with_responses=True):
        fields = exact_fields({name: value for name, value in record.fields.items() if str(name).startswith("response_")},
                              record.metadata)       # what a person reads on the page
        out.append({"server_id": record._server_id, "id": record.id,
                    "responses": [fields[f"response_{i}"] for i in range(1, len(fields) + 1)],
                    "answered_by": {str(r.user_id) for r in record.responses}})
    return out


Decide = Callable[[str, Mapping], "tuple[Any, str] | None"]


def verifier(answers: Mapping[str, str], noise: float = 0.0, seed: int = 0) -> Decide:
    """The scripted judgement: ``decide(username, record) -> (value, status)`` or None to skip.

    ``answers`` maps record id → reference answer; records without one are skipped.

    >>> decide = verifier({"r1": "7"})
    >>> decide("ann", {"id": "r1", "responses": ["It is 7.", "It is 8."]}), decide("ann", {"id": "r2"})
    (('response_1', 'submitted'), None)
    """
    def decide(username: str, record: Mapping) -> tuple[Any, str] | None:
        if record["id"] not in answers:
            return None
        responses = record["responses"]
        rng = random.Random(f"{seed}:{username}:{record['id']}")
        value = verdict(responses, answers[record["id"]])
        if noise > 0 and rng.random() < noise:
            value = noisy(value, len(responses), rng)
        return value, ("discarded" if not any(text.strip() for text in responses) else "submitted")
    return decide


def answer_all(url: str, api_key: str, records: Sequence[Mapping], decide: Decide,
               question: str = "preference") -> dict:
    """Answer ``records`` (:func:`records_to_answer`) as the user behind ``api_key`` through the SDK's
    record-response call (the request the UI makes on submit). ``decide(username, record)`` gives
    ``(value, status)``, or None to leave a record alone; records this user answered are skipped.
    Returns ``{"submitted", "discarded", "draft", "skipped"}``."""
    from argilla._models import UserResponseModel

    from .server import connect

    client = connect(url, api_key)
    me = client.me
    counts = {"submitted": 0, "discarded": 0, "draft": 0, "skipped": 0}
    for record in records:
        answer = None if str(me.id) in record["answered_by"] else decide(me.username, record)
        if answer is None:
            counts["skipped"] += 1
            continue
        value, status = answer
        client.api.records.create_record_response(record["server_id"], UserResponseModel(
            values={question: {"value": value}}, status=status, user_id=me.id))
        counts[status] += 1
    return counts
