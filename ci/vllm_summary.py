"""Summarise a ``batchinv sweep`` report of vLLM's subjects (``ci/vllm.sh``) and judge it.

Prints one row per (component, subject, check): pass / fail / skip / error counts, and for a
negative control whether it was detected.  Exit status 1 when a check of vLLM's invariant kernels
fails or errors other than the :data:`KNOWN` findings (each with its reason, printed), or when
a baseline crashes; 0 otherwise.

    python ci/vllm_summary.py REPORT.jsonl
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict

#: (component, subject, check) -> (the cases' axes it is known for, none: every case; why), found
#: by ci/vllm.sh on the cpu lane (vLLM 0.32.0).  A failure outside these is a new failure.
KNOWN: dict[tuple[str, str, str], tuple[dict[str, object], str]] = {
    ("matmul", "vllm", "position"): (
        {},
        "cpu-lane artefact: the Triton interpreter's tl.dot is numpy's matmul, whose summation order "
        "depends on a row's position in the tile (batchinv's own matmul avoids tl.dot there)",
    ),
    ("softmax", "vllm", "agreement"): (
        {"dtype": "bfloat16"},
        "cpu-lane artefact: the Triton 3.6 interpreter's fp32 -> bf16 cast truncates (checked: vLLM's "
        "bf16 outputs equal its fp32 outputs truncated), 1 ULP beyond the bound",
    ),
    ("rms_norm", "vllm", "agreement"): (
        {},
        "vLLM's RMSNorm sums squares in fp32 and rounds twice (x * rstd, then * weight): squares of "
        "|x| > ~1.8e19 overflow (the row comes out 0) or of tiny x underflow, and fp32 gaussian rows are "
        "3 ULP off, outside the rms_norm contract (fp64 sum of squares, one rounding); invariant all the same",
    ),
    ("mean", "vllm", "agreement"): (
        {},
        "vLLM's mean is a sequential fp32 sum, not the one rounding of the exact mean that the mean "
        "component's contract asks for (it is invariant: every invariance check passes)",
    ),
}


def main(path: str) -> int:
    rows = [json.loads(line) for line in open(path)]
    checks = [r for r in rows if r.get("kind") == "check"]
    table: dict[tuple[str, str, str], Counter[str]] = defaultdict(Counter)
    baseline: dict[tuple[str, str, str], bool] = {}
    unknown: Counter[tuple[str, str, str]] = Counter()
    for r in checks:
        key = (r["component"], r["subject"], r["check"])
        table[key][r["status"]] += 1
        axes, _ = KNOWN.get(key, (None, ""))
        if r["status"] == "error" or (
            r["status"] == "fail" and (axes is None or any(r["axes"].get(k) != v for k, v in axes.items()))
        ):
            unknown[key] += 1
        baseline[key] = bool(r.get("negative_control"))
    bad = []
    print(
        f"{'component':<12} {'subject':<13} {'check':<18} {'pass':>5} {'fail':>5} {'skip':>5} {'error':>5}  verdict"
    )
    for key in sorted(k for k in table if not baseline[k]):
        c = table[key]
        if unknown[key]:
            verdict = "FAILED"
            bad.append(key)
        elif c["fail"]:
            verdict = "known: " + KNOWN[key][1]
        else:
            verdict = "ok" if c["pass"] else "skipped"
        row = f"{key[0]:<12} {key[1]:<13} {key[2]:<18} {c['pass']:>5} {c['fail']:>5} {c['skip']:>5} {c['error']:>5}"
        print(f"{row}  {verdict}")
    print("\nnegative controls (vLLM's default paths; they vary on a GPU, where cuBLAS and CUDA reductions")
    print("pick their split by the batch; on a CPU torch's row-local kernels may not):")
    controls = sorted({(k[0], k[1]) for k in table if baseline[k]})
    for component, subject in controls:
        found = [r for r in checks if (r["component"], r["subject"]) == (component, subject)]
        hits = [r for r in found if r["status"] == "fail"]
        errors = [r for r in found if r["status"] == "error"]
        if errors:
            verdict = f"CRASHED in {errors[0]['check']} [{errors[0]['case']}]"
            bad.append((component, subject, errors[0]["check"]))
        elif hits:
            verdict = f"detected by {hits[0]['check']} [{hits[0]['case']}]"
        else:
            ran = sum(r["status"] == "pass" for r in found)
            verdict = f"not detected on this lane ({ran} checks ran, no difference)"
        print(f"{component:<12} {subject:<13} {verdict}")
    for key in bad:
        print(f"NEW FAILURE {'/'.join(key)}: see the repro lines in {path}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
