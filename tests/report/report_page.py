"""The HTML page rendered the way the module renders it: the role's template, the one ``render_page``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cpupools.report import page
from helpers import REPO

TEMPLATE = str(REPO / "roles" / "cpupools_report" / "templates" / page.TEMPLATE)


def render_html(hosts: Sequence[Mapping], failed: Sequence[str] = (), **kw) -> str:
    return page.render_html(hosts, TEMPLATE, failed, **kw)
