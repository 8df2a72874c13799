"""Record from PyPI the package metadata that tests/test_gpu_install.py resolves offline.

    .venv/bin/python bench/gpu_resolve.py              # resolve on PyPI, write tests/data/gpu_resolve/metadata.json
    .venv/bin/python bench/gpu_resolve.py --dry        # resolve on PyPI and offline, compare, write nothing

Runs pip's resolver against PyPI on the GPU branch's one ``$(PIP) install`` of the Makefile (its
pins, the project's dependencies and extras from pyproject.toml: tests/gpu_install.py reads them),
with ``--use-feature=fast-deps`` so a wheel's metadata comes through HTTP range requests instead of
downloading it (vLLM's and torch's wheels are hundreds of MB), and ``--report``. It resolves the
old pins' closure alone too (``--old``, default ``trackio==0.43.0``: the pin that capped pillow
below vLLM 0.33's ``pillow>=13``), so the offline index holds the losing candidates as well (pillow
12.x, trackio 0.43.0 and its dependencies). Every distribution of both reports is recorded (name,
version, file name, Requires-Python, Requires-Dist, Provides-Extra: only what the resolver reads),
then the same resolve runs offline over the recorded index and must pick the same versions as PyPI.
Prints the pins of the packages that matter, then ONE line of JSON: counts, seconds, bytes.
The resolve is for this interpreter (markers such as ``python_version``; wheel tags): run it with
the interpreter the tests use.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from gpu_install import gpu_requirements, resolve, write_index  # noqa: E402

PYPI = "https://pypi.org/simple"
OUT = REPO / "tests" / "data" / "gpu_resolve" / "metadata.json"
SHOWN = ["torch", "vllm", "transformers", "trl", "pillow", "trackio", "wandb"]


def records(report: dict) -> list[dict]:
    """One record per distribution of a pip ``--report``: what pip's resolver reads of its metadata."""
    found = []
    for item in report["install"]:
        meta = item["metadata"]
        found.append({"name": meta["name"], "version": meta["version"],
                      "filename": item["download_info"]["url"].split("#")[0].rsplit("/", 1)[1],
                      "requires_python": meta.get("requires_python"),
                      "requires_dist": meta.get("requires_dist", []),
                      "provides_extra": meta.get("provides_extra", [])})
    return found


def dumps(document: dict) -> str:
    """JSON with one line per key, and one line per distribution record (small, readable diffs).

    >>> print(dumps({"python": "3.11", "dists": [{"name": "a"}, {"name": "b"}]}), end="")
    {
    "python": "3.11",
    "dists": [
    {"name":"a"},
    {"name":"b"}
    ]
    }
    """
    lines = []
    for key, value in document.items():
        if key == "dists":
            lines.append('"dists": [\n' + ",\n".join(json.dumps(d, separators=(",", ":")) for d in value) + "\n]")
        else:
            lines.append(f"{json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", nargs="*", default=["trackio==0.43.0"], help="old pins whose closure to record too")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--dry", action="store_true", help="write nothing")
    parser.add_argument("--python", default=sys.executable, help="the interpreter whose pip resolves (and whose "
                        "markers and wheel tags count); the tests skip a recording made for another Python")
    args = parser.parse_args()

    requirements = gpu_requirements((REPO / "Makefile").read_text(), (REPO / "pyproject.toml").read_text())
    work = Path(tempfile.mkdtemp(prefix="gpu-resolve-"))
    fast = ("--use-feature=fast-deps",)
    start = time.perf_counter()
    online = resolve(requirements, PYPI, work / "pypi", python=args.python, extra_args=fast, cache=True)
    pypi_s = time.perf_counter() - start
    if not online.ok:
        sys.exit(f"the GPU install does not resolve on PyPI:\n{online.why()}")
    old = resolve(args.old, PYPI, work / "old", python=args.python, extra_args=fast, cache=True)
    if not old.ok:
        sys.exit(f"the old pins {args.old} do not resolve alone on PyPI:\n{old.why()}")
    dists = {(r["name"].lower(), r["version"]): r for r in records(online.report) + records(old.report)}
    recorded = sorted(dists.values(), key=lambda r: (r["name"].lower(), r["version"]))

    start = time.perf_counter()
    offline = resolve(requirements, write_index(recorded, work / "index"), work / "offline", python=args.python)
    offline_s = time.perf_counter() - start
    same = offline.ok and offline.install == online.install
    print(f"{'package':<14} {'PyPI':<12} {'offline index':<14}")
    for name in SHOWN:
        print(f"{name:<14} {online.install.get(name, '-'):<12} {offline.install.get(name, '-'):<14}")
    print(f"{len(online.install)} packages; old pins {args.old} add "
          f"{len(recorded) - len(online.install)} distributions; offline resolve "
          f"{'picks the same versions' if same else 'DIFFERS'}")
    python, where = subprocess.run([args.python, "-c", "import platform, sys; print(platform.python_version(), "
                                    "f'{sys.platform}-{platform.machine()}')"],
                                   capture_output=True, text=True, check=True).stdout.split()
    document = {"recorded": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "python": python, "platform": where,
                "requirements": requirements, "old_pins": args.old,
                "install": dict(sorted(online.install.items())), "dists": recorded}
    text = dumps(document)
    if not args.dry and same:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(json.dumps({"packages": len(online.install), "recorded": len(recorded), "bytes": len(text.encode()),
                      "pypi_s": round(pypi_s, 1), "offline_s": round(offline_s, 1), "same": same,
                      "written": str(args.out) if not args.dry and same else None}))
    if not same:
        sys.exit(offline.why())


if __name__ == "__main__":
    main()
