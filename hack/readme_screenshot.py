"""The README's picture of the report: `docs/report.png`, taken from a real run's page in headless
Chromium (the tests' CDP client), cropped to the first screen (the verdict, one sample with its loss
mask) and the spend plots.

    eyrie run examples/quickstart.yaml && python hack/readme_screenshot.py examples/eyrie-out/quickstart
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from browser import open_page  # noqa: E402

from eyrie.jobs.report import collect  # noqa: E402
from eyrie.jobs.report.html import render  # noqa: E402
from eyrie.jobs.store import open_store  # noqa: E402

READY = ("Array.from(document.querySelectorAll('.plotly-graph-div'))"
         ".every(d => d.querySelector('svg.main-svg') !== null)")
# the first screen (the verdict, the sample with its loss mask) and the spend plots, without plotly's tool bars
CLIP = """(() => {
  document.querySelectorAll('.modebar-container').forEach(m => m.style.display = 'none');
  const top = document.querySelector('#verdict').getBoundingClientRect().top + window.scrollY - 8;
  const hs = Array.from(document.querySelectorAll('h2'));
  const spend = hs.find(h => h.textContent === 'Spend and throughput');
  const after = hs[hs.indexOf(spend) + 1];
  const bottom = (after ? after.getBoundingClientRect().top : document.body.scrollHeight) + window.scrollY - 8;
  return {x: 0, y: top, width: 1370, height: bottom - top};
})()"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("output", help="a run's output folder (file:// or s3://)")
    ap.add_argument("--png", default=str(ROOT / "docs/report.png"))
    ap.add_argument("--scale", type=float, default=0.55)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        page = Path(d) / "report.html"
        page.write_text(render(collect(open_store(args.output))), encoding="utf-8")
        shot = open_page(page, "1", READY, clip=CLIP, scale=args.scale)
    if shot.errors:
        print(f"the page reported errors: {shot.errors}", file=sys.stderr)
        return 1
    Path(args.png).write_bytes(shot.screenshot)
    print(f"{args.png}: {len(shot.screenshot) // 1024} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
