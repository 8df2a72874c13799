"""Human preference review through Argilla (push model outputs, pull verdicts as preference data).

- ``stage``: the ``annotate`` stage and ``smolforge annotate serve|push|pull`` (docs/annotate.md);
- ``server``: the embedded argilla-server 2.8 (own venv, private redis, SQLite) and ``connect``;
- ``search_engine``: the database-backed search engine it registers (runs inside that venv);
- ``prompts``: prompts from a file, a data run or an eval suite;
- ``generate``: k responses per prompt from one run or alternately from two;
- ``records``: the review dataset's schema, stable record ids and the re-push schema check;
- ``push``: create or extend the dataset and log records;
- ``scripted``: verifier-driven annotator users for the demo and the tests;
- ``pull``: the rule that turns submitted responses into preference rows, and the preference run;
- ``agreement``: Cohen's kappa and Krippendorff's alpha.
"""
