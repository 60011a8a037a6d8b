import os
import sys

import pytest
import torch

import torchtpu  # noqa: F401  registers the tpu device

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture
def no_fallback():
    """Asserts the test ran without any CPU fallback."""
    torchtpu.reset_fallback_report()
    yield
    torch.tpu.synchronize()
    report = torchtpu.fallback_report()
    assert not report, f"ops ran through the CPU fallback: {report}"
