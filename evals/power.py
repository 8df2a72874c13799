"""What a suite can tell: its size per task and the smallest change it resolves.

A gate's tolerance means something only where the suite's noise is below it. For each task of an
lm-eval suite, and for the pooled rates of a red-team suite, this states the items, the stderr of a
0/1 score at the worst case (p = 0.5) and at a stated rate, and the minimum detectable difference
(:func:`smolforge.paired.minimum_detectable`: one-sided, two runs answering independently). Paired
gates do better wherever two runs agree on most items; the unpaired figure is the floor a suite
guarantees whoever runs it. docs/evals.md carries the table of the built-in suites
(``python -m smolforge.evals.power --write-docs``; tests/test_gates.py checks it is current).

    >>> rows = {row.task: row for row in suite_power("redteam")}
    >>> rows["attack_success"].items, round(rows["attack_success"].mdd_worst, 3)
    (420, 0.057)
    >>> rows["attack_success"].resolves(0.05)     # twice the stderr at the stated rate is under 0.05
    True
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

from smolforge.paired import minimum_detectable

__all__ = ["PowerRow", "suite_power", "render_power", "with_power", "BEGIN", "END", "BUILT_IN"]

BEGIN, END = "<!-- power:begin -->", "<!-- power:end -->"
# The built-in suites in the docs table, with the rate each headline metric sits near on the demo
# (the stderr and detectable difference at that rate, beside the worst case).
BUILT_IN = {"embedded": {"instruct": 0.6, "prefs": 0.8, "facts": 0.7, "arith": 0.5, "reason": 0.8},
            "redteam": {"attack_success": 0.15, "over_refusal": 0.1},
            "tools": {"tools": 0.6}}
# The share of items on which two checkpoints of one lineage answer differently, for the paired
# figures: a conservative round number (DPO against SFT on the demo flipped about 3 % of `instruct`).
FLIPS = 0.10
DOCS = Path(__file__).resolve().parents[1] / "docs" / "evals.md"


@dataclass(frozen=True)
class PowerRow:
    suite: str
    task: str             # an lm-eval task, a red team's pooled rate (attack_success, over_refusal), or tools
    items: int
    rate: float           # the rate the stated figures assume

    @property
    def stderr(self) -> float:
        return math.sqrt(self.rate * (1 - self.rate) / self.items)

    @property
    def mdd(self) -> float:
        return minimum_detectable(self.items, p=self.rate)

    @property
    def mdd_worst(self) -> float:
        return minimum_detectable(self.items, p=0.5)

    @property
    def paired_stderr(self) -> float:
        """The stderr of a paired difference when :data:`FLIPS` of the items flip (at most sqrt(f/n))."""
        return math.sqrt(FLIPS / self.items)

    def resolves(self, tolerance: float, paired: bool = False) -> bool:
        """Whether ``tolerance`` is above twice the stderr at the stated rate (or of a paired difference)."""
        return tolerance > 2 * (self.paired_stderr if paired else self.stderr)


def suite_power(ref: str, rates: dict[str, float] | None = None) -> list[PowerRow]:
    """Rows for a suite (a built-in name or a folder): every task of an lm-eval suite, the pooled
    attack and benign rates of a red-team suite (``suite.yaml`` with ``kind: adversarial``), or the
    items of a tools suite."""
    from .redteam.suite import is_redteam_suite, load_redteam_suite
    from .suite import load_suite, suite_path
    from .tool_use import is_tool_suite, load_tool_suite

    rates = {**BUILT_IN.get(Path(ref).name, {}), **(rates or {})}
    if is_redteam_suite(ref):
        suite = load_redteam_suite(ref)
        pooled = {"attack_success": 0, "over_refusal": 0}
        for category in suite.categories.values():
            pooled["over_refusal" if category.kind == "benign" else "attack_success"] += len(category.items)
        return [PowerRow(suite.name, task, n, rates.get(task, 0.5)) for task, n in pooled.items() if n]
    if is_tool_suite(ref):
        tools = load_tool_suite(ref)
        return [PowerRow(tools["name"], "tools", len(tools["items"]), rates.get("tools", 0.5))]
    suite_path(ref)  # a clear error for an unknown suite
    suite = load_suite(ref)
    return [PowerRow(suite.name, name, task.size, rates.get(name, 0.5)) for name, task in sorted(suite.tasks.items())]


def render_power(tolerance: float = 0.05) -> str:
    """The markdown table of the built-in suites."""
    lines = ["| suite | task | items | rate assumed | stderr | paired stderr | min. detectable (at the rate / at 0.5) "
             f"| tolerance {tolerance} above 2 × stderr |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for suite in BUILT_IN:
        for row in suite_power(suite):
            verdict = "yes" if row.resolves(tolerance) else "paired" if row.resolves(tolerance, paired=True) else "no"
            lines.append(f"| {row.suite} | {row.task} | {row.items} | {row.rate:.2f} | {row.stderr:.3f} "
                         f"| {row.paired_stderr:.3f} | {row.mdd:.3f} / {row.mdd_worst:.3f} | {verdict} |")
    return "\n".join(lines) + "\n"


def with_power(text: str) -> str:
    """``text`` with the table between :data:`BEGIN` and :data:`END` rendered anew."""
    head, begin, rest = text.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError(f"no {BEGIN} ... {END} markers to put the suite-size table between")
    return f"{head}{BEGIN}\n{render_power()}{END}{tail}"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write-docs", action="store_true", help=f"rewrite the table in {DOCS}")
    args = parser.parse_args()
    if args.write_docs:
        DOCS.write_text(with_power(DOCS.read_text(encoding="utf-8")), encoding="utf-8")
        print(f"wrote the suite-size table into {DOCS}")
    else:
        print(render_power(), end="")
