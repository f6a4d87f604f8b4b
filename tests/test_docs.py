"""The README's five-line example runs as written."""

import re
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def test_readme_quick_start_runs():
    text = (ROOT / "README.md").read_text()
    block = re.findall(r"```python\n(.*?)```", text, flags=re.S)[0]
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)
    trace = namespace["trace"]
    assert trace.regret.shape == (500, 100)
    assert torch.isfinite(trace.regret).all()
