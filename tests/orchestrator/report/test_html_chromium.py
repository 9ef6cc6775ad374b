"""The HTML report opens in headless Chromium and every figure decodes (naturalWidth > 0).

Needs Debian's `chromium` package (CI: apt-get install -y chromium); skipped when absent.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess

import pytest

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


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install -y chromium)")
def test_html_report_renders_every_figure_in_headless_chromium(main_report, tmp_path):
    summary, out = main_report
    page = (out / "report.html").read_text()
    assert page.count("<img ") == len(summary["figures"]) >= 6
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
