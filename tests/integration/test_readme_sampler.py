"""The README's "Seeded sampling" example runs as written: a request's generated tokens are the
same alone and in the batch, and every token is an id of the vocabulary."""

from __future__ import annotations

import pathlib
import re
from typing import Any

import pytest
import torch

pytestmark = pytest.mark.cpu
README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def _snippet() -> str:
    section = README.read_text().split("### Seeded sampling: `sampler`", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README: no python block under 'Seeded sampling'"
    return match.group(1)


def test_readme_sampler_example_runs_and_is_invariant() -> None:
    ns: dict[str, Any] = {}
    exec(compile(_snippet(), str(README), "exec"), ns)  # its own assert: request 2 alone == batched
    batched, alone, generate = ns["batched"], ns["alone"], ns["generate"]
    assert torch.equal(batched[2:], alone)
    assert batched.shape == (3, 5) and bool(((batched >= 0) & (batched < ns["V"])).all())
    # request 0 alone, too; and a greedy request follows the model's argmax
    first = generate(
        ns["prompts"][:1], ns["seeds"][:1], ns["temperature"][:1], ns["top_k"][:1], ns["top_p"][:1]
    )
    assert torch.equal(batched[:1], first)
    ids = batched[1]
    for i in range(1, ids.shape[0]):
        assert int(ids[i]) == int(ns["table"][ids[i - 1]].argmax())
