"""`bench neighbours`' table, from tries given as plain values."""

from __future__ import annotations

from hearthgate.loadtests.neighbours import render


def test_the_table_gives_medians_ranges_and_the_late_tries() -> None:
    tries = {
        "whole session": [
            {"generate_s": 9.4, "core0_late_s": 0.002, "core1_late_s": 0.004},
            {"generate_s": 10.2, "core0_late_s": 0.003, "core1_late_s": 0.002},
        ],
        "compute threads": [
            {"generate_s": 7.2, "core0_late_s": 6.9, "core1_late_s": 0.001},
            {"generate_s": 7.6, "core0_late_s": 0.001, "core1_late_s": 0.05},
            {"generate_s": 7.4, "core0_late_s": 0.2, "core1_late_s": 5.3},
        ],
    }
    text = render({"box": None, "core": 1, "tokens": 3500, "tries": tries})
    rows = {line.split(" | ")[0]: line for line in text.splitlines() if line.startswith("| ")}
    assert rows["| whole session"].endswith("| 0 of 2 |")
    assert "| 9.80 (9.40-10.20) |" in rows["| whole session"]
    assert rows["| compute threads"].endswith("| 2 of 3 |")
    assert "| 0.20 (0.00-6.90) |" in rows["| compute threads"]
