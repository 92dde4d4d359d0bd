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
    for key in sorted(table):
        c = table[key]
        if baseline[key]:
            verdict = "detected" if c["fail"] else ("crashed" if c["error"] else "not detected here")
            if c["error"]:
                bad.append(key)
        elif unknown[key]:
            verdict = "FAILED"
            bad.append(key)
        elif c["fail"]:
            verdict = "known: " + KNOWN[key][1]
        else:
            verdict = "ok" if c["pass"] else "skipped"
        print(
            f"{key[0]:<12} {key[1]:<13} {key[2]:<18} {c['pass']:>5} {c['fail']:>5} {c['skip']:>5} {c['error']:>5}  {verdict}"
        )
    for key in bad:
        print(f"NEW FAILURE {'/'.join(key)}: see the repro lines in {path}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
