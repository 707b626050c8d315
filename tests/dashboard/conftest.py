"""Fixtures: one headless Chromium per test module (skipped only when none can be present)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.browser import Chromium, Page, chromium_path

NO_CHROMIUM = ("chromium is not installed and could not be: `make test` installs it with "
               "`apt-get install -y chromium` when run as root on Debian/Ubuntu; elsewhere "
               "install it yourself or set PREFIXGATE_CHROMIUM to a Chromium/Chrome binary")


@pytest.fixture(scope="module")
def chromium() -> Iterator[Chromium]:
    if chromium_path() is None:
        pytest.skip(NO_CHROMIUM)
    with Chromium.launch() as browser:
        yield browser


@pytest.fixture
def page(chromium: Chromium) -> Page:
    """The browser's page, with errors and event handlers from earlier tests cleared."""
    p = chromium.page
    p.handlers.clear()
    p.send("Network.setExtraHTTPHeaders", {"headers": {}})
    p.send("Fetch.disable")
    p.send("Page.navigate", {"url": "about:blank"})
    p.wait_for("document.readyState === 'complete'")
    p.errors.clear()
    p.events.clear()
    return p
