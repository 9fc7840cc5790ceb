"""Shared code on a real GPU (kfbot/evaluate/neighbours.py): a candidate for gelu_kernel
that changes the device function bias_gelu_kernel also calls is verified against both
ops' references, kept when both pass, and rejected with the other op's failure when only
its own passes.

    pytest -m gpu tests/evaluate/test_neighbours_gpu.py
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kfbot.config import load_config
from kfbot.evaluate.candidate import Candidate
from kfbot.evaluate.engine import Engine, EngineSettings
from kfbot.evaluate.task import make_task
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel

pytestmark = pytest.mark.gpu

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "shared_device_fn"
PATH = "csrc/activations.cu"
SOURCE = (FIXTURE / PATH).read_text()


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    config = load_config(None, FIXTURE)
    kernels = scan(FIXTURE, config).kernels
    task = make_task(select_kernel(kernels, "gelu_kernel"), FIXTURE, config, kernels)
    cache = tmp_path_factory.mktemp("kfbot-cache")
    with Engine(task, EngineSettings(cache_dir=cache, job_timeout_s=300)) as e:
        assert e.baseline().ok
        yield e


def test_a_shared_change_both_ops_pass_is_kept(engine: Engine) -> None:
    regrouped = SOURCE.replace("return 0.5f * v * (1.0f + tanhf(inner));",
                               "return v * (0.5f + 0.5f * tanhf(inner));")
    result = engine.evaluate(Candidate(files={PATH: regrouped}, origin="user"))
    assert result.ok, result.reason
    said = [f.reason for f in result.findings if f.check == "edit-scope"]
    assert any("bias_gelu_kernel's op is verified against its reference as well" in r
               for r in said)
    assert any(r.startswith("csrc/activations.cu::bias_gelu_kernel's op, whose code the "
                            "candidate changes too, passes with it: correct on") for r in said)


def test_a_shared_change_the_other_op_fails_is_rejected(engine: Engine) -> None:
    # gelu_kernel computes GELU itself now, so its own reference passes; the shared
    # function, which only bias_gelu_kernel still calls, is broken
    broken = SOURCE.replace("return 0.5f * v * (1.0f + tanhf(inner));", "return 0.5f * v;")
    broken = broken.replace("        y[i] = gelu_tanh(x[i]);",
                            "        const float v = x[i];\n"
                            "        y[i] = 0.5f * v * (1.0f + tanhf(0.7978845608f * "
                            "(v + 0.044715f * v * v * v)));")
    result = engine.evaluate(Candidate(files={PATH: broken}, origin="user"))
    assert not result.ok
    assert result.reason.startswith("changes code bias_gelu_kernel uses too, and "
                                    "csrc/activations.cu::bias_gelu_kernel's op then fails:")
