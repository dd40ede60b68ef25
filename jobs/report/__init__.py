"""`eyrie report`: what a run bought, read back from its store, on the terminal and as one HTML page.

`collect` reads (store I/O only), `terminal` prints rich tables, `html` renders the page with plotly.
`publish` is what `eyrie run` calls when it ends: the page goes into the store beside the manifest.
"""

from __future__ import annotations

from eyrie.jobs.contract import layout
from eyrie.jobs.report.data import ReportData, collect
from eyrie.jobs.store import Store

__all__ = ["ReportData", "collect", "publish"]


def publish(store: Store, data: ReportData | None = None) -> str:
    """Write `<output>/report.html` and return its URL."""
    from eyrie.jobs.report.html import render

    store.put(layout.REPORT, render(data or collect(store)).encode())
    return store.url(layout.REPORT)
