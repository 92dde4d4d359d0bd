"""The minimal repro of docs/upstream/vllm-mean-row-start.md, run on a GPU (device step ``vllm:repro``).

    PYTHONPATH=.vllm-shim python3 ci/vllm_mean_repro.py [OUT.txt]

vLLM 0.32.0's ``mean_batch_invariant`` (through the byte-for-byte shim of ``ci/vllm_gpu.sh
prepare``) on the same fp32 rows placed at element offsets 0, 1, 2, 4, 7, 8, 16, 31, 32, 33 of a
NaN-filled buffer: per offset, how many rows give other bits than at offset 0.  Then every
variant of ``mean_kernel`` that Triton compiled for those launches, with the pointer
specialization it was compiled for (16-byte divisibility) and the blocked layouts of its TTGIR
(``sizePerThread``): the suspected cause, one addition tree per load vectorization.
"""

from __future__ import annotations

import re
import sys

import torch
from vllm.model_executor.determinism import batch_invariant as bi

OFFSETS = (0, 1, 2, 4, 7, 8, 16, 31, 32, 33)
SHAPES = ((1024, 151936, 1e3), (300, 8192, 1.0), (64, 8192, 1.0))


def main() -> int:
    lines: list[str] = [f"torch {torch.__version__}, GPU {torch.cuda.get_device_name()}"]
    for rows, cols, scale in SHAPES:
        torch.manual_seed(0)
        x = torch.randn(rows, cols, device="cuda", dtype=torch.float32) * scale
        alone = bi.mean_batch_invariant(x, [-1])
        counts = []
        for offset in OFFSETS:
            buf = torch.full((offset + rows * cols,), float("nan"), device="cuda")
            buf[offset:] = x.reshape(-1)
            moved = buf[offset:].view(rows, cols)
            assert torch.equal(moved, x)
            got = bi.mean_batch_invariant(moved, [-1])
            counts.append(f"+{offset}: {int((alone.view(torch.int32) != got.view(torch.int32)).sum())}")
        lines.append(
            f"{rows} x {cols} fp32 randn*{scale:g}, rows differing from offset 0: " + ", ".join(counts)
        )
    kernel = bi.mean_kernel
    variants = []
    for cache in getattr(kernel, "device_caches", {}).values():
        variants += list(cache[0].values())
    lines.append(f"mean_kernel: {len(variants)} compiled variant(s)")
    for compiled in variants:
        ttgir = compiled.asm.get("ttgir", "")
        head = next((ln for ln in ttgir.splitlines() if "tt.func public @mean_kernel" in ln), "")
        ptr = re.search(r"%arg0: !tt.ptr<f32>( \{[^}]*\})?", head)
        layouts = sorted(set(re.findall(r"sizePerThread = \[[^\]]*\]", ttgir)))
        lines.append(f"  input_ptr {ptr.group(0) if ptr else '?'}; layouts {', '.join(layouts)}")
    text = "\n".join(lines)
    print(text)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
