"""Human preference review through Argilla (push model outputs, pull verdicts as preference data).

Not built yet: it arrives with the Argilla issue. The package exists because the design card fixes
the top-level layout; nothing imports it.
"""
