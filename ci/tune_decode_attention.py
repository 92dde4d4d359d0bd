"""Tuning aid for the decode-attention split kernel (GPU lanes): times the pinned launcher under
candidate configs (split size, chunk size, warps, stages, the weights-times-values variant) at a
few bench points, and checks that configs with the same ``split_tokens`` and ``block_n`` agree
bit for bit where they must (warps and stages never change a program's arithmetic order...
which this script measures rather than assumes: differing bits are printed).

    python ci/tune_decode_attention.py     # prints a table

The table in ``fast/decode_attention.py`` is keyed on (arch, D, dtype) only; this script is how
its GPU entries were chosen (docs/BENCHMARKS.md records the run).
"""

from __future__ import annotations

import functools
import itertools
from typing import Any

import torch

from batchinv.fast.decode_attention import DecodeAttentionConfig, launch
from batchinv.harness.bench import COPY_BYTES_PER_S, time_call
from batchinv.harness.components import decode_attention as component
from batchinv.harness.registry import Case
from batchinv.reference.decode_attention import AttentionShape, check_decode_attention_arguments

POINTS = (
    (1, 1024, "equal"),
    (8, 8192, "equal"),
    (64, 8192, "equal"),
    (256, 8192, "mixed"),
    (64, 32768, "equal"),
)


def main() -> int:
    device = torch.device("cuda")
    candidates = [
        DecodeAttentionConfig(split, block_n, warps, True, pair, stages)
        for split, block_n, warps, stages, pair in itertools.product(
            (256, 512), (32, 64), (4, 8), (1, 2, 3), (False, True)
        )
        if split % block_n == 0
    ]
    print("R ctx lengths | split block_n warps stages pair | us | of floor")
    for r, ctx, lengths in POINTS:
        axes = dict(R=r, Q=1, Hq=32, Hkv=8, D=128, page_size=16, dtype="bfloat16", lengths=lengths)
        batch = component.build(
            Case(component.NAME, dict(axes, longest=ctx, sparse_k=0, fill="device")), device
        )
        kw = batch.kwargs()
        shape = check_decode_attention_arguments(**kw)
        floor = component.bench_bytes(batch) / COPY_BYTES_PER_S * 1e6

        def run(
            cfg: DecodeAttentionConfig, kw: dict[str, Any] = kw, shape: AttentionShape = shape
        ) -> tuple[torch.Tensor, torch.Tensor]:
            args = (kw["q"], kw["k_cache"], kw["v_cache"], kw["block_table"], kw["seq_lens"], kw["scale"])
            return launch(*args, None, shape, cfg)

        results = []
        for cfg in candidates:
            fn = functools.partial(run, cfg)
            try:
                us, _ = time_call(fn, 10)
            except Exception as exc:  # a config that does not compile or fit
                print(f"{r} {ctx} {lengths} | {cfg}: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
                continue
            results.append((us, cfg))
        results.sort(key=lambda t: t[0])
        for us, cfg in results[:8]:
            print(
                f"{r} {ctx} {lengths} | {cfg.split_tokens} {cfg.block_n} {cfg.num_warps} {cfg.num_stages} "
                f"{cfg.weight_pair} | {us:.1f} | {100 * floor / us:.0f}%"
            )
        # bits: warps/stages variants of one (split, block_n, pair) must agree
        groups: dict[tuple[int, int, bool], list[DecodeAttentionConfig]] = {}
        for cfg in candidates:
            groups.setdefault((cfg.split_tokens, cfg.block_n, cfg.weight_pair), []).append(cfg)
        for key, cfgs in groups.items():
            outs = [run(c) for c in cfgs]
            same = all(torch.equal(o[0], outs[0][0]) and torch.equal(o[1], outs[0][1]) for o in outs[1:])
            if not same:
                print(f"{r} {ctx} {lengths} | split/block_n/pair {key}: warps/stages variants DIFFER in bits")
        del batch, kw
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
