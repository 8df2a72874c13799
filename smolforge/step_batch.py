"""Several smolforge commands in one process, one after the other: a model step and its evals.

A fresh ``python -m smolforge eval`` spends ~7 of its ~10 s importing torch, transformers and
lm-eval; the pipeline runs every eval recipe after every model step, so it runs that model's evals
in the step's own process (or, after a step that must stay alone, in one process of their own),
with the same arguments each would get alone. Between commands, what the last one left is
collected (and CUDA's cache emptied) before the next starts. ``codes`` receives the exit codes so
far after each command; the batch stops at the first that fails, and after a step whose promotion
gates fail (``gates``: the step's index → ``{"runs_dir": DIR, "run": RUN, "gates": [...]}``).

    python -m smolforge.step_batch steps.json
    # steps.json: {"steps": [["--runs-dir", "runs", "eval", "--config", "a.yaml"], …], "codes": "codes.json"}

    >>> import json, tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> runs = ["--runs-dir", str(folder / "runs")]
    >>> spec = {"steps": [[*runs, "runs", "--json"], [*runs, "runs", "--sort"], [*runs, "runs"]],
    ...         "codes": str(folder / "codes.json")}
    >>> _ = (folder / "steps.json").write_text(json.dumps(spec))
    >>> main([str(folder / "steps.json")])  # doctest: +ELLIPSIS
    {...}
    2
    >>> json.loads((folder / "codes.json").read_text())
    [0, 2]
"""
from __future__ import annotations

import gc
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from smolforge import cli
from smolforge.runs import write_json_atomic


def release_memory() -> None:
    """Free what the previous command left (a trainer's reference cycles, CUDA's cached blocks), then
    freeze what survived (the modules the commands imported, ~800k objects with torch, transformers
    and TRL) out of the cyclic collector's reach: each later full collection, as ``Trainer.train``
    runs one at its start (accelerate's ``free_memory``), then skips them (0.55 s a collection on
    2 cores, 2 µs after the freeze). Frozen objects are still freed when their last reference goes.

        >>> import gc
        >>> release_memory(); gc.get_freeze_count() > 0
        True
    """
    gc.collect()
    gc.freeze()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def main(argv: Sequence[str] | None = None) -> int:
    """Run each command of the spec file in turn; the first non-zero exit code ends the batch."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1:
        print("usage: python -m smolforge.step_batch STEPS.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    codes: list[int] = []
    for index, args in enumerate(spec["steps"]):
        if index:
            release_memory()
        code = cli.main(args)
        sys.stdout.flush()
        sys.stderr.flush()
        codes.append(code)
        write_json_atomic(spec["codes"], codes)
        if code != 0:
            return code
        gated = spec.get("gates", {}).get(str(index))
        if gated and index + 1 < len(spec["steps"]) and not gates_pass(gated):
            return 0     # the pipeline checks the same gates, reports them and stops
    return 0


def gates_pass(gated: dict) -> bool:
    """Whether run ``gated["run"]`` in ``gated["runs_dir"]`` passes ``gated["gates"]``."""
    from smolforge.gates import asks_rerun, check_gates, failures
    from smolforge.runs import Runs

    runs = Runs(gated["runs_dir"])
    results = check_gates(runs.get(gated["run"], require_done=False), runs, gated["gates"])
    if not failures(results):
        return True
    if all(asks_rerun(r) for r in results if not r.passed):
        # the pipeline scores both runs on every item, decides again and requeues the steps after it
        print(f"gates on {gated['run']} are inconclusive and ask for a rerun: this process stops here; the pipeline "
              "rescores on every item and runs the steps after it if the gates then pass", file=sys.stderr)
    else:
        print(f"gates on {gated['run']} failed; the steps after it in this process do not run", file=sys.stderr)
    return False


if __name__ == "__main__":
    cli.unwind_on_sigterm()
    sys.exit(main())
