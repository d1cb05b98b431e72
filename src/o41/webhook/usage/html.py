"""The usage page's drawing: HTML with inline SVG charts, from ``o41.core.usage``'s
report. No script, no asset from anywhere (the page's Content-Security-Policy forbids
both); every string from a user is escaped. The routes are ``o41.webhook.usage.page``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any
from urllib.parse import urlencode

from o41.core.placement import Rule
from o41.core.usage import (
    RULES,
    WINDOWS,
    PriceTable,
    Report,
    Tally,
    WriterPlace,
    human_bytes,
    money,
)
from o41.webhook.usage.prices import STORAGE_PRICES

RULE_COLORS: dict[str, str] = {
    Rule.REGION: "#2e7d32",
    Rule.CLOUD: "#f9a825",
    Rule.FALLBACK: "#c62828",
}
OTHER_COLOR = "#757575"

# --- HTML -----------------------------------------------------------------------------

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1100px;color:#212121;
padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:32px 0 8px}
table{border-collapse:collapse;margin:8px 0 16px;width:100%}
th,td{border-bottom:1px solid #e0e0e0;padding:4px 8px;text-align:right;white-space:nowrap}
th:first-child,td:first-child,.l{text-align:left}
thead th{background:#f5f5f5}
.summary{background:#fff8e1;border-left:4px solid #f9a825;padding:8px 12px;margin:12px 0}
.empty{background:#e3f2fd;border-left:4px solid #1565c0;padding:12px 16px;margin:16px 0}
.muted{color:#616161;font-size:12px}
nav a{margin-right:12px}nav a.on{font-weight:bold;text-decoration:none;color:#212121}
svg{max-width:100%;height:auto;margin:4px 0 8px}
code{background:#f5f5f5;padding:1px 4px}.scroll{overflow-x:auto}
"""


def html_page(title: str, body: str) -> str:
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>{escape(title)}</title><style>{STYLE}</style></head>"
        f"<body>{body}</body></html>"
    )


def sign_in(query: Any, *, rejected: bool) -> str:
    hidden = "".join(
        f'<input type=hidden name="{k}" value="{escape(str(query[k]))}">'
        for k in ("organization", "window")
        if query.get(k)
    )
    why = (
        "<p class=summary id=rejected>That token was not accepted: use a current token of a "
        "namespace listed in the organization's <code>spec.namespaces</code>.</p>"
        if rejected
        else ""
    )
    return html_page(
        "o41 usage: sign in",
        "<h1>o41 usage</h1>"
        f"{why}<p>The usage page shows an organization to the namespaces that may use it. "
        "Paste a ServiceAccount token of such a namespace:</p>"
        "<p><code>kubectl -n NAMESPACE create token default</code></p>"
        f'<form method=post action="/usage">{hidden}'
        '<textarea name=token rows=4 cols=80 required aria-label="token"></textarea><br>'
        "<button type=submit>Show usage</button></form>"
        "<p class=muted>The token is kept in a cookie of this page only, for an hour.</p>",
    )


def error_page(status: int, message: str) -> str:
    return html_page(
        f"o41 usage: {status}",
        f"<h1>o41 usage</h1><p class=summary id=error>{escape(message)}</p>"
        '<p><a href="/usage">All organizations</a></p>',
    )


def _signout() -> str:
    return (
        '<form method=post action="/usage" style="display:inline">'
        "<input type=hidden name=signout value=1>"
        "<button type=submit class=muted>Forget the token</button></form>"
    )


def organizations(names: Sequence[str], namespace: str) -> str:
    """The list of the organizations ``namespace`` may use (``names``, sorted)."""
    items = "".join(
        f'<li><a href="/usage?{urlencode({"organization": n})}">{escape(n)}</a></li>' for n in names
    )
    body = (
        f"<ul id=organizations>{items}</ul>"
        if items
        else f"<p class=empty>Namespace <code>{escape(namespace)}</code> may use no "
        "organization: an administrator adds it to an Organization's spec.namespaces.</p>"
    )
    return html_page("o41 usage", f"<h1>o41 usage</h1><p>Organizations:</p>{body}{_signout()}")


def _window_nav(org: str, current: str) -> str:
    links = []
    for w in WINDOWS:
        href = "/usage?" + urlencode({"organization": org, "window": w})
        cls = ' class=on aria-current="page"' if w == current else ""
        links.append(f'<a href="{escape(href)}"{cls}>{w}</a>')
    return "<nav>Window: " + "".join(links) + "</nav>"


def _tally_cells(t: Tally, currency: str, *, cost: bool = True) -> str:
    cells = f"<td>{t.count:,}</td><td>{human_bytes(t.bytes)}</td>"
    return cells + (f"<td>{money(t.cost, currency)}</td>" if cost else "")


def render(org: str, rep: Report) -> str:
    """The whole page: summary, question 1, writes by source, question 2, prices."""
    cur = rep.prices.currency
    head = (
        f"<h1>Usage of {escape(org)}</h1>{_window_nav(org, rep.window)}"
        f"<p class=muted>Hours {escape(rep.first_hour)}:00 to {escape(rep.last_hour)}:59 UTC. "
        f"Costs are estimates from list prices as of {escape(rep.prices.as_of)}.</p>"
    )
    if rep.empty:
        return html_page(
            f"o41 usage: {org}",
            head + "<div class=empty id=empty><p><strong>No usage recorded for "
            f"{escape(org)} in the last {escape(rep.window)}.</strong></p>"
            "<p>Writes and reads made with <code>o41 write</code> and <code>o41 read</code> "
            "(or the client library) appear here within a few seconds. Try a longer window "
            "above, or check that jobs use this organization.</p></div>" + _signout(),
        )
    body = head + f"<p class=summary id=summary>{escape(rep.summary)}</p>"
    body += _question_1(rep, cur) + _by_source(rep, cur) + _question_2(rep, cur)
    body += _cleanup(rep)
    body += _prices_table(rep.prices) + _signout()
    return html_page(f"o41 usage: {org}", body)


def _question_1(rep: Report, cur: str) -> str:
    rows = []
    for p in rep.places:
        rules = "".join(
            f"<td>{p.by_rule.get(r, Tally()).count:,}</td>"
            f"<td>{human_bytes(p.by_rule.get(r, Tally()).bytes)}</td>"
            for r in RULES
        )
        rows.append(
            f"<tr><td>{escape(p.label)}</td><td class=l>{escape(p.source)}</td>{rules}"
            f"<td>{human_bytes(p.left_region.bytes)}</td>"
            f"<td>{money(p.left_region.cost, cur)}</td><td>{p.warnings:,}</td></tr>"
        )
    w, left = rep.written, rep.left_region
    rule_heads = "".join(f"<th>{r} versions</th><th>{r} bytes</th>" for r in RULES)
    return (
        "<h2>Which places write to the fallback or another region</h2>"
        + places_chart(rep.places[:12])
        + "<div class=scroll><table id=places><thead><tr><th>Writer place</th>"
        + "<th class=l>Source</th>"
        + rule_heads
        + "<th>Left the region</th><th>Est. egress</th><th>Fallback warnings</th></tr></thead>"
        + "<tbody>"
        + "".join(rows)
        + "</tbody>"
        + f"<tfoot><tr><th>Total</th><th></th><th colspan={2 * len(RULES)}>{w.count:,} "
        f"versions, {human_bytes(w.bytes)}</th><th>{human_bytes(left.bytes)}</th>"
        f"<th>{money(left.cost, cur)}</th><th></th></tr></tfoot></table></div>"
    )


def _by_source(rep: Report, cur: str) -> str:
    rows = "".join(
        f"<tr><td>{escape(s.source)}</td><td>{s.begins:,}</td><td>{s.warnings:,}</td>"
        f"{_tally_cells(s.written, cur, cost=False)}{_tally_cells(s.fallback, cur, cost=False)}"
        "</tr>"
        for s in rep.sources
    )
    return (
        "<h2>How writes were placed, by place source</h2>"
        "<p class=muted><code>none</code> is a job whose place is unknown: it always writes "
        "to the fallback.</p>"
        + sources_chart(rep)
        + "<table id=sources><thead><tr><th>Source</th><th>Begins</th><th>Fallback warnings</th>"
        "<th>Versions</th><th>Bytes</th><th>To the fallback</th><th>Fallback bytes</th>"
        f"</tr></thead><tbody>{rows}</tbody></table>"
    )


def _question_2(rep: Report, cur: str) -> str:
    reads = rep.reads
    readers = sorted({r for r, _ in reads.matrix})
    targets = sorted({t for _, t in reads.matrix})
    head = "".join(f"<th>to {escape(t)}</th>" for t in targets)
    rows = []
    for r in readers:
        cells = []
        for t in targets:
            cell = reads.matrix.get((r, t))
            cells.append(
                f"<td>{human_bytes(cell.bytes)}<br><span class=muted>{money(cell.cost, cur)}"
                "</span></td>"
                if cell
                else "<td>-</td>"
            )
        rows.append(f"<tr><td>from {escape(r)}</td>{''.join(cells)}</tr>")
    within = "".join(
        f"<tr><td>{escape(cloud)}</td>{_tally_cells(t, cur)}</tr>"
        for cloud, t in reads.cross_region.items()
    )
    localities = "".join(
        f"<tr><td>{escape(k)}</td>{_tally_cells(t, cur)}</tr>" for k, t in reads.by_locality.items()
    )
    return (
        "<h2>How many bytes cross clouds on reads</h2>"
        f"<p>{human_bytes(reads.cross_cloud.bytes)} crossed clouds, about "
        f"{money(reads.cross_cloud.cost, cur)}; egress is paid by the location's cloud.</p>"
        + matrix_chart(reads.matrix, readers, targets)
        + f"<table id=matrix><thead><tr><th>Reader cloud</th>{head}</tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
        "<h3>Cross-region reads inside each cloud</h3>"
        "<table id=cross-region><thead><tr><th>Cloud</th><th>Reads</th><th>Bytes</th>"
        f"<th>Est. egress</th></tr></thead><tbody>{within or '<tr><td>none</td></tr>'}"
        "</tbody></table>"
        "<table id=localities><thead><tr><th>Locality</th><th>Reads</th><th>Bytes</th>"
        f"<th>Est. egress</th></tr></thead><tbody>{localities}</tbody></table>"
    )


def _cleanup(rep: Report) -> str:
    """Abandoned uploads (aborted, or left to the bucket's rule) and retention, by location."""
    if not rep.cleanups:
        return (
            "<h2>Abandoned uploads and retention</h2><p class=muted id=cleanup-none>No "
            "abandoned upload and no version deleted by retention in this window.</p>"
        )
    rows = "".join(
        f"<tr><td>{escape(c.location)}</td><td>{c.abandoned.count:,}</td>"
        f"<td>{human_bytes(c.abandoned.bytes)}</td><td>{c.aborted.count:,}</td>"
        f"<td>{human_bytes(c.aborted.bytes)}</td><td>{human_bytes(c.left.bytes)}</td>"
        f"<td>{c.retained_away.count:,}</td><td>{human_bytes(c.retained_away.bytes)}</td></tr>"
        for c in rep.cleanups
    )
    return (
        "<h2>Abandoned uploads and retention</h2>"
        "<p class=muted>An abandoned upload is a write whose pod never committed it; the "
        "service aborts its upload when its pending lease expires (bytes: what the write "
        "declared). One not aborted is removed by the bucket's lifecycle rule.</p>"
        "<table id=cleanup><thead><tr><th>Location</th><th>Abandoned uploads</th>"
        "<th>Abandoned bytes</th><th>Aborted</th><th>Aborted bytes</th>"
        "<th>Left to the bucket's rule</th><th>Deleted by retention</th>"
        f"<th>Retention bytes</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def _prices_table(prices: PriceTable) -> str:
    rows = "".join(
        f"<tr><td>{escape(name)}</td><td>{p.inter_region:g}</td><td>{p.internet:g}</td></tr>"
        for name, p in [*sorted(prices.clouds.items()), ("other", prices.default)]
    )
    sources = "".join(f"<li>{escape(s)}</li>" for s in prices.sources)
    return (
        f"<h2>Prices ({escape(prices.currency)} per GB, as of {escape(prices.as_of)})</h2>"
        "<table id=prices><thead><tr><th>Cloud</th><th>To another region</th>"
        f"<th>To the internet / another cloud</th></tr></thead><tbody>{rows}</tbody></table>"
        f"<ul class=muted>{sources}</ul>"
        "<p class=muted>Override with a price file (O41_PRICES_FILE): see docs/usage.md.</p>"
        + _storage_table()
    )


def _storage_table() -> str:
    """The storage prices the net advice holds a new location's bytes at."""
    storage = STORAGE_PRICES
    cells = "".join(
        f"<tr><td>{escape(name)}</td><td>{price:g}</td></tr>"
        for name, price in [*sorted(storage.clouds.items()), ("other", storage.default)]
    )
    return (
        f"<p class=muted>Where a new location pays is net of the storage it would hold, "
        f"per GB-month as of {escape(storage.as_of)} (standard class):</p>"
        f"<table id=storage-prices><thead><tr><th>Cloud</th><th>Storage</th></tr></thead>"
        f"<tbody>{cells}</tbody></table>"
    )


# --- charts: inline SVG ---------------------------------------------------------------

Segment = tuple[str, int, str]  # name, value, color


def hbar_chart(
    chart_id: str,
    title: str,
    rows: Sequence[tuple[str, Sequence[Segment], str]],
    legend: Sequence[tuple[str, str]],
) -> str:
    """Horizontal stacked bars: one row a label, its segments and the text at its end."""
    label_w, bar_w, text_w, row_h, top = 240, 520, 200, 26, 30
    height = top + row_h * max(len(rows), 1) + 10
    width = label_w + bar_w + text_w
    biggest = max((sum(v for _, v, _ in segs) for _, segs, _ in rows), default=0) or 1
    parts = [
        f'<svg id="{chart_id}" xmlns="http://www.w3.org/2000/svg" role="img" '
        f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'aria-label="{escape(title)}"><title>{escape(title)}</title>'
    ]
    x = label_w
    for name, color in legend:
        parts.append(
            f'<rect x="{x}" y="6" width="12" height="12" fill="{color}"/>'
            f'<text x="{x + 16}" y="16" font-size="12">{escape(name)}</text>'
        )
        x += 24 + 8 * len(name)
    for i, (label, segments, text) in enumerate(rows):
        y = top + i * row_h
        parts.append(
            f'<text x="{label_w - 8}" y="{y + 16}" font-size="12" text-anchor="end">'
            f"{escape(label)}</text>"
        )
        x0 = float(label_w)
        for name, value, color in segments:
            if value <= 0:
                continue
            w = max(bar_w * value / biggest, 1.0)
            parts.append(
                f'<rect x="{x0:.1f}" y="{y + 4}" width="{w:.1f}" height="{row_h - 8}" '
                f'fill="{color}"><title>{escape(name)}: {human_bytes(value)}</title></rect>'
            )
            x0 += w
        parts.append(f'<text x="{x0 + 6:.1f}" y="{y + 16}" font-size="12">{escape(text)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def places_chart(places: Sequence[WriterPlace]) -> str:
    rows = [
        (
            f"{p.label} ({p.source})",
            [
                (rule, p.by_rule.get(rule, Tally()).bytes, RULE_COLORS.get(rule, OTHER_COLOR))
                for rule in RULES
            ],
            f"{human_bytes(p.left_region.bytes)} left the region",
        )
        for p in places
    ]
    return hbar_chart(
        "places-chart",
        "Bytes written by writer place and placement rule",
        rows,
        [(r, RULE_COLORS[r]) for r in RULES],
    )


def sources_chart(rep: Report) -> str:
    rows = [
        (
            s.source,
            [
                ("placed in region or cloud", s.written.bytes - s.fallback.bytes, "#1565c0"),
                ("fallback", s.fallback.bytes, RULE_COLORS["fallback"]),
            ],
            f"{human_bytes(s.written.bytes)}, {s.written.count:,} versions",
        )
        for s in rep.sources
    ]
    return hbar_chart(
        "sources-chart",
        "Bytes written by place source",
        rows,
        [("region or cloud", "#1565c0"), ("fallback", RULE_COLORS["fallback"])],
    )


def matrix_chart(
    matrix: Mapping[tuple[str, str], Tally], readers: Sequence[str], targets: Sequence[str]
) -> str:
    """Reader cloud (rows) by location cloud (columns): a cell's shade is its bytes."""
    cell_w, cell_h, left, top = 130, 44, 130, 40
    width, height = left + cell_w * len(targets) + 10, top + cell_h * len(readers) + 10
    biggest = max((t.bytes for t in matrix.values()), default=0) or 1
    title = "Read bytes from reader cloud to location cloud"
    parts = [
        f'<svg id="matrix-chart" xmlns="http://www.w3.org/2000/svg" role="img" '
        f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'aria-label="{title}"><title>{title}</title>'
        f'<text x="{left}" y="14" font-size="12">location cloud →</text>'
    ]
    for j, t in enumerate(targets):
        parts.append(
            f'<text x="{left + j * cell_w + cell_w / 2}" y="{top - 8}" font-size="12" '
            f'text-anchor="middle">{escape(t)}</text>'
        )
    for i, r in enumerate(readers):
        y = top + i * cell_h
        parts.append(
            f'<text x="{left - 8}" y="{y + cell_h / 2 + 4}" font-size="12" '
            f'text-anchor="end">{escape(r)}</text>'
        )
        for j, t in enumerate(targets):
            cell = matrix.get((r, t))
            x = left + j * cell_w
            crossing = r != t
            shade = 0.08 + 0.8 * (cell.bytes / biggest) if cell else 0.0
            color = "#c62828" if crossing else "#2e7d32"
            parts.append(
                f'<rect x="{x + 2}" y="{y + 2}" width="{cell_w - 4}" height="{cell_h - 4}" '
                f'fill="{color}" fill-opacity="{shade:.2f}" stroke="#bdbdbd"/>'
            )
            if cell:
                parts.append(
                    f'<text x="{x + cell_w / 2}" y="{y + cell_h / 2 + 4}" font-size="12" '
                    f'text-anchor="middle">{human_bytes(cell.bytes)}</text>'
                )
    parts.append("</svg>")
    return "".join(parts)
