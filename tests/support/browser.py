"""Headless Chromium for the HTML pages' tests: load a page, return its DOM, no console errors."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

__all__ = ["dom_of"]


def dom_of(page: Path) -> str:
    """The DOM Chromium builds from ``page`` (skips when there is no Chromium); fails on a
    console message, an uncaught error or a failed fetch."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("no chromium on this machine (apt-get install chromium)")
    done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                           "--enable-logging=stderr", "--v=0", "--dump-dom", page.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not [line for line in done.stderr.splitlines()
                if "CONSOLE" in line or "Uncaught" in line or "net::ERR" in line]
    return done.stdout
