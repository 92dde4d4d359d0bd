"""Does ``batchinv bench`` agree with the outside measurement?  (issue 26: "within 10%").

Matches the points of a ``batchinv bench --out PREFIX`` report (``PREFIX.json``) with those of
the outside kit's ``side_by_side3.py --out sbs.jsonl`` (``../shared/tools``) by kernel and shape,
and compares the two ratios of the pinned kernel to the production path:

* bench: ``fast`` microseconds / the production baseline's, both from the bench report (the same
  calls per replay for every implementation, ``batchinv.harness.bench.INNER``);
* outside: the script's own ``ratio`` of batchinv to its production path.

One line per matched point (``diff``: the bench ratio over the outside one, minus 1), then a
summary: how many points agree within ``--within`` (default 10%), and the worst.  Points present
on one side only are counted, not guessed at.

    python ci/bench_vs_outside.py BENCH.json SBS.jsonl[.gz] [--within 0.10]

Exit status 0 whatever the agreement (the summary says it); 2 on unreadable input.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: A point's identity on both sides: (kernel, shape words...).
Key = tuple[Any, ...]


@dataclass(frozen=True)
class BenchRule:
    """How one bench component's cases map to outside points: the production baseline's name in
    the bench report (a name, or a function of the case's axes), and the key of a case's axes
    (None: a case the outside kit does not time)."""

    production: str | Callable[[dict[str, str]], str]
    key: Callable[[dict[str, str]], Key | None]

    def production_for(self, axes: dict[str, str]) -> str:
        return self.production if isinstance(self.production, str) else self.production(axes)


def _shape(axes: dict[str, str]) -> tuple[int, int]:
    rows, cols = axes["shape"].split("x")
    return int(rows), int(cols)


def _matmul_key(a: dict[str, str]) -> Key | None:
    if a.get("layout") != "linear" or a.get("bias") != "False":
        return None
    kind = {
        ("bf16", "bf16"): "matmul bf16",
        ("bf16", "fp32"): "router bf16->fp32",
        ("fp32", "fp32"): "router fp32",
    }
    name = kind.get((a["dtype"], a["out"]))
    return None if name is None else (name, int(a["n"]), int(a["k"]), int(a["rows"]))


#: bench component -> its rule.  The production path of each is the one the outside kit times.
BENCH_RULES: dict[str, BenchRule] = {
    # bf16 -> fp32 logits: the production path is cuBLAS in bf16, then a cast (torch_then_cast)
    "matmul": BenchRule(
        lambda a: "torch_then_cast" if (a["dtype"], a["out"]) == ("bf16", "fp32") else "torch_default",
        _matmul_key,
    ),
    "fp8_gemm": BenchRule(
        "torch_scaled_mm",
        lambda a: (
            ("fp8_gemm " + a["scales"], int(a["n"]), int(a["k"]), int(a["rows"]))
            if a.get("bias") == "False"
            else None
        ),
    ),
    "mean": BenchRule(
        "torch_native",
        lambda a: (
            ("mean " + a["dtype"], _shape(a)[1], _shape(a)[0]) if a.get("out_dtype") == "None" else None
        ),
    ),
    "log_softmax": BenchRule(
        "torch_native", lambda a: ("log_softmax " + a["dtype"], _shape(a)[1], _shape(a)[0])
    ),
    "rms_norm": BenchRule(
        "torch", lambda a: (f"rms_norm {a['dtype']}", int(a["hidden"]), int(a["num_rows"]))
    ),
}

_DTYPE = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}


def outside_key(p: dict[str, Any]) -> tuple[Key, str] | None:
    """The key of an outside point and the name of batchinv's implementation in it."""
    section, op = p.get("section"), p.get("op")
    if section == "matmul" and op == "linear":
        return ("matmul bf16", p["N"], p["K"], p["M"]), "batchinv"
    if section == "router" and op == "router_fp32_logits":
        return ("router bf16->fp32", p["N"], p["K"], p["M"]), "batchinv_fp32_out"
    if section == "router" and op == "router_fp32_ieee":
        return ("router fp32", p["N"], p["K"], p["M"]), "batchinv"
    if section == "fp8_gemm":
        return ("fp8_gemm " + p["scales"], p["N"], p["K"], p["M"]), "batchinv"
    if section == "mean":
        return ("mean " + p["dtype"], p["cols"], p["rows"]), "batchinv"
    if section == "log_softmax":
        return ("log_softmax " + p["dtype"], p["V"], p["rows"]), "batchinv"
    if section == "rms_norm" and op == "rms_norm":
        return (f"rms_norm {_DTYPE.get(p['dtype'], p['dtype'])}", p["H"], p["rows"]), "batchinv"
    return None  # topk: the kit times plain torch.topk, bench the masked one (no common production path)


def case_axes(case_id: str) -> dict[str, str]:
    """``"a=1-b=x-seed=0"`` -> ``{"a": "1", "b": "x", "seed": "0"}``."""
    return dict(part.split("=", 1) for part in case_id.split("-") if "=" in part)


def bench_ratios(report: dict[str, Any]) -> dict[Key, float]:
    """fast / production per matched bench case."""
    us: dict[tuple[str, str], dict[str, float]] = {}
    for p in report["points"]:
        us.setdefault((p["component"], p["case"]), {})[p["implementation"]] = float(p["microseconds"])
    out: dict[Key, float] = {}
    for (component, case), times in us.items():
        rule = BENCH_RULES.get(component)
        if rule is None:
            continue
        axes = case_axes(case)
        key, production = rule.key(axes), rule.production_for(axes)
        if key is not None and "fast" in times and production in times:
            out[key] = times["fast"] / times[production]
    return out


def outside_ratios(lines: Iterator[str]) -> dict[Key, float]:
    out: dict[Key, float] = {}
    for line in lines:
        p = json.loads(line)
        if p.get("kind") != "point":
            continue
        found = outside_key(p)
        if found is not None and found[1] in p.get("ratio", {}):
            out[found[0]] = float(p["ratio"][found[1]])
    return out


def _lines(path: Path) -> Iterator[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        yield from (line for line in f if line.strip())


def compare(bench: dict[Key, float], outside: dict[Key, float], within: float) -> tuple[list[str], bool]:
    """Report lines, and whether every matched point agrees within ``within``."""
    lines, worst, agree = [], 0.0, 0
    matched = sorted(set(bench) & set(outside), key=str)
    for key in matched:
        diff = bench[key] / outside[key] - 1.0
        worst = max(worst, abs(diff))
        agree += abs(diff) <= within
        mark = "" if abs(diff) <= within else "   <- outside the margin"
        shape = " ".join(str(v) for v in key[1:])
        lines.append(
            f"{key[0]:<22} {shape:<20} outside {outside[key]:.2f}x  bench {bench[key]:.2f}x  diff {diff:+.1%}{mark}"
        )
    lines.append(
        f"{agree} of {len(matched)} matched points agree within {within:.0%} (worst {worst:.1%}); "
        f"bench only: {len(set(bench) - set(outside))}, outside only: {len(set(outside) - set(bench))}"
    )
    return lines, agree == len(matched) and bool(matched)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench", type=Path, help="batchinv bench's PREFIX.json")
    parser.add_argument("outside", type=Path, help="side_by_side3.py's --out file (.jsonl or .jsonl.gz)")
    parser.add_argument("--within", type=float, default=0.10)
    args = parser.parse_args(argv)
    try:
        bench = bench_ratios(json.loads(args.bench.read_text()))
        outside = outside_ratios(_lines(args.outside))
    except (OSError, ValueError, KeyError) as exc:
        print(f"bench_vs_outside: cannot read the inputs: {exc}", file=sys.stderr)
        return 2
    lines, _ = compare(bench, outside, args.within)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
