"""``primus-safe lens report`` opened in a real browser: the report of the
seeded job (``lens_seed``), fetched through a running lens-collector by the
CLI, loads in headless Chromium without an error, every plot image decodes,
and a screenshot is kept (``test-artifacts/lens-report.png``, or under
``PRIMUS_TEST_ARTIFACTS``) for a person to look at."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from libs.store import open_store
from tests.browser import chromium_binary, open_page
from tests.helpers import ROOT, run_cli
from tests.lens.lens_seed import JOB, seed

PLOTS = """JSON.stringify({
  images: document.images.length,
  decoded: Array.from(document.images).filter(i => i.complete && i.naturalWidth > 0).length,
  figures: Array.from(document.querySelectorAll('h2, h3')).map(h => h.textContent),
  height: document.documentElement.scrollHeight})"""


async def test_the_report_renders_in_chromium_with_every_plot(
        lens_collector: tuple[Any, Any], nats_url: str, clickhouse_dsn: str, database: str,
        tmp_path: Path) -> None:
    chromium_binary()  # skip (locally) or fail (CI) before any work
    seed(open_store(clickhouse_dsn), database)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIMUS_")}
    env.update(PRIMUS_NATS_URL=nats_url, PRIMUS_STATE_DIR=str(tmp_path / "state"))
    report = tmp_path / "report.html"
    made = await asyncio.to_thread(run_cli, "lens", "report", "--job", JOB, "-o", str(report),
                                   env=env)
    assert made.returncode == 0, made.stderr
    embedded = report.read_text().count("data:image/png;base64,")
    assert embedded >= 3  # loss, throughput and GPU plots at least

    page = await asyncio.to_thread(open_page, report, PLOTS)
    import json

    found = json.loads(page.value)
    assert page.errors == [], page.errors
    assert found["images"] == embedded and found["decoded"] == embedded, found
    assert found["height"] > 900  # the plots take room: the page scrolls
    artefacts = Path(os.environ.get("PRIMUS_TEST_ARTIFACTS", ROOT / "test-artifacts"))
    artefacts.mkdir(parents=True, exist_ok=True)
    shot = artefacts / "lens-report.png"
    shot.write_bytes(page.screenshot)
    assert page.screenshot.startswith(b"\x89PNG") and len(page.screenshot) > 20_000
    print(f"report screenshot: {shot} ({len(page.screenshot)} bytes); sections "
          f"{found['figures']}")
