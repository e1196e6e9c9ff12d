"""CPU-only installs: `make install` (hence `make run` and `make test`) never brings CUDA's nvidia-* wheels.

What proves it, and what each test covers:

* the installed environment the tests run in holds no nvidia-* distribution and a CPU build of torch;
* the Makefile installs torch first, alone, with PyTorch's CPU wheel index as an extra source (on Linux, unless
  TORCH_VARIANT asks for CUDA), and the other requirements without it;
* that torch step, resolved by pip as if into an empty environment (``--dry-run --ignore-installed --report``) with
  the Makefile's own options and torch's dependencies: a ``+cpu`` torch and no nvidia-* package. On a machine with
  network access the CPU build comes from PyTorch's index; on one that already has a CPU wheel pip finds (this
  project's development machines, through find-links) from there, which is the same outcome the Makefile promises.

A full `make install` into a clean virtualenv takes minutes and gigabytes, so it is not a test; bench/README.md and
the README say how it was checked.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from django.conf import settings

ROOT = Path(settings.BASE_DIR)
CUDA_REQUESTED = os.environ.get("TORCH_VARIANT", "cpu") != "cpu"
pytestmark = pytest.mark.skipif(CUDA_REQUESTED, reason="TORCH_VARIANT asks for a CUDA build")


def make(*args: str) -> str:
    return subprocess.run(["make", "-s", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def test_the_installed_environment_has_no_cuda_packages() -> None:
    names = sorted({dist.metadata["Name"].lower() for dist in metadata.distributions()})
    assert [name for name in names if name.startswith("nvidia-")] == []
    assert "onnxruntime" in names and "onnxruntime-gpu" not in names
    if platform.system() == "Linux":
        assert metadata.version("torch").endswith("+cpu"), metadata.version("torch")


@pytest.mark.skipif(platform.system() != "Linux", reason="PyPI's torch is a CPU build off Linux")
def test_the_makefile_installs_torch_from_the_cpu_index_alone() -> None:
    steps = [line for line in make("-n", "-B", "VENV=/nonexistent-venv", "/nonexistent-venv/.installed").splitlines()
             if " install " in line and "-r requirements/" in line]  # fmt: skip
    assert len(steps) == 2, steps
    torch_step, main_step = steps
    assert "--no-deps --extra-index-url https://download.pytorch.org/whl/cpu -r requirements/torch.txt" in torch_step
    assert "--retries 1 " in torch_step  # an unreachable index costs one retry, not five with backoff
    assert "-r requirements/base.txt" in main_step and "extra-index-url" not in main_step
    assert make("torch-pip-options").split() == ["--extra-index-url", "https://download.pytorch.org/whl/cpu"]
    assert make("torch-pip-options", "TORCH_VARIANT=cuda").split() == []  # PyPI's CUDA build, when asked for
    # The pin admits PyTorch's CPU build (2.13.0+cpu) and PyPI's (2.13.0): no local label.
    pins = [line for line in (ROOT / "requirements/torch.txt").read_text().splitlines() if line.startswith("torch")]
    assert pins == ["torch==2.13.0"]
    assert "-r torch.txt" in (ROOT / "requirements/embeddings.txt").read_text().splitlines()


@pytest.mark.slow
@pytest.mark.skipif(platform.system() != "Linux", reason="PyPI's torch is a CPU build off Linux")
def test_the_torch_step_resolves_to_a_cpu_build_without_nvidia_packages(tmp_path) -> None:
    report = tmp_path / "report.json"
    options = make("torch-pip-options").split()
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--retries", "0",
         "--report", str(report), *options, "-r", "requirements/torch.txt"],
        cwd=ROOT, check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    resolved = {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in json.loads(report.read_text())["install"]}
    assert resolved["torch"].startswith("2.13.0+cpu"), resolved
    assert [name for name in resolved if name.startswith(("nvidia-", "triton"))] == [], resolved


@pytest.mark.parametrize("target", ["test", "run"])
def test_make_caches_bytecode_under_the_virtualenv_whatever_the_environment_says(target: str) -> None:
    """With PYTHONDONTWRITEBYTECODE set (as on this project's machines) every process of a test run compiled every
    module it imported, each time: 23 s instead of 11 s for a test process to start."""
    command = make("-n", target).strip().splitlines()[-1]
    assert command.startswith(f"PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX={ROOT / '.venv' / 'pycache'} "), command
    from tests.live_service import INHERITED_ENV

    assert {"PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX"} <= set(INHERITED_ENV)  # the processes tests start too
