"""The arithmetic of ``bench/lens_ingest.py --collectors``."""

from __future__ import annotations

from tests.helpers import load_bench

bench = load_bench("lens_ingest")


def test_scaling_stops_where_one_more_replica_adds_under_ten_percent() -> None:
    assert bench.stops_at([100, 190, 250]) is None  # each adds more than 10%
    assert bench.stops_at([100, 105, 200]) == 1
    assert bench.stops_at([100, 180, 190]) == 2
    assert bench.stops_at([100]) is None


def test_lag_quantiles_come_from_merged_10ms_histograms() -> None:
    histogram = {5: 50, 20: 49, 300: 1}  # 100 rows: 0.05 s, 0.2 s and one at 3 s
    assert bench.quantile_10ms(histogram, 0.5) == 0.05
    assert bench.quantile_10ms(histogram, 0.99) == 0.2
    assert bench.quantile_10ms(histogram, 1.0) == 3.0
    assert bench.quantile_10ms({}, 0.5) != bench.quantile_10ms({}, 0.5)  # nan: no rows
