"""The built documentation site renders in a real browser: a headless Chromium screenshot of the
quickstart page shows the page and its navigation (``nox -s docs`` builds the site, then runs this).

Chromium is Debian's (``/usr/bin/chromium``), started as the machine notes say: headless, no
sandbox (root), no GPU, no background networking, a fresh profile. The page is served over HTTP on
loopback, as a reader's browser would fetch it.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import shutil
import struct
import subprocess
import threading
import zlib
from pathlib import Path

import pytest

SITE = Path(os.environ.get("OPENENGINE_SITE_DIR", Path(__file__).resolve().parents[2] / "site"))
WIDTH, HEIGHT = 1400, 1000  # wide enough for Material's navigation sidebar (>= 1220 px)


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.fail("chromium is not installed (nox -s docs installs Debian's chromium)")
    return found


@contextlib.contextmanager
def serve(directory: Path):
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(directory))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def browse(url: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'profile'}", f"--window-size={WIDTH},{HEIGHT}",
         "--hide-scrollbars", "--virtual-time-budget=5000", *args, url],
        capture_output=True, text=True, timeout=120)


def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and RGB rows of an 8-bit RGB/RGBA, non-interlaced PNG (what Chromium writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    width, height, depth, color, _, _, interlace = header
    assert depth == 8 and color in (2, 6) and interlace == 0, header
    bpp = 3 if color == 2 else 4
    raw, stride, rows, prev = zlib.decompress(idat), width * bpp, [], bytearray(width * bpp)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line[j] for k in range(0, stride, bpp) for j in range(k, k + 3)))
        prev = line
    return width, height, rows


def ink(rows: list[bytes], x0: int, x1: int, y0: int, y1: int) -> float:
    """The share of pixels in the box that are dark (text) on the page's white."""
    dark = total = 0
    for row in rows[y0:y1]:
        for x in range(x0, x1):
            r, g, b = row[3 * x:3 * x + 3]
            total += 1
            dark += (r + g + b) < 384
    return dark / total


def test_quickstart_page_renders_with_its_navigation(tmp_path):
    page = SITE / "quickstart" / "index.html"
    assert page.is_file(), f"{page} is missing: build the site first (nox -s docs)"
    with serve(SITE) as base:
        url = f"{base}/quickstart/"
        dom = browse(url, tmp_path, "--dump-dom")
        shot = tmp_path / "quickstart.png"
        taken = browse(url, tmp_path, f"--screenshot={shot}")
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert "<title>Quickstart - OpenEngine Adapters</title>" in html
    for entry in ("Concepts", "Running a sidecar", "Launcher flags", "vLLM"):
        assert 'md-nav__link' in html and entry in html, entry
    assert "nox -s demo" in html  # the page's own content, snippets included
    assert taken.returncode == 0 and shot.is_file(), taken.stderr[-2000:]
    width, height, rows = png_pixels(shot.read_bytes())
    assert (width, height) == (WIDTH, HEIGHT)
    header = rows[20][3 * 700:3 * 700 + 3]  # Material's default header colour (indigo, #4051b5)
    assert header[2] > 150 and header[0] < 110, header
    nav, content = ink(rows, 0, 300, 120, 700), ink(rows, 400, 1100, 120, 700)
    assert nav > 0.01, f"no navigation drawn in the left column ({nav:.4f} dark)"  # blank page: 0
    assert content > 0.01, f"no content drawn ({content:.4f} dark)"
