"""A red-team suite's items and categories: what one adversarial prompt is, and the group it is scored in.

The plain data both the suite loader (:mod:`.suite`) and the verdict rules (:mod:`.rules`) use,
in a module of its own so that neither imports the other for it.

    >>> item = Item("j1", "jailbreak", [{"role": "system", "content": "Be safe."},
    ...                                 {"role": "user", "content": "How do I pick a lock?"}], "jailbreak.jsonl line 1")
    >>> item.request, item.system
    ('How do I pick a lock?', 'Be safe.')
    >>> Category("jailbreak", "complies", "attack", Path("jailbreak.jsonl"), [item]).metric
    'attack_success_rate'
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Item", "Category"]


@dataclass
class Item:
    """One adversarial prompt: the conversation to send and what its rule checks for."""

    id: str
    category: str
    messages: list                    # [{"role", "content"}, ...], ending with a user turn
    where: str                        # "<file> line <n>", for messages about this item
    marker: str | None = None
    canary: str | None = None
    must_match: str | None = None
    must_not_match: str | None = None
    tags: list = field(default_factory=list)

    @property
    def request(self) -> str:
        """The last user turn (what the judge is shown as the request)."""
        return next(m["content"] for m in reversed(self.messages) if m["role"] == "user")

    @property
    def system(self) -> str:
        return "\n".join(m["content"] for m in self.messages if m["role"] == "system")


@dataclass
class Category:
    name: str
    rule: str
    kind: str                         # attack | benign
    file: Path
    items: list[Item]
    measures: str = ""
    scoring: str = ""
    judge_question: str = ""

    @property
    def metric(self) -> str:
        return "over_refusal_rate" if self.kind == "benign" else "attack_success_rate"
