"""An LLM judge over any OpenAI-compatible endpoint: what ``smolforge judge`` (:mod:`smolforge.evals.judge`)
runs, and what judge rewards and judge-assisted review can reach from the layers below evals.

- :mod:`.prompts`: what the judge is asked (pairwise, pointwise on a rubric, reference-guided) and how
  its answers are read;
- :mod:`.endpoint`: the judge model behind an endpoint, asked many chats at once (cache, rate limit,
  workers, progress);
- :mod:`.cache`, :mod:`.limiter`: the reply cache (resumable) and the rate limiter;
- :mod:`.verdicts`: both orders of a pair → one verdict, position bias, sanity accuracy;
- :mod:`.items`: the rows a judge is given (pairs, single responses), checked; the sanity suite.
"""
