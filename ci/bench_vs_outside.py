"""Does ``batchinv bench`` agree with the outside measurement?  (issue 26: "within 10%").

Matches the points of a ``batchinv bench --out PREFIX`` report (``PREFIX.json``) with those of
the outside kit's ``side_by_side3.py --out sbs.jsonl`` (``../shared/tools``) by kernel, dtype and
shape, and compares the two ratios of the pinned kernel to the production path:

* bench: ``fast`` microseconds / the production baseline's, both from the bench report (the same
  calls per replay for every implementation of a case, by the kit's rule from the fastest:
  ``batchinv.harness.bench.case_calls_per_replay``);
* outside: the script's own ``ratio`` of batchinv to its production path.

Only like with like is matched: bench cases in the kit's layout (contiguous rows, no bias, the
default output dtype, 2-D), outside points of the kit's production dtypes, a header that is not
the kit's CPU smoke run nor a TF32 run.  One line per matched point (``diff``: the bench ratio
over the outside one, minus 1), then a summary: how many points agree within ``--within``
(default 10%), the worst, the points on one side only, the outside points without a ratio (the
kit's baseline or batchinv errored there) and the keys seen twice (the last one kept).

    python ci/bench_vs_outside.py BENCH.json[.gz] SBS.jsonl[.gz] [--within 0.10]

Exit status 0 when points matched (whatever their agreement: the summary says it), 1 when none
did, 2 on unreadable or unusable input.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

#: A point's identity on both sides: (kernel and dtype, shape numbers...).
Key = tuple[Any, ...]


class InputError(ValueError):
    """An input this script cannot compare (said in one line, exit status 2)."""


@dataclass(frozen=True)
class BenchRule:
    """How one bench component's cases map to outside points: the production baseline's name in
    the bench report (a name, or a function of the case's axes), and the key of a case's axes
    (None: a case the outside kit does not time)."""

    production: str | Callable[[dict[str, str]], str]
    key: Callable[[dict[str, str]], Key | None]

    def production_for(self, axes: dict[str, str]) -> str:
        return self.production if isinstance(self.production, str) else self.production(axes)


def _rows_cols(axes: dict[str, str]) -> tuple[int, int] | None:
    """``shape=RxC`` of a 2-D case (None for another rank: the kit times 2-D rows)."""
    dims = axes.get("shape", "").split("x")
    return (int(dims[0]), int(dims[1])) if len(dims) == 2 else None


def _matmul_key(a: dict[str, str]) -> Key | None:
    if a.get("layout") != "linear" or a.get("bias") != "False":
        return None
    kind = {
        ("bf16", "bf16"): "matmul bf16",
        ("bf16", "fp32"): "router bf16->fp32",
        ("fp32", "fp32"): "router fp32",
    }
    name = kind.get((a.get("dtype", ""), a.get("out", "")))
    return None if name is None else (name, int(a["n"]), int(a["k"]), int(a["rows"]))


def _fp8_key(a: dict[str, str]) -> Key | None:
    if a.get("bias") != "False" or a.get("out") != "bf16":
        return None
    return ("fp8_gemm " + a["scales"], int(a["n"]), int(a["k"]), int(a["rows"]))


def _mean_key(a: dict[str, str]) -> Key | None:
    shape = _rows_cols(a)
    default = (a.get("layout"), a.get("keepdim"), a.get("out_dtype")) == ("contiguous", "False", "None")
    return None if shape is None or not default else ("mean " + a["dtype"], shape[1], shape[0])


def _log_softmax_key(a: dict[str, str]) -> Key | None:
    shape = _rows_cols(a)
    default = (a.get("layout"), a.get("half_to_float")) == ("contiguous", "False")
    return None if shape is None or not default else ("log_softmax " + a["dtype"], shape[1], shape[0])


def _rms_norm_key(a: dict[str, str]) -> Key | None:
    if a.get("layout") != "contiguous":
        return None
    return (f"rms_norm {a['dtype']}", int(a["hidden"]), int(a["num_rows"]))


#: bench component -> its rule.  The production path of each is the one the outside kit times.
BENCH_RULES: dict[str, BenchRule] = {
    # bf16 -> fp32 logits: the production path is cuBLAS in bf16, then a cast (torch_then_cast)
    "matmul": BenchRule(
        lambda a: (
            "torch_then_cast" if (a.get("dtype"), a.get("out")) == ("bf16", "fp32") else "torch_default"
        ),
        _matmul_key,
    ),
    "fp8_gemm": BenchRule("torch_scaled_mm", _fp8_key),
    "mean": BenchRule("torch_native", _mean_key),
    "log_softmax": BenchRule("torch_native", _log_softmax_key),
    "rms_norm": BenchRule("torch", _rms_norm_key),
}

_DTYPE = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}


def outside_key(p: dict[str, Any]) -> tuple[Key, str] | None:
    """The key of an outside point and the name of batchinv's implementation in it (None: a
    point with no bench counterpart).  topk is left out: the kit times plain torch.topk, bench
    the masked torch.topk baseline (no common production path)."""
    section, op, dtype = p.get("section"), p.get("op"), p.get("dtype")
    if section == "matmul" and op == "linear" and dtype == "bfloat16":
        return ("matmul bf16", p["N"], p["K"], p["M"]), "batchinv"
    if section == "router" and op == "router_fp32_logits" and dtype == "bfloat16":
        return ("router bf16->fp32", p["N"], p["K"], p["M"]), "batchinv_fp32_out"
    if section == "router" and op == "router_fp32_ieee" and dtype == "float32":
        return ("router fp32", p["N"], p["K"], p["M"]), "batchinv"
    if section == "fp8_gemm":
        return ("fp8_gemm " + p["scales"], p["N"], p["K"], p["M"]), "batchinv"
    if section == "mean":
        return ("mean " + p["dtype"], p["cols"], p["rows"]), "batchinv"
    if section == "log_softmax":
        return ("log_softmax " + p["dtype"], p["V"], p["rows"]), "batchinv"
    if section == "rms_norm" and op == "rms_norm":
        return (f"rms_norm {_DTYPE.get(p['dtype'], p['dtype'])}", p["H"], p["rows"]), "batchinv"
    return None


@dataclass
class Side:
    """One side's ratios by key, with what could not be used."""

    ratios: dict[Key, float] = field(default_factory=dict)
    duplicates: int = 0
    no_ratio: int = 0

    def add(self, key: Key, ratio: object) -> None:
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not ratio > 0:
            self.no_ratio += 1
            return
        self.duplicates += key in self.ratios
        self.ratios[key] = float(ratio)


def case_axes(case_id: str) -> dict[str, str]:
    """``"a=1-b=x-seed=0"`` -> ``{"a": "1", "b": "x", "seed": "0"}``."""
    return dict(part.split("=", 1) for part in case_id.split("-") if "=" in part)


def bench_ratios(report: object) -> Side:
    """fast / production per matched bench case."""
    if not isinstance(report, dict) or not isinstance(report.get("points"), list):
        raise InputError("the bench report has no list of points")
    us: dict[tuple[str, str], dict[str, float]] = {}
    for p in report["points"]:
        if not isinstance(p, dict):
            raise InputError(f"a bench point is not an object: {p!r}")
        us.setdefault((p["component"], p["case"]), {})[p["implementation"]] = p["microseconds"]
    side = Side()
    for (component, case), times in us.items():
        rule = BENCH_RULES.get(component)
        if rule is None:
            continue
        axes = case_axes(case)
        production = rule.production_for(axes)
        if "fast" not in times or production not in times:
            continue
        key = rule.key(axes)
        if key is not None:
            fast, base = times["fast"], times[production]
            ok = all(isinstance(t, (int, float)) and t > 0 for t in (fast, base))
            side.add(key, fast / base if ok else None)
    return side


def outside_ratios(lines: Iterator[str]) -> Side:
    side = Side()
    for line in lines:
        p = json.loads(line)
        if not isinstance(p, dict):
            raise InputError(f"an outside line is not an object: {line.strip()[:80]}")
        if p.get("kind") == "header" and (p.get("smoke") or p.get("allow_tf32")):
            raise InputError("the outside file is the kit's CPU smoke run or a TF32 run: not comparable")
        if p.get("kind") != "point":
            continue
        found = outside_key(p)
        if found is not None:
            ratios = p.get("ratio")
            side.add(found[0], ratios.get(found[1]) if isinstance(ratios, dict) else None)
    return side


def _open(path: Path) -> IO[str]:
    """``path`` opened for reading text, through gzip when it ends in ``.gz``."""
    return gzip.open(path, "rt") if path.suffix == ".gz" else open(path)


def _lines(path: Path) -> Iterator[str]:
    with _open(path) as f:
        yield from (line for line in f if line.strip())


def compare(bench: Side, outside: Side, within: float) -> tuple[list[str], int]:
    """Report lines, and the number of matched points."""
    lines, worst, agree = [], 0.0, 0
    matched = sorted(set(bench.ratios) & set(outside.ratios), key=str)
    for key in matched:
        b, o = bench.ratios[key], outside.ratios[key]
        diff = b / o - 1.0
        worst = max(worst, abs(diff))
        agree += abs(diff) <= within
        mark = "" if abs(diff) <= within else "   <- outside the margin"
        shape = " ".join(str(v) for v in key[1:])
        lines.append(f"{key[0]:<22} {shape:<20} outside {o:.2f}x  bench {b:.2f}x  diff {diff:+.1%}{mark}")
    rest = (
        f"bench only: {len(set(bench.ratios) - set(outside.ratios))}, "
        f"outside only: {len(set(outside.ratios) - set(bench.ratios))}, "
        f"outside without a ratio: {outside.no_ratio}, bench without one: {bench.no_ratio}, "
        f"keys seen twice (last kept): bench {bench.duplicates}, outside {outside.duplicates}"
    )
    if matched:
        lines.append(
            f"{agree} of {len(matched)} matched points agree within {within:.0%} (worst {worst:.1%}); {rest}"
        )
    else:
        lines.append(f"no points matched; {rest}")
    return lines, len(matched)


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1), e.g. 0.10; got {text}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("bench", type=Path, help="batchinv bench's PREFIX.json")
    parser.add_argument("outside", type=Path, help="side_by_side3.py's --out file (.jsonl or .jsonl.gz)")
    parser.add_argument("--within", type=_fraction, default=0.10, help="the margin, a fraction (0.10: 10%%)")
    args = parser.parse_args(argv)
    try:
        with _open(args.bench) as f:
            bench = bench_ratios(json.load(f))
        outside = outside_ratios(_lines(args.outside))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        print(f"bench_vs_outside: cannot read the inputs: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    lines, matched = compare(bench, outside, args.within)
    print("\n".join(lines))
    return 0 if matched else 1


if __name__ == "__main__":
    sys.exit(main())
