"""An argilla-server search engine backed by the server's own database (no Elasticsearch needed).

Imported only inside the argilla-server virtual environment, by ``annotate/argilla_launch.py``,
before the app starts; the server picks it with ``ARGILLA_SEARCH_ENGINE=smolforge-sql``::

    ARGILLA_SEARCH_ENGINE=smolforge-sql .argilla-venv/bin/python annotate/argilla_launch.py server --port 6900

Records, responses and suggestions already live in the database, so the index methods are
no-ops; ``search``, the progress figures and metadata metrics read the database on every call.
Filters (response status per user incl. pending, response values, metadata terms/range, record
properties, suggestions) are evaluated exactly. Text search is a term match like Elasticsearch's
``simple_query_string`` with AND: every word of the query must be a word of the field (case-
insensitive); a ``"quoted phrase"`` must occur as a substring; a ``word*`` matches as a prefix.
Sort: the requested orders, else by score (text queries), then insertion order.
"""
from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Iterable, List, Optional, Union
from uuid import UUID

from sqlalchemy import func, select

from argilla_server.database import AsyncSessionLocal
from argilla_server.enums import MetadataPropertyType, ResponseStatusFilter, SimilarityOrder, SortOrder
from argilla_server.models import (Dataset, MetadataProperty, Question, Record, Response, Suggestion, User,
                                   VectorSettings)
from argilla_server.search_engine.base import (AndFilter, Filter, FloatMetadataMetrics, IntegerMetadataMetrics,
                                               MetadataFilterScope, MetadataMetrics, Order, RangeFilter,
                                               RecordFilterScope, ResponseFilterScope, SearchEngine,
                                               SearchResponseItem, SearchResponses, SuggestionFilterScope,
                                               TermsFilter, TermsMetrics, TextQuery)

ENGINE_NAME = "smolforge-sql"
_WORD = re.compile(r"\w+", re.UNICODE)


def _words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def _field_text(value: Any) -> str:
    """Searchable text of a field value: text as is, chat messages' contents, anything else as str."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(m.get("content", "") if isinstance(m, dict) else str(m) for m in value)
    return str(value)


def text_score(query: str, text: str) -> float | None:
    """How well ``text`` matches ``query`` (None: no match). Every term must match.

    >>> text_score("Paris france", "The capital of France is Paris."), text_score("Lyon", "Paris")
    (2.0, None)
    >>> text_score('"is Par"', "The capital is Paris"), text_score("cap*", "capital"), text_score("cap", "capital")
    (1.0, 1.0, None)
    """
    lowered = text.lower()
    words = _words(text)
    bag = set(words)
    score = 0.0
    phrases = re.findall(r'"([^"]*)"', query)
    rest = re.sub(r'"[^"]*"', " ", query)
    for phrase in phrases:
        if phrase.strip() and phrase.lower() not in lowered:
            return None
        score += 1.0
    for token in rest.split():
        prefix = token.endswith("*")
        terms = _words(token)
        if not terms:
            continue
        for i, term in enumerate(terms):
            if prefix and i == len(terms) - 1:
                hits = sum(1 for w in words if w.startswith(term))
            else:
                hits = words.count(term) if term in bag else 0
            if not hits:
                return None
            score += 1.0
    return score


def _bound(value: Any, bound: Any) -> Any:
    """A range bound comparable with ``value``: ISO strings become datetimes for date properties."""
    if isinstance(value, datetime) and isinstance(bound, str):
        parsed = datetime.fromisoformat(bound.replace("Z", "+00:00"))
        return parsed.replace(tzinfo=None) if value.tzinfo is None else parsed
    return bound


def _in_range(value: Any, ge: Any, le: Any) -> bool:
    """
    >>> _in_range(datetime(2026, 1, 2), "2026-01-01T00:00:00Z", None), _in_range(3, 4, None), _in_range(None, 1, 2)
    (True, False, False)
    """
    if value is None:
        return False
    ge, le = _bound(value, ge), _bound(value, le)
    try:
        return (ge is None or value >= ge) and (le is None or value <= le)
    except TypeError:
        return False


def _terms_match(value: Any, values: list) -> bool:
    wanted = {str(v) for v in values}
    if isinstance(value, list):
        return any(str(v) in wanted for v in value)
    return value is not None and str(value) in wanted


class _Row:
    """A record with what filters need, loaded once per search."""

    def __init__(self, record: Record):
        self.record = record
        self.responses: list[Response] = []
        self.suggestions: dict[str, Suggestion] = {}

    def record_value(self, prop: str) -> Any:
        value = getattr(self.record, prop)
        return value.value if hasattr(value, "value") and not isinstance(value, (str, int, float)) else value


def _match(row: _Row, flt: Filter) -> bool:
    if isinstance(flt, AndFilter):
        return all(_match(row, f) for f in flt.filters)
    scope = flt.scope
    if isinstance(scope, ResponseFilterScope):
        return _match_response(row, flt, scope)
    if isinstance(scope, MetadataFilterScope):
        value = (row.record.metadata_ or {}).get(scope.metadata_property)
    elif isinstance(scope, RecordFilterScope):
        value = row.record_value(scope.property)
        if isinstance(value, UUID):
            value = str(value)
    elif isinstance(scope, SuggestionFilterScope):
        suggestion = row.suggestions.get(scope.question)
        if suggestion is None:
            return False
        value = getattr(suggestion, scope.property or "value")
        value = getattr(value, "value", value) if scope.property == "type" else value
    else:
        raise ValueError(f"smolforge-sql: cannot filter on scope {scope!r}")
    if isinstance(flt, TermsFilter):
        return _terms_match(value, flt.values)
    if isinstance(flt, RangeFilter):
        if isinstance(value, list):
            return any(_in_range(v, flt.ge, flt.le) for v in value)
        return _in_range(value, flt.ge, flt.le)
    raise ValueError(f"smolforge-sql: cannot process filter {flt!r}")


def _match_response(row: _Row, flt: Filter, scope: ResponseFilterScope) -> bool:
    mine = [r for r in row.responses if scope.user is None or r.user_id == scope.user.id]
    if scope.question:
        for response in mine:
            value = (response.values or {}).get(scope.question, {}).get("value")
            if isinstance(flt, TermsFilter) and _terms_match(value, flt.values):
                return True
            if isinstance(flt, RangeFilter) and _in_range(value, flt.ge, flt.le):
                return True
        return False
    if scope.property == "status" and isinstance(flt, TermsFilter):
        statuses = {str(getattr(v, "value", v)) for v in flt.values}
        if ResponseStatusFilter.pending.value in statuses and not mine:
            return True
        return any(str(getattr(r.status, "value", r.status)) in statuses for r in mine)
    raise ValueError(f"smolforge-sql: cannot process response filter scope {scope!r}")


def _sort_key(row: _Row, order: Order) -> Any:
    scope = order.scope
    if isinstance(scope, MetadataFilterScope):
        value = (row.record.metadata_ or {}).get(scope.metadata_property)
    elif isinstance(scope, RecordFilterScope):
        value = row.record_value(scope.property)
    elif isinstance(scope, SuggestionFilterScope):
        suggestion = row.suggestions.get(scope.question)
        value = getattr(suggestion, scope.property or "value", None) if suggestion else None
    elif isinstance(scope, ResponseFilterScope):
        mine = [r for r in row.responses if scope.user is None or r.user_id == scope.user.id]
        if scope.question:
            values = [(r.values or {}).get(scope.question, {}).get("value") for r in mine]
            numbers = [v for v in values if isinstance(v, (int, float))]
            value = sum(numbers) / len(numbers) if numbers else (values[0] if values else None)
        else:
            value = str(mine[0].status.value) if mine else None
    else:
        value = None
    if value is not None and not isinstance(value, (int, float, str)):
        value = str(value)
    return value


def _sorted(rows: list[_Row], sort: list[Order]) -> list[_Row]:
    """Stable multi-key sort; missing values go last in both directions (like Elasticsearch)."""
    for order in reversed(sort):
        present = [r for r in rows if _sort_key(r, order) is not None]
        missing = [r for r in rows if _sort_key(r, order) is None]
        present.sort(key=lambda r: _sort_key(r, order), reverse=order.order == SortOrder.desc)
        rows = present + missing
    return rows


@SearchEngine.register(ENGINE_NAME)
class SQLSearchEngine(SearchEngine):
    """Answers argilla-server's search engine calls from its database."""

    @classmethod
    async def new_instance(cls) -> "SQLSearchEngine":
        return cls()

    async def close(self):
        pass

    async def ping(self) -> bool:
        async with AsyncSessionLocal() as db:
            await db.execute(select(1))
        return True

    async def info(self) -> dict:
        return {"distribution": ENGINE_NAME, "version": "1"}

    # records live in the database: nothing to index or unindex
    async def create_index(self, dataset: Dataset):
        pass

    async def delete_index(self, dataset: Dataset):
        pass

    async def configure_metadata_property(self, dataset: Dataset, metadata_property: MetadataProperty):
        pass

    async def configure_index_vectors(self, vector_settings: VectorSettings):
        pass

    async def index_records(self, dataset: Dataset, records: Iterable[Record]):
        pass

    async def partial_record_update(self, record: Record, **update):
        pass

    async def delete_records(self, dataset: Dataset, records: Iterable[Record]):
        pass

    async def update_record_response(self, response: Response):
        pass

    async def delete_record_response(self, response: Response):
        pass

    async def update_record_suggestion(self, suggestion: Suggestion):
        pass

    async def delete_record_suggestion(self, suggestion: Suggestion):
        pass

    async def get_dataset_progress(self, dataset: Dataset) -> dict:
        """``{"total": n, "pending": p, "completed": c}`` over the dataset's records' status."""
        if dataset.is_draft:
            return {}
        async with AsyncSessionLocal() as db:
            rows = (await db.execute(select(Record.status, func.count()).where(Record.dataset_id == dataset.id)
                                     .group_by(Record.status))).all()
        counts = {str(getattr(status, "value", status)): n for status, n in rows}
        return {"total": sum(counts.values()), **counts}

    async def get_dataset_user_progress(self, dataset: Dataset, user: User) -> dict:
        """``{"total": n, "submitted": s, "draft": d, "discarded": x}`` over ``user``'s responses."""
        if dataset.is_draft:
            return {}
        async with AsyncSessionLocal() as db:
            rows = (await db.execute(select(Response.status, func.count()).join(Record)
                                     .where(Record.dataset_id == dataset.id, Response.user_id == user.id)
                                     .group_by(Response.status))).all()
        counts = {str(getattr(status, "value", status)): n for status, n in rows}
        return {"total": sum(counts.values()), **counts}

    async def _rows(self, dataset: Dataset, with_suggestions: bool) -> list[_Row]:
        async with AsyncSessionLocal() as db:
            records = (await db.execute(select(Record).where(Record.dataset_id == dataset.id)
                                        .order_by(Record.inserted_at.asc(), Record.id.asc()))).scalars().all()
            rows = {r.id: _Row(r) for r in records}
            responses = (await db.execute(select(Response).join(Record)
                                          .where(Record.dataset_id == dataset.id))).scalars().all()
            for response in responses:
                rows[response.record_id].responses.append(response)
            if with_suggestions:
                names = dict((await db.execute(select(Question.id, Question.name)
                                               .where(Question.dataset_id == dataset.id))).all())
                suggestions = (await db.execute(select(Suggestion).join(Record)
                                                .where(Record.dataset_id == dataset.id))).scalars().all()
                for suggestion in suggestions:
                    rows[suggestion.record_id].suggestions[names[suggestion.question_id]] = suggestion
        return list(rows.values())

    async def search(self, dataset: Dataset, query: Optional[Union[TextQuery, str]] = None,
                     filter: Optional[Filter] = None, sort: Optional[List[Order]] = None,
                     offset: int = 0, limit: int = 100, **kwargs) -> SearchResponses:
        """Exact filtering and term matching over the dataset's records; ``user_id`` and other keywords
        the server passes are accepted and ignored (the order is deterministic for every user)."""
        needs_suggestions = _uses_suggestions(filter) or any(isinstance(o.scope, SuggestionFilterScope)
                                                              for o in sort or [])
        rows = await self._rows(dataset, needs_suggestions)
        if filter is not None:
            rows = [r for r in rows if _match(r, filter)]
        scores: dict[UUID, float | None] = {}
        if query is not None:
            text = TextQuery(q=query) if isinstance(query, str) else query
            fields = [f for f in dataset.fields if not f.is_image and (text.field is None or f.name == text.field)]
            if text.field is not None and not fields:
                raise ValueError(f"Field {text.field} not found in dataset {dataset.id}")
            kept = []
            for row in rows:
                best = None
                for field in fields:
                    score = text_score(text.q, _field_text((row.record.fields or {}).get(field.name)))
                    if score is not None and (best is None or score > best):
                        best = score
                if best is not None:
                    scores[row.record.id] = best
                    kept.append(row)
            rows = sorted(kept, key=lambda r: -scores[r.record.id])  # stable: insertion order breaks ties
        if sort:
            rows = _sorted(rows, sort)
        page = rows[offset:offset + limit]
        return SearchResponses(items=[SearchResponseItem(record_id=r.record.id, score=scores.get(r.record.id))
                                      for r in page], total=len(rows))

    async def compute_metrics_for(self, metadata_property: MetadataProperty) -> MetadataMetrics:
        async with AsyncSessionLocal() as db:
            metadata = (await db.execute(select(Record.metadata_)
                                         .where(Record.dataset_id == metadata_property.dataset_id))).scalars().all()
        values = [m.get(metadata_property.name) for m in metadata if m and m.get(metadata_property.name) is not None]
        if metadata_property.type == MetadataPropertyType.terms:
            flat = [str(v) for value in values for v in (value if isinstance(value, list) else [value])]
            counts: dict[str, int] = {}
            for v in flat:
                counts[v] = counts.get(v, 0) + 1
            return TermsMetrics(total=len(flat), values=[TermsMetrics.TermCount(term=t, count=n) for t, n in
                                                         sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))])
        cls = IntegerMetadataMetrics if metadata_property.type == MetadataPropertyType.integer else FloatMetadataMetrics
        return cls(min=min(values) if values else None, max=max(values) if values else None)

    async def similarity_search(self, dataset: Dataset, vector_settings: VectorSettings,
                                value: Optional[List[float]] = None, record: Optional[Record] = None,
                                query: Optional[Union[TextQuery, str]] = None, filter: Optional[Filter] = None,
                                max_results: int = 100, order: SimilarityOrder = SimilarityOrder.most_similar,
                                threshold: Optional[float] = None) -> SearchResponses:
        raise NotImplementedError("similarity (vector) search is not available with the embedded smolforge-sql "
                                  "search engine; set ARGILLA_ELASTICSEARCH (or OpenSearch) to use it")


def _uses_suggestions(flt: Optional[Filter]) -> bool:
    if flt is None:
        return False
    if isinstance(flt, AndFilter):
        return any(_uses_suggestions(f) for f in flt.filters)
    return isinstance(flt.scope, SuggestionFilterScope)
