"""Human preference review through Argilla (push model outputs, pull verdicts as preference data).

- ``server``: the embedded argilla-server 2.8 (own venv, private redis, SQLite) and ``connect``;
- ``search_engine``: the database-backed search engine it registers (runs inside that venv);
- ``records``: the review dataset's schema, stable record ids and the re-push schema check;
- ``pull``: the rule that turns submitted responses into preference rows, and the preference run;
- ``agreement``: Cohen's kappa and Krippendorff's alpha.

The ``smolforge annotate`` commands and the pipeline step come with the rest of the Argilla issue.
"""
