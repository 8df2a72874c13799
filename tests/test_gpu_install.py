"""`make setup` on a GPU machine installs in ONE pip resolve that succeeds: pip's real resolver, offline.

What the GPU path of the Makefile installs (vLLM's CUDA build, torch, the project and its test
extra, read from Makefile and pyproject.toml by tests/gpu_install.py) is resolved by the pip of this
venv over a local PEP 503/658 index of package metadata recorded from PyPI
(tests/data/gpu_resolve/metadata.json, written by bench/gpu_resolve.py): no network, no wheel.
The old pins (vllm 0.33.0 needs pillow>=13; trackio 0.43.0 caps it below 13) were split over two
pip commands, so pip downgraded pillow, printed the conflict and exited 0; in one resolve they fail.
"""
from __future__ import annotations

import doctest
import json
import platform
import sys
from pathlib import Path

import gpu_install
import pytest
from gpu_install import gpu_commands, gpu_installs, gpu_requirements, resolve, write_index
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
RECORDED = REPO / "tests" / "data" / "gpu_resolve" / "metadata.json"
OLD_PIN = "trackio==0.43.0"         # the test extra's pin before: caps pillow<13
RERECORD = "the recorded index lacks what this needs: re-record with `.venv/bin/python bench/gpu_resolve.py`"


@pytest.fixture(scope="module")
def recorded() -> dict:
    document = json.loads(RECORDED.read_text())
    here = ".".join(platform.python_version_tuple()[:2])
    if ".".join(document["python"].split(".")[:2]) != here or document["platform"] != f"{sys.platform}-{platform.machine()}":
        pytest.skip(f"metadata recorded for Python {document['python']} on {document['platform']}, not {here} "
                    f"on {sys.platform}-{platform.machine()} (markers and wheel tags differ): re-record here")
    return document


@pytest.fixture(scope="module")
def index(recorded, tmp_path_factory) -> str:
    return write_index(recorded["dists"], tmp_path_factory.mktemp("gpu-index"))


@pytest.fixture(scope="module")
def requirements() -> list[str]:
    return gpu_requirements((REPO / "Makefile").read_text(), (REPO / "pyproject.toml").read_text())


def test_gpu_setup_installs_the_project_in_one_pip_resolve_followed_by_pip_check():
    makefile = (REPO / "Makefile").read_text()
    installs = gpu_installs(makefile)
    assert len(installs) == 1, f"the GPU path resolves in {len(installs)} pip commands (a later one may quietly " \
                               f"downgrade what an earlier one installed): {installs}"
    [install] = installs
    assert any(word.startswith(".[") and "test" in word for word in install), install   # the project and its tests
    commands = gpu_commands(makefile)
    assert ["$(PIP)", "check"] in commands[commands.index(install) + 1:], "no `$(PIP) check` after the install"


def test_the_gpu_install_resolves_with_pips_resolver(requirements, index, tmp_path):
    result = resolve(requirements, index, tmp_path)
    assert result.ok, f"the pins clash, or {RERECORD}:\n{result.why()}"
    for text in requirements:               # pip's choice meets every pin it was given (vllm, torch, …)
        requirement = Requirement(text)
        if requirement.marker is None or requirement.marker.evaluate():
            assert requirement.specifier.contains(result.install[canonicalize_name(requirement.name)],
                                                  prereleases=True), (text, result.install)
    assert {"vllm", "torch", "trl", "transformers", "pillow"} <= set(result.install)


def test_the_old_trackio_pin_does_not_resolve_beside_vllm(requirements, index, tmp_path):
    result = resolve(requirements + [OLD_PIN], index, tmp_path)
    assert not result.ok, "the old pins resolved: this index could not catch the clash"
    conflict = result.why()
    assert "ResolutionImpossible" in conflict, f"{RERECORD}:\n{conflict}"
    assert "trackio 0.43.0 depends on pillow<13" in conflict and "depends on pillow>=13" in conflict, conflict


def test_the_helpers_examples_hold():
    assert doctest.testmod(gpu_install).failed == 0
