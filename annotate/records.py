"""What a push sends to Argilla: the dataset schema, its SDK settings, and records with stable ids.

The schema is a plain dict (so it can be compared, stored and tested without a server):

- fields: ``prompt`` (``text``, or ``chat`` when prompts are message lists) and ``response_1..k``;
- questions: ``preference`` — a label question ``response_1 | response_2 | tie`` for two
  responses, a ranking of ``response_1..k`` for more — plus optional ``rating`` (1-5, the best
  response's quality) and ``comment`` (free text), both optional to answer;
- metadata: ``run_1..k`` (the run behind each response, hidden from annotators) and one property
  per sampling setting (float, integer or terms by the value's type);
- guidelines and the task distribution (``min_submitted`` annotators per record).

Record ids are ``sha256`` of the prompt, the run ids and the sampling settings: pushing the same
items again updates the same records instead of adding duplicates. Responses are placed in an
order derived from that id, so the first response is not always the same run's (position bias).

What a record says is what the reviewer sees, as text. Argilla 2.8's UI puts a text field into the
page as HTML (``innerHTML``; text that looks like an HTML element even goes into an iframe whose
scripts run), so model output such as ``<img src=x onerror=...>`` would run in the reviewer's
session. :func:`to_record` therefore sends every prompt and response HTML-escaped (``&``, ``<``,
``>``): the page shows the characters, markup included, and runs none of it. Text that UTF-8
cannot carry (lone UTF-16 surrogates, e.g. from a JSON file's ``"\\ud800"``) is shown with U+FFFD
in their place and travels exactly in the record's ``smolforge_raw`` metadata (ASCII JSON).
:func:`exact_fields` undoes both, so a pull gives back each text exactly as it was pushed.

    >>> schema = review_schema(2, sampling={"temperature": 0.7, "max_new_tokens": 64})
    >>> schema["questions"]["preference"]
    {'type': 'label_selection', 'options': ['response_1', 'response_2', 'tie'], 'required': True}
    >>> item = build_record("Name a colour.", ["red", "blue"], ["sft-a", "dpo-b"], {"temperature": 0.7})
    >>> item["id"] == record_id("Name a colour.", ["sft-a", "dpo-b"], {"temperature": 0.7})
    True
    >>> sorted(item["fields"].values()) == sorted(["Name a colour.", "red", "blue"])
    True
    >>> check_schema(schema, review_schema(3, sampling={"temperature": 0.7, "max_new_tokens": 64}))
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: schema mismatch on re-push: field 'response_3' is missing from the existing dataset but the push needs it (push to a new dataset name, or delete the old one)
"""
from __future__ import annotations

import hashlib
import html
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from smolforge.errors import RecipeError

__all__ = ["GUIDELINES", "LABEL_TEXT", "RATING_VALUES", "RAW_METADATA", "record_id", "response_order",
           "review_schema", "build_record", "display_fields", "exact_fields", "schema_of", "check_schema", "build_settings",
           "to_record", "Prompt"]

Prompt = str | list[dict]  # text, or chat messages [{"role", "content"}, ...]
TIE = "tie"
RAW_METADATA = "smolforge_raw"   # {field: exact value} (ASCII JSON) of fields that UTF-8 cannot carry
_SURROGATE = re.compile("[\ud800-\udfff]")
RATING_VALUES = [1, 2, 3, 4, 5]
LABEL_TEXT = {"response_1": "Response 1 is better", "response_2": "Response 2 is better",
              TIE: "Tie: equally good or equally bad"}
GUIDELINES = """\
Read the prompt, then the responses. Judge which response a careful user would rather get:
correct first, then helpful and to the point, then safe and polite. Ignore small formatting
differences. Choose **tie** only when neither is better (both equally good or both equally bad).
With more than two responses, rank them from best (1) to worst; equal responses may share a rank.
Use *discard* for records you cannot judge (broken prompt, unreadable output); do not guess.
"""


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def record_id(prompt: Prompt, run_ids: Sequence[str], sampling: Mapping[str, Any]) -> str:
    """sha256 (hex) of prompt, run ids (in order) and sampling settings (key order ignored).

    >>> a = record_id("hi", ["r1", "r2"], {"temperature": 0.7, "top_p": 1.0})
    >>> a == record_id("hi", ["r1", "r2"], {"top_p": 1.0, "temperature": 0.7}), len(a)
    (True, 64)
    >>> a == record_id("hi", ["r1", "r2"], {"temperature": 0.8, "top_p": 1.0})
    False
    """
    payload = _canonical({"prompt": prompt, "runs": list(run_ids), "sampling": dict(sampling)})
    return hashlib.sha256(payload.encode("utf-8", "surrogatepass")).hexdigest()


def response_order(rid: str, k: int) -> list[int]:
    """A permutation of ``range(k)`` fixed by the record id: slot ``j`` shows response ``order[j]``.

    >>> response_order("abc", 3) == response_order("abc", 3), sorted(response_order("abc", 3))
    (True, [0, 1, 2])
    """
    return sorted(range(k), key=lambda i: hashlib.sha256(f"{rid}:{i}".encode()).hexdigest())


def _metadata_type(key: str, value: Any) -> str:
    if isinstance(value, bool) or isinstance(value, str):
        return "terms"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "float"
    raise RecipeError(f"sampling setting '{key}' is {type(value).__name__}; metadata takes numbers, "
                      "strings and booleans")


def review_schema(k: int, *, conversational: bool = False, rating: bool = False, comment: bool = True,
                  guidelines: str = GUIDELINES, min_submitted: int = 1,
                  sampling: Mapping[str, Any] | None = None) -> dict:
    """The dataset schema a push of ``k`` responses per prompt needs (a plain, comparable dict).

    >>> s = review_schema(3, conversational=True, rating=True, min_submitted=2)
    >>> s["fields"]["prompt"], s["questions"]["preference"]["type"], s["distribution"]
    ({'type': 'chat'}, 'ranking', {'strategy': 'overlap', 'min_submitted': 2})
    """
    if k < 2:
        raise RecipeError(f"a review needs at least 2 responses per prompt to compare, got k={k}")
    if min_submitted < 1:
        raise RecipeError(f"annotators (min_submitted) must be at least 1, got {min_submitted}")
    names = [f"response_{i}" for i in range(1, k + 1)]
    fields = {"prompt": {"type": "chat" if conversational else "text"}} | {n: {"type": "text"} for n in names}
    if k == 2:
        preference = {"type": "label_selection", "options": names + [TIE], "required": True}
    else:
        preference = {"type": "ranking", "options": names, "required": True}
    questions = {"preference": preference}
    if rating:
        questions["rating"] = {"type": "rating", "options": list(RATING_VALUES), "required": False}
    if comment:
        questions["comment"] = {"type": "text", "required": False}
    metadata = {f"run_{i}": {"type": "terms"} for i in range(1, k + 1)}
    for key, value in sorted((sampling or {}).items()):
        metadata[key] = {"type": _metadata_type(key, value)}
    return {"fields": fields, "questions": questions, "metadata": metadata, "guidelines": guidelines.strip(),
            "distribution": {"strategy": "overlap", "min_submitted": min_submitted}}


def build_record(prompt: Prompt, responses: Sequence[str], run_ids: Sequence[str],
                 sampling: Mapping[str, Any]) -> dict:
    """``{"id", "fields", "metadata"}`` of one record; ``run_ids[i]`` produced ``responses[i]``.

    >>> r = build_record([{"role": "user", "content": "hi"}], ["a", "b"], ["x", "y"], {"seed": 0})
    >>> {r["fields"][f"response_{j}"]: r["metadata"][f"run_{j}"] for j in (1, 2)} == {"a": "x", "b": "y"}
    True
    """
    if len(responses) != len(run_ids):
        raise ValueError(f"{len(responses)} responses but {len(run_ids)} run ids")
    rid = record_id(prompt, run_ids, sampling)
    fields: dict[str, Any] = {"prompt": prompt}
    metadata: dict[str, Any] = {}
    for slot, source in enumerate(response_order(rid, len(responses)), start=1):
        fields[f"response_{slot}"] = responses[source]
        metadata[f"run_{slot}"] = run_ids[source]
    metadata.update({key: sampling[key] for key in sorted(sampling)})
    return {"id": rid, "fields": fields, "metadata": metadata}


def _has_surrogates(value: Any) -> bool:
    return _SURROGATE.search(json.dumps(value, ensure_ascii=False)) is not None   # dumps leaves them as they are


def _map_text(value: Any, change) -> Any:
    """``change`` applied to a field's text: the string, or each chat message's ``content``."""
    if isinstance(value, str):
        return change(value)
    if isinstance(value, (list, tuple)):
        return [_map_text(v, change) for v in value]
    if isinstance(value, Mapping):
        return {k: (_map_text(v, change) if k == "content" else v) for k, v in value.items()}
    return value


def _shown(text: str) -> str:
    return html.escape(_SURROGATE.sub("\ufffd", text), quote=False)


def display_fields(fields: Mapping[str, Any]) -> tuple[dict, str | None]:
    """``(fields as sent to Argilla, smolforge_raw metadata or None)`` for a record's exact ``fields``.

    >>> display_fields({"response_1": "<b>hi</b> & bye", "prompt": [{"role": "user", "content": "1 < 2"}]})
    ({'response_1': '&lt;b&gt;hi&lt;/b&gt; &amp; bye', 'prompt': [{'role': 'user', 'content': '1 &lt; 2'}]}, None)
    >>> display_fields({"response_1": "bad \\ud800"})
    ({'response_1': 'bad \ufffd'}, '{"response_1": "bad \\\\ud800"}')
    """
    raw = {name: value for name, value in fields.items() if _has_surrogates(value)}
    return ({name: _map_text(value, _shown) for name, value in fields.items()},
            json.dumps(raw, sort_keys=True) if raw else None)        # ASCII JSON: \ud800 escapes


def exact_fields(fields: Mapping[str, Any], metadata: Mapping[str, Any] | None) -> dict:
    """The inverse of :func:`display_fields`: a record's fields exactly as they were pushed.

    >>> text = "<script>alert('&amp;')</script> \\ud800 é"
    >>> shown, raw = display_fields({"response_1": text, "response_2": "a &lt; b"})
    >>> exact_fields(shown, {RAW_METADATA: raw}) == {"response_1": text, "response_2": "a &lt; b"}
    True
    """
    exact = {name: _map_text(value, html.unescape) for name, value in fields.items()}
    raw = dict(metadata or {}).get(RAW_METADATA)
    return exact | (json.loads(raw) if raw else {})


def _options(settings: dict) -> list | None:
    options = settings.get("options")
    return None if options is None else [o["value"] for o in options]


def schema_of(settings: Any) -> dict:
    """Normalise an ``rg.Settings`` (or its ``serialize()`` dict) to :func:`review_schema`'s shape."""
    raw = settings if isinstance(settings, Mapping) else settings.serialize()
    fields = {f["name"]: {"type": f["settings"]["type"]} for f in raw.get("fields") or []}
    questions = {}
    for q in raw.get("questions") or []:
        entry = {"type": q["settings"]["type"]}
        if _options(q["settings"]) is not None:
            entry["options"] = _options(q["settings"])
        entry["required"] = bool(q.get("required", True))
        questions[q["name"]] = entry
    metadata = {m["name"]: {"type": m["settings"]["type"]} for m in raw.get("metadata") or []}
    distribution = dict(raw.get("distribution") or {"strategy": "overlap", "min_submitted": 1})
    return {"fields": fields, "questions": questions, "metadata": metadata,
            "guidelines": (raw.get("guidelines") or "").strip(), "distribution": distribution}


_WHAT = {"fields": "field", "questions": "question", "metadata": "metadata property"}
_PROPERTY_WORD = {"options": "labels", "type": "type", "required": "required"}


def check_schema(existing: Mapping, wanted: Mapping) -> list[str]:
    """Raise RecipeError naming the first field/question/metadata that differs in a way records cannot
    bridge; return the differences a push may simply update (guidelines, distribution).

    >>> s = review_schema(2)
    >>> check_schema(s, review_schema(2, min_submitted=3))
    ['distribution']
    >>> old = review_schema(2); old["questions"]["preference"]["options"] = ["a", "b"]
    >>> check_schema(old, s)
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: schema mismatch on re-push: question 'preference' has labels ['a', 'b'] but the push needs ['response_1', 'response_2', 'tie'] (push to a new dataset name, or delete the old one)
    """
    hint = " (push to a new dataset name, or delete the old one)"
    for section, word in _WHAT.items():
        have, need = existing.get(section, {}), wanted.get(section, {})
        for name, spec in need.items():
            if name not in have:
                raise RecipeError(f"schema mismatch on re-push: {word} '{name}' is missing from the existing "
                                  f"dataset but the push needs it{hint}")
            for prop in sorted(set(spec) | set(have[name])):
                if have[name].get(prop) != spec.get(prop):
                    what = _PROPERTY_WORD.get(prop, prop)
                    raise RecipeError(f"schema mismatch on re-push: {word} '{name}' has {what} "
                                      f"{have[name].get(prop)!r} but the push needs {spec.get(prop)!r}{hint}")
        extra = sorted(set(have) - set(need))
        required_extra = [n for n in extra if section != "metadata" and have[n].get("required", True)]
        if required_extra:
            raise RecipeError(f"schema mismatch on re-push: {word} '{required_extra[0]}' exists in the dataset "
                              f"(required) but the push does not fill it{hint}")
    return [key for key in ("guidelines", "distribution") if existing.get(key) != wanted.get(key)]


def build_settings(schema: Mapping) -> Any:
    """An ``rg.Settings`` for :func:`review_schema`'s dict (uses the SDK's default client, i.e. the
    last ``rg.Argilla(...)`` made)."""
    import argilla as rg

    fields = []
    for name, spec in schema["fields"].items():
        title = "Prompt" if name == "prompt" else name.replace("_", " ").capitalize()
        field_class = rg.ChatField if spec["type"] == "chat" else rg.TextField
        fields.append(field_class(name=name, title=title, use_markdown=False))   # text: markup is not rendered
    questions = []
    for name, spec in schema["questions"].items():
        kind, required = spec["type"], spec["required"]
        if kind == "label_selection":
            labels = {v: LABEL_TEXT.get(v, v) for v in spec["options"]}
            questions.append(rg.LabelQuestion(name=name, labels=labels, required=required,
                                              title="Which response is better?"))
        elif kind == "ranking":
            questions.append(rg.RankingQuestion(name=name, values=spec["options"], required=required,
                                                title="Rank the responses (1 = best)"))
        elif kind == "rating":
            questions.append(rg.RatingQuestion(name=name, values=spec["options"], required=required,
                                               title="How good is the best response? (1 = unusable, 5 = excellent)"))
        elif kind == "text":
            questions.append(rg.TextQuestion(name=name, required=required, title="Comment (optional)"))
        else:
            raise RecipeError(f"question '{name}': unsupported type {kind!r}")
    metadata_class = {"terms": rg.TermsMetadataProperty, "integer": rg.IntegerMetadataProperty,
                      "float": rg.FloatMetadataProperty}
    metadata = [metadata_class[spec["type"]](name=name, visible_for_annotators=False)
                for name, spec in schema["metadata"].items()]
    distribution = rg.TaskDistribution(min_submitted=schema["distribution"]["min_submitted"])
    return rg.Settings(fields=fields, questions=questions, metadata=metadata, guidelines=schema["guidelines"],
                       distribution=distribution, allow_extra_metadata=True)    # smolforge_raw, when needed


def to_record(item: Mapping) -> Any:
    """An ``rg.Record`` from :func:`build_record`'s dict (its id becomes the record's external id), its
    text as :func:`display_fields` shows it."""
    import argilla as rg

    fields, raw = display_fields(item["fields"])
    metadata = dict(item["metadata"]) | ({RAW_METADATA: raw} if raw else {})
    return rg.Record(id=item["id"], fields=fields, metadata=metadata)
