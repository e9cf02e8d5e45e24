"""The report page's conformance section, from ``conformance.json`` (written by
``cactus_theory.testing.conformance.section.run``): which engines were present, the
engine × property table, every failed property with its finding, and the measured
acceptance of each law case against the claimed rule's exact one.
"""

from __future__ import annotations

import html

TITLE = "Engines' samplers: conformance with the rule they claim"
#: Characters of a finding's detail shown on the page (the JSON has all of it).
DETAIL_CHARS = 400


def _cell(mark: str) -> str:
    style = " class='fail'" if mark == "FAIL" else ""
    return f"<td{style}>{html.escape(mark)}</td>"


def _matrix(matrix: dict) -> str:
    head = "".join(f"<th>{html.escape(column)}</th>" for column in matrix["columns"])
    rows = [
        f"<tr><td>{html.escape(name)}</td>{''.join(_cell(mark) for mark in cells)}</tr>"
        for name, cells in zip(matrix["properties"], matrix["cells"], strict=True)
    ]
    return f"<table><tr><th>property</th>{head}</tr>{''.join(rows)}</table>"


def _findings(engines: dict) -> str:
    items = []
    for reports in engines.values():
        for report in reports:
            for result in report["properties"]:
                if result["status"] != "failed":
                    continue
                detail = result.get("detail", "")
                if len(detail) > DETAIL_CHARS:
                    detail = detail[:DETAIL_CHARS] + " …"
                items.append(
                    f"<li><b>{html.escape(report['engine'])} {html.escape(report['version'])}"
                    f"</b>, {html.escape(result['name'])}: {html.escape(detail)}</li>"
                )
    if not items:
        return "<p>No property failed.</p>"
    return "<ul>" + "".join(items) + "</ul>"


def _acceptance(rows: list[dict]) -> str:
    body = [
        f"<tr><td>{html.escape(row['engine'])}</td><td>{html.escape(row['rule'])}</td>"
        f"<td>{html.escape(row['case'])}</td>"
        f"<td>{', '.join(f'{float(v):.3f}' for v in row['measured'])}</td>"
        f"<td>{', '.join(f'{float(v):.3f}' for v in row['exact'])}</td>"
        f"<td>{', '.join(f'{int(v):,}' for v in row['reached'])}</td></tr>"
        for row in rows
    ]
    return (
        "<table><tr><th>engine</th><th>rule</th><th>case</th><th>measured α per position</th>"
        f"<th>exact α</th><th>draws reaching</th></tr>{''.join(body)}</table>"
    )


def conformance_section(data: dict | None) -> str:
    """The section's HTML (``data``: conformance.json's content, or None when the section
    did not run, which the page says)."""
    if not data:
        return "<p>The conformance section was not run in this report.</p>"
    budget = data["budget"]
    present = ", ".join(html.escape(name) for name in data["engines"]) or "none"
    missing = "".join(
        f"<li>{html.escape(engine)}: {html.escape(reason)}</li>"
        for engine, reason in data["missing"].items()
    )
    return "\n".join(
        [
            "<p>Each engine's verify step is checked as a black box against the exact law of "
            "the rule it claims (<code>cactus conform</code>, "
            "<code>cactus_theory.testing.conform</code>): every accept/reject decision and "
            "every emitted token for injected uniforms (where the engine takes them), and "
            "chi-square tests of the emitted law at each position, the bonus token and the "
            "number accepted, at a family-wise level of 1e-3 (Bonferroni). This quick run "
            f"uses {budget['draws']:,} draws per law case and {budget['examples']} drawn "
            "blocks per exact property, so each law test detects a TV of about 0.05 (each "
            "result states its own); <code>cactus conform --all</code> runs 10^6 draws "
            "(TV about 0.004). Measured on "
            f"{html.escape(data['cpu'])} in {data['seconds']:.0f} s.</p>",
            f"<p>Engines present in this environment: {present}.</p>",
            f"<ul>{missing}</ul>" if missing else "",
            _matrix(data["matrix"]),
            "<p>What failed:</p>",
            _findings(data["engines"]),
            "<p>Measured acceptance per draft position against the claimed rule's exact "
            "acceptance (<code>law.acceptance</code>) on each law case:</p>",
            _acceptance(data["acceptance"]),
        ]
    )
