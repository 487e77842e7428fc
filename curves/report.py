"""A self-contained HTML report: summary table, messages and every panel, with plotly.js
embedded inline so the file opens offline."""

from __future__ import annotations

import html
from pathlib import Path
from typing import TYPE_CHECKING

import plotly.io as pio
from plotly.offline import get_plotlyjs

if TYPE_CHECKING:
    from curves import AnalysisResult

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5rem auto; max-width: 1200px;
       color: #222; }
table { border-collapse: collapse; font-size: 0.85rem; }
th, td { border: 1px solid #ccc; padding: 0.25rem 0.5rem; text-align: left;
         vertical-align: top; }
th { background: #f3f3f3; }
.note { color: #555; font-size: 0.85rem; margin: 0 0 1.5rem; }
.error { color: #a40000; } .warning { color: #8a5a00; } .info { color: #444; }
code { background: #f3f3f3; padding: 0 0.2rem; }
"""


def render_report(result: AnalysisResult, title: str = "Training curves: LLD check") -> str:
    """The whole report as one HTML string."""
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style>",
        # One inline copy of plotly.js shared by every figure; no CDN, works offline.
        f"<script type='text/javascript'>{get_plotlyjs()}</script>",
        "</head><body>",
        f"<h1>{html.escape(title)}</h1>",
        "<h2>Summary</h2>",
    ]
    if len(result.summary):
        parts.append(result.summary.to_html(index=False, na_rep="", escape=True,
                                            classes="summary", border=0))
    else:
        parts.append("<p>No run could be read.</p>")
    parts.append(
        "<p class='note'>Phase rule (ours; the paper gives none): "
        f"<code>{html.escape(result.rule.describe())}</code>. See "
        "<code>curves/analysis.py</code> for what each parameter does. Empty cells mean "
        "the data does not support that finding.</p>"
    )
    if result.messages:
        parts.append("<h2>Messages</h2><ul>")
        for message in result.messages:
            parts.append(f"<li class='{html.escape(message.level)}'>"
                         f"{html.escape(str(message))}</li>")
        parts.append("</ul>")
    parts.append("<h2>Curves</h2>")
    for panel in result.panels:
        div_id = "panel-" + "".join(ch if ch.isalnum() else "-" for ch in panel.id)
        parts.append(pio.to_html(panel.figure, full_html=False, include_plotlyjs=False,
                                 div_id=div_id, config={"displaylogo": False}))
        if panel.note:
            parts.append(f"<p class='note'>{html.escape(panel.note)}</p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(result: AnalysisResult, path: str | Path,
                 title: str = "Training curves: LLD check") -> Path:
    path = Path(path)
    path.write_text(render_report(result, title), encoding="utf-8")
    return path
