"""How fast the training-log formats read lines (``libs/log_formats``).

The lines are the real framework lines of
``tests/lens/fixtures/framework_logs/`` (progress lines, timers, banners,
warnings), mixed with ``--noise`` ordinary lines per progress-file line, as
a training job's output is mostly other text. For each format: lines/s and
CPU microseconds per line through ``Parser.parse`` (colours cleaned, every
rule tried), against the baseline measured in the same run: the same lines
only cleaned (what storing them unparsed costs here). Also the progress
lines alone, the worst case. Ends with one JSON line.

This is the parsing stage only; storing lines in ClickHouse is measured by
``bench/lens_ingest.py``.

    python bench/log_parse.py [--lines 200000] [--noise 20]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from libs.log_formats import Parser, clean  # noqa: E402

FIXTURES = ROOT / "tests/lens/fixtures/framework_logs"
NOISE = ["[2025-06-16 22:30:50,322] WARNING dataloader worker 3 is slow to start",
         "Using /root/.cache/torch_extensions/py311_cpu as PyTorch extensions root...",
         "  warnings.warn(", "loading shard 17 of 64 from /data/c4/train-00017.arrow"]


def workload(name: str, total: int, noise: int) -> tuple[list[str], list[str]]:
    own = [line for line in (FIXTURES / f"{name}.log").read_text().splitlines()
           if line.strip() and not line.startswith("#")]
    mixed: list[str] = []
    while len(mixed) < total:
        for line in own:
            mixed.append(line)
            mixed += NOISE * (noise // len(NOISE)) + NOISE[: noise % len(NOISE)]
    return mixed[:total], (own * (total // len(own) + 1))[: total // 4]


def timed(fn, lines: list[str]) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(lines per second, CPU microseconds per line)."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn(lines)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return len(lines) / wall, 1e6 * cpu / len(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=200_000)
    ap.add_argument("--noise", type=int, default=20, help="ordinary lines per fixture line")
    args = ap.parse_args()
    parser = Parser.load()
    figures: dict[str, dict[str, float]] = {}
    for name in parser.names:
        mixed, progress = workload(name, args.lines, args.noise)

        def parse(lines: list[str], name: str = name) -> None:
            for i, line in enumerate(lines):
                parser.parse(line, name, i)

        def baseline(lines: list[str]) -> None:
            for line in lines:
                clean(line)

        base_rate, base_us = timed(baseline, mixed)
        rate, us = timed(parse, mixed)
        worst_rate, worst_us = timed(parse, progress)
        figures[name] = {"lines_per_s": round(rate), "cpu_us_per_line": round(us, 2),
                         "baseline_lines_per_s": round(base_rate),
                         "ratio_to_baseline": round(rate / base_rate, 3),
                         "progress_only_lines_per_s": round(worst_rate),
                         "progress_only_cpu_us_per_line": round(worst_us, 2)}
        print(f"{name:<11} mixed {rate:>10,.0f} lines/s ({us:5.2f} us CPU/line; only cleaned: "
              f"{base_rate:>10,.0f}/s, ratio {rate / base_rate:.3f}); progress lines alone "
              f"{worst_rate:>9,.0f}/s ({worst_us:5.2f} us)")
    slowest = min(f["lines_per_s"] for f in figures.values())
    print(json.dumps({"bench": "log_parse", "lines": args.lines, "noise_per_line": args.noise,
                      "slowest_format_lines_per_s": slowest, "formats": figures}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
