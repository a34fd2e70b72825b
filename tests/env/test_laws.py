"""Law tests: they pin torch-2.4 behaviour and fail when torch changes, on purpose.

When one of these fails after a torch upgrade, revisit aleph/env/laws.py and the
config rule built on it; do not just update the expected values.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from aleph.env import laws
from aleph.errors import ConfigError


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=240,
    )


def test_pinned_torch_is_what_runs():
    # If this fails, the laws below were measured on another torch: re-measure them.
    assert torch.__version__.split("+")[0] == laws.PINNED_TORCH


def test_bare_import_torch_lacks_utils_checkpoint():
    proc = _run(
        """
        import torch
        print(torch.__version__.split('+')[0])
        print(hasattr(torch.utils, 'checkpoint'))
        import torch.utils.checkpoint
        print(hasattr(torch.utils, 'checkpoint'))
        """
    )
    assert proc.returncode == 0, proc.stderr
    version, before, after = proc.stdout.split()
    assert version == laws.PINNED_TORCH, "torch changed: revisit law 1 in aleph/env/laws.py"
    assert before == "False", "bare `import torch` now provides torch.utils.checkpoint"
    assert after == "True"


def test_compile_inside_checkpoint_fails_on_pinned_torch():
    # Reproduces the 2.4.1 failure in a fresh process, for a block without and with dropout
    # (the seed's RNG case); the plain checkpoint succeeds first, so the failure belongs to
    # the combination. On CPU both give the same FX error, not an RNG-state FakeTensor one.
    proc = _run(
        """
        import torch
        import torch.nn.functional as F
        import torch.utils.checkpoint as cp
        def plain(x):
            return torch.sin(x) * 2
        def dropout(x):
            return F.dropout(torch.sin(x) * 2, p=0.1, training=True)
        for block in (plain, dropout):
            x = torch.randn(8, requires_grad=True)
            cp.checkpoint(block, x, use_reentrant=False).sum().backward()
            print(block.__name__, "plain checkpoint ok")
            try:
                y = cp.checkpoint(torch.compile(block), x, use_reentrant=False)
                y.sum().backward()
                print(block.__name__, "compiled checkpoint ok")
            except Exception as e:
                print(block.__name__, "FAILED", type(e).__name__, str(e).replace("\\n", " "))
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert torch.__version__.startswith(laws.PINNED_TORCH)
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " FAILED " in line)
    for name in ("plain", "dropout"):
        assert f"{name} plain checkpoint ok" in proc.stdout
        assert f"{name} compiled checkpoint ok" not in proc.stdout, (
            f"compile inside checkpoint ({name}) works now: revisit law 2 (compile/checkpointing "
            "exclusion)")
        assert lines[name].startswith("FAILED BackendCompilerFailed"), proc.stdout
        assert "FX to symbolically trace a dynamo-optimized function" in lines[name]
        assert "FakeTensor" not in lines[name]  # if this appears, revisit law 2's citation


def test_config_rule_follows_the_law():
    with pytest.raises(ConfigError, match="compile and checkpointing are exclusive.*with or without dropout"):
        laws.check_compile_checkpointing(True, True, "2.4.1+cu124")
    laws.check_compile_checkpointing(True, False, "2.4.1")
    laws.check_compile_checkpointing(False, True, "2.4.1")
    laws.check_compile_checkpointing(True, True, "2.5.1")  # fixed upstream
    assert laws.compile_checkpoint_exclusive("2.4.1+cu124")
    assert not laws.compile_checkpoint_exclusive("2.8.0")


def test_checkpoint_fn_is_the_non_reentrant_checkpoint():
    fn = laws.checkpoint_fn()
    x = torch.randn(4, requires_grad=True)
    fn(torch.sin, x, use_reentrant=False).sum().backward()
    assert torch.allclose(x.grad, torch.cos(x.detach()))
