"""The HTML report opens in headless Chromium and every figure decodes (naturalWidth > 0); the
seed-paired Δ loss figure of a demo-like study and the runs' MLflow links open there too.

Needs Debian's `chromium` package (CI: apt-get install -y chromium); skipped when absent.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from orchestrator.report import build_report, render, run_links
from orchestrator.report.build import analyse
from orchestrator.report.query import query_study
from tests.fixtures.synthetic import MAIN
from tests.helpers import mlflow_store
from tests.synthetic_study import SyntheticStudy

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")

# Appended to a copy of the page: after load, write each <img>'s decode result into the DOM.
PROBE = """<script>
window.addEventListener('load', () => {
  const pre = document.createElement('pre');
  pre.id = 'imgcheck';
  pre.textContent = JSON.stringify([...document.images].map(
    i => ({alt: i.alt, complete: i.complete, w: i.naturalWidth, h: i.naturalHeight, src: i.src.slice(0, 22)})));
  document.body.appendChild(pre);
});
</script>"""


@pytest.mark.slow  # waits on child processes (CONTRIBUTING.md: test tiers)
@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install -y chromium)")
def test_html_report_renders_every_figure_in_headless_chromium(main_report, tmp_path):
    summary, out = main_report
    page = (out / "report.html").read_text()
    assert page.count("<img ") == len(summary["figures"]) >= 6
    assert "paired_dloss_vs_tokens.png" in summary["figures"]
    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("</body>", PROBE + "</body>"))
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--virtual-time-budget=10000",
        "--dump-dom",
        probe.as_uri(),
    ]
    dom = subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout
    m = re.search(r'<pre id="imgcheck">(.*?)</pre>', dom, re.S)
    assert m, f"probe did not run; chromium printed: {dom[:500]}"
    images = json.loads(html.unescape(m.group(1)))
    assert [i["alt"] for i in images] == summary["figures"]
    for img in images:
        assert img["src"] == "data:image/png;base64,", img  # self-contained: no file or http links
        assert img["complete"] and img["w"] > 100 and img["h"] > 100, img


# Like the demo (jobs/cpu-demo.yaml): standard vs coupled, two CPU scales, one seed, FLOP-matched,
# extend runs at 2x and 3x; the variant's FLOPs per token a little above the reference's.
DEMO_LIKE = SyntheticStudy(
    study="demo-like",
    scales={"cpu-xs": 2e6, "cpu-s": 8e6},
    seeds=(0,),
    extend=(2.0, 3.0),
    n_eval=8,
    budget_mode="flops",
    flops_factor={"coupled": 1.05},
)


def _chromium(tmp_path, *args: str) -> str:
    """Run headless Chromium with `args` (a --dump-dom or --screenshot and a file:// URI); its stdout."""
    cmd = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--virtual-time-budget=10000",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path).stdout


def _probe(tmp_path, page: str, script: str) -> Any:
    """Open `page` (HTML text) in Chromium with `script` (a JS expression) evaluated after load; its JSON value."""
    probe = tmp_path / "probe.html"
    hook = "<script>window.addEventListener('load', () => {const pre = document.createElement('pre'); pre.id = 'probe'; "
    hook += f"pre.textContent = JSON.stringify({script}); document.body.appendChild(pre);}});</script>"
    probe.write_text(page.replace("</body>", hook + "</body>"))
    dom = _chromium(tmp_path, "--dump-dom", probe.as_uri())
    m = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S)
    assert m, f"probe did not run; chromium printed: {dom[:500]}"
    return json.loads(html.unescape(m.group(1)))


def _screenshot_drawn(tmp_path, uri: str, name: str) -> np.ndarray:
    """A 1400x1000 headless Chromium screenshot of `uri` as an RGB array, asserted to show something."""
    shot = tmp_path / name
    _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1400,1000", "--hide-scrollbars", uri)
    assert shot.exists(), f"chromium wrote no screenshot of {uri}"
    rgb = plt.imread(shot)[..., :3]
    assert rgb.shape[:2] == (1000, 1400) and rgb.std() > 0.05, (uri, rgb.std())  # not a blank page
    return rgb


@pytest.mark.slow  # waits on child processes (CONTRIBUTING.md: test tiers)
@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install -y chromium)")
def test_the_demo_reports_paired_dloss_figure_opens_in_headless_chromium(tmp_path):
    uri = mlflow_store(tmp_path, DEMO_LIKE)
    out = tmp_path / "report"
    summary = build_report(DEMO_LIKE.study, uri, out, log_to_mlflow=False, n_boot=20)
    assert "paired_dloss_vs_tokens.png" in summary["figures"]
    curve = pd.read_csv(out / "paired_curve.csv")
    assert set(curve["scale"]) == {"cpu-xs", "cpu-s"} and set(curve["n_pairs"]) == {1}  # one seed: points, no interval
    assert "interpolated" in set(curve["read"])  # FLOP-matched: the variant's steps fall between the reference's
    _screenshot_drawn(tmp_path, (out / "paired_dloss_vs_tokens.png").as_uri(), "figure.png")
    _screenshot_drawn(tmp_path, (out / "report.html").as_uri(), "page.png")
    page = (out / "report.html").read_text()
    images = _probe(tmp_path, page, "[...document.images].map(i => ({alt: i.alt, w: i.naturalWidth, h: i.naturalHeight}))")
    fig = [i for i in images if i["alt"] == "paired_dloss_vs_tokens.png"]
    assert len(fig) == 1 and fig[0]["w"] > 500 and fig[0]["h"] > 200, images
    runs = pd.read_csv(out / "mlflow_runs.csv")
    shown = _probe(tmp_path, page, "document.body.innerText")
    assert "Runs in MLflow" in shown and all(r in shown for r in runs["run_uuid"])  # SQLite: the ids, no page to link


@pytest.mark.slow  # waits on child processes (CONTRIBUTING.md: test tiers)
@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install -y chromium)")
def test_on_a_server_every_run_links_to_its_mlflow_page_in_headless_chromium(synthetic_store, tmp_path):
    summary, tabs, _ = analyse(query_study(MAIN.study, synthetic_store), reference="standard", target="coupled", n_boot=20)
    served = summary | {"tracking_uri": "http://mlflow.example:5000", "figures": []}
    links = _probe(tmp_path, render.html(served, tabs, tmp_path), "[...document.links].map(a => [a.textContent, a.href])")
    eid, runs = summary["experiment_id"], tabs[run_links.TABLE]["run_uuid"]
    assert sorted(map(tuple, links)) == sorted((r, f"http://mlflow.example:5000/#/experiments/{eid}/runs/{r}") for r in runs)
