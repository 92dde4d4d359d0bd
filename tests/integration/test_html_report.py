"""``batchinv report``: the HTML page from real sweeps, opened in a real browser.

Two small cpu-lane sweeps of ``mean`` through the CLI make the reports: a passing one (the
shipped kernel and its negative controls) and a failing one (the unpinned production-style
baseline swept as if it were the fast kernel: its batch prefix changes bits).  Both are
rendered with a committed H200 bench report.  The page is checked for what it must show
(against the rows the harness wrote), then opened in headless Chromium (Debian's package,
driven through Playwright's Python client without its own browser download): no console error,
no page error, no request leaving the page, the script ran, and a full-page screenshot that is
not blank.  Without Chromium (or Playwright) the browser test skips with the reason, unless
``BATCHINV_REQUIRE_BROWSER=1`` (CI: ``.ci/run``) makes it a failure.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from batchinv.harness.cli import main
from batchinv.harness.report import read_report
from batchinv.harness.report_plots import heatmap_matrix

# one worker under --dist loadgroup: the module fixture (two sweeps) runs once
pytestmark = [pytest.mark.cpu, pytest.mark.xdist_group("html_report")]

ROOT = Path(__file__).resolve().parents[2]
#: A bench report the harness wrote on the H200 (docs/DEVICE_RUNS.md, run 41).
BENCH = ROOT / "docs/device-runs/2026-12-01-h200-sm90/run41/bench.json"
HEURISTIC = "heur=batchinv.fast.baselines.mean:triton_rows_heuristic_mean"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """{"pass": (jsonl, html), "fail": (jsonl, html)} from two real sweeps, rendered."""
    folder = tmp_path_factory.mktemp("reports")
    out = {}
    for name, extra in (("pass", []), ("fail", ["--subject", HEURISTIC])):
        jsonl = folder / f"{name}.jsonl"
        args = ["sweep", "mean", "--lane", "cpu", "--jobs", "1", "--no-progress", "--max-m", "4"]
        code = main([*args, *extra, "--report", str(jsonl)])
        assert code == (0 if name == "pass" else 1)
        html_path = folder / f"{name}.html"
        assert main(["report", str(jsonl), "--bench", str(BENCH), "-o", str(html_path)]) == 0
        out[name] = (jsonl, html_path)
    return out


def _rows(jsonl: Path) -> list[dict]:
    return [r for r in read_report(jsonl) if r.get("kind") == "check"]


def test_the_failing_page_shows_the_failure_the_rows_record(reports):
    jsonl, page = reports["fail"]
    text = page.read_text(encoding="utf-8")
    rows = _rows(jsonl)
    failed = [r for r in rows if r["check"] == "batch_prefix" and r["status"] == "fail"]
    assert failed, "the unpinned baseline's batch prefix must fail"
    r = failed[0]
    # the row carries its sweep points and the first difference in hex (harness/invariance.py)
    assert r["points"] and r["first"]["expected_bits"].startswith("0x")
    assert r["first"]["expected_bits"] != r["first"]["actual_bits"]
    ids, cells = heatmap_matrix(r["points"])
    assert any(2 in row for row in cells) and any(1 in row for row in cells)
    assert r["first"]["row"] in ids
    # the heatmap's M=1 column against the bits computed here: row 0 alone vs in the whole case
    import torch

    from batchinv.fast.baselines.mean import triton_rows_heuristic_mean
    from batchinv.harness.registry import Case, get

    batch = get("mean").build(Case("mean", r["axes"], r["seed"]), torch.device("cpu"))
    whole = triton_rows_heuristic_mean(**batch.kwargs())
    alone = triton_rows_heuristic_mean(**batch.take(slice(0, 1)).kwargs())
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[whole.element_size()]
    changed = not torch.equal(whole[:1].contiguous().view(bits), alone.contiguous().view(bits))
    m1 = next(p for p in r["points"] if p["label"] == "M=1")
    assert (0 in m1["differing"]) == changed and m1["compared"] == [[0, 1]]
    assert 'id="verdict">FAILED' in text
    assert r["first"]["expected_bits"] in text and r["first"]["actual_bits"] in text
    # every matrix cell links to an anchor the page has; the failing cell is coloured so
    links = re.findall(r'<td class="cell ([a-z-]+)" data-status="[^"]+"><a href="#([^"]+)"', text)
    assert ("fail", "c-mean-heur-batch-prefix") in links
    for _, anchor in links:
        assert f'id="{anchor}"' in text
    assert text.count("<svg") >= 2  # a heatmap and the bench plot at least
    assert "batchinv repro mean --check batch_prefix --subject heur=" in text
    assert "H100" in text or "H200" in text  # the bench section, from the bench report


def test_the_passing_page_shows_the_controls_and_no_failure(reports):
    jsonl, page = reports["pass"]
    text = page.read_text(encoding="utf-8")
    assert 'id="verdict">OK' in text
    assert 'class="cell fail"' not in text and 'class="cell error"' not in text
    summary = next(r for r in read_report(jsonl) if r.get("kind") == "summary")
    detected = [c for c in summary["controls"] if c["verdict"] == "detected"]
    assert detected
    for c in detected:  # each detection names the check that caught it
        row = next(r for r in _rows(jsonl) if r["subject"] == c["baseline"] and r["status"] == "fail")
        assert f"{c['component']}/{c['baseline']}: detected by {row['check']}" in text
    header = next(r for r in read_report(jsonl) if r.get("kind") == "header")
    for key in ("lane", "device", "torch", "triton", "date"):
        assert json.dumps(header[key]).strip('"') in text
    assert "flush-to-zero probe" in text and "git revision" in text


def test_a_committed_gpu_report_renders_gzipped(tmp_path):
    """A report the harness wrote on the H200 (sdpa_attention's controls detected), read as .gz."""
    committed = ROOT / "docs/device-runs/2026-12-02-h200-sm90/run46/sweep.jsonl.gz"
    page = tmp_path / "run46.html"
    assert main(["report", str(committed), "-o", str(page)]) == 0
    text = page.read_text(encoding="utf-8")
    assert "NVIDIA H200" in text and "sm90" in text and "torch_sdpa</td>" in text


def test_report_refuses_what_is_not_a_report(tmp_path, capsys):
    stray = tmp_path / "notes.jsonl"
    stray.write_text('{"hello": 1}\n')
    assert main(["report", str(stray)]) == 2
    assert "expected a batchinv JSON-lines report" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "missing.jsonl")]) == 2


# --- the browser ------------------------------------------------------------------------------


def _browser() -> tuple[object | None, str]:
    """Playwright's sync API and the Chromium path, or (None, why not)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None, "the playwright Python package is not installed (it comes with the [dev] extra)"
    if chromium is None:
        return None, "no chromium on PATH (Debian: apt-get install chromium)"
    return sync_playwright, chromium


def _need_browser() -> tuple[object, str]:
    api, where = _browser()
    if api is None:
        if os.environ.get("BATCHINV_REQUIRE_BROWSER") == "1":
            pytest.fail(f"BATCHINV_REQUIRE_BROWSER=1 and no browser: {where}")
        pytest.skip(f"no headless browser here: {where}")
    return api, where


def open_page(api, chromium: str, page_path: Path, screenshot: Path) -> dict:
    """Open ``page_path`` in headless Chromium (a new empty profile) and report what happened:
    console errors, page errors, requests that left the page, whether its script ran, and a
    full-page screenshot written to ``screenshot``."""
    seen: dict = {"console": [], "pageerror": [], "requests": []}
    profile = tempfile.mkdtemp(prefix="batchinv-chromium-")
    try:
        with api() as p:
            context = p.chromium.launch_persistent_context(
                profile,
                executable_path=chromium,
                headless=True,
                args=CHROMIUM_FLAGS[1:],
                viewport={"width": 1280, "height": 900},
            )
            try:
                page = context.new_page()
                page.on("console", lambda m: seen["console"].append(m.text) if m.type == "error" else None)
                page.on("pageerror", lambda e: seen["pageerror"].append(str(e)))
                page.on(
                    "request",
                    lambda r: (
                        None
                        if r.url.startswith(("file:", "data:", "about:"))
                        else seen["requests"].append(r.url)
                    ),
                )
                page.goto(page_path.as_uri(), wait_until="load")
                seen["ready"] = page.get_attribute("html", "data-ready")
                seen["svgs"] = page.evaluate(
                    "Array.from(document.querySelectorAll('svg'))"
                    ".filter(s => s.getBoundingClientRect().width > 50).length"
                )
                page.screenshot(path=str(screenshot), full_page=True)
            finally:
                context.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    return seen


def _not_blank(png: Path) -> None:
    from PIL import Image

    with Image.open(png) as img:
        rgb = img.convert("RGB")
        colours = rgb.getcolors(maxcolors=1 << 16)
        assert colours is None or len(colours) > 1, f"{png}: one colour"
        assert rgb.getbbox() is not None
        # not all white: something dark is drawn (text, the plots)
        assert min(rgb.convert("L").getextrema()) < 128, f"{png}: nothing dark drawn"


def test_the_pages_render_in_headless_chromium(reports, tmp_path):
    api, chromium = _need_browser()
    for name in ("fail", "pass"):
        _, page = reports[name]
        shot = tmp_path / f"{name}.png"
        seen = open_page(api, chromium, page, shot)
        assert seen["console"] == [] and seen["pageerror"] == [], (name, seen)
        assert seen["requests"] == [], f"{name}: the page reached out: {seen['requests']}"
        assert seen["ready"] == "1", f"{name}: the page's script did not run"
        assert seen["svgs"] >= 1, f"{name}: no plot drawn"
        _not_blank(shot)


def test_the_browser_check_catches_a_broken_page(tmp_path):
    """The console check has teeth: a page whose script throws is reported."""
    api, chromium = _need_browser()
    broken = tmp_path / "broken.html"
    broken.write_text("<!DOCTYPE html><html><body><p>x</p><script>notDefined();</script></body></html>")
    seen = open_page(api, chromium, broken, tmp_path / "broken.png")
    assert seen["pageerror"] and "notDefined" in seen["pageerror"][0]
