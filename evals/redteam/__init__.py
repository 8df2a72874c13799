"""Adversarial (red-team) suites: every public name of the package, importable from here.

- :mod:`.evaluate`: have a model answer a suite and write the result into its run (what a suite is,
  its rules and figures are described there);
- :mod:`.suite`: the ``suite.yaml`` schema, loading and checking; :mod:`.items`: items and categories;
- :mod:`.rules`: refusal detection, secret matching, the verdict on one reply;
- :mod:`.scoring`: the optional judge, the rates and their standard errors;
- :mod:`.report`: the files and metrics written into a run, the table.
"""
from .evaluate import evaluate_run, score_model
from .items import Category, Item
from .report import format_table, metrics_for_run, write_results
from .rules import DEFAULT_REFUSAL_MARKERS, RULES, RefusalRules, contains_secret, normalise_secret, score_output
from .scoring import binomial, judge_items, parse_yes_no
from .suite import SUITE_FILE, RedteamSuite, is_redteam_suite, load_redteam_suite

__all__ = [
    "SUITE_FILE", "RULES", "DEFAULT_REFUSAL_MARKERS", "RefusalRules", "Item", "Category", "RedteamSuite",
    "is_redteam_suite", "load_redteam_suite", "normalise_secret", "contains_secret", "score_output",
    "parse_yes_no", "judge_items", "binomial", "score_model", "metrics_for_run", "write_results",
    "format_table", "evaluate_run",
]
