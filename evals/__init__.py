"""Evaluation: lm-eval suites (YAML + JSONL under ``suites/``) scored into run folders."""
