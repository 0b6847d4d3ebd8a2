"""tools/plot_staleness.py: reads klear.compare's comparison.csv files and draws one column per objective."""

import csv
import subprocess
import sys

import pytest

from tests.tools import TOOLS, load_tool

pytestmark = pytest.mark.end_to_end  # runs a plotting script in a subprocess

FIELDS = ["label", "objective", "seed", "step", "reward/mean", "objective/approx_kl", "actor/entropy", "eval/accuracy"]


def write_comparison(directory, objectives, variants):
    directory.mkdir()
    with (directory / "comparison.csv").open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=FIELDS)
        writer.writeheader()
        for objective in objectives:
            for lag, variant in enumerate(variants):
                for seed in range(2):
                    for step in range(4):
                        row = {"label": f"{objective}+{variant}", "objective": objective, "seed": seed, "step": step}
                        row |= {"reward/mean": 0.1 * step - 0.05 * lag, "objective/approx_kl": 0.001 * lag}
                        row |= {"actor/entropy": 0.03, "eval/accuracy": 0.5 if step in (0, 3) else ""}
                        writer.writerow(row)


def test_runs_are_grouped_by_objective_and_variant_across_directories(tmp_path):
    write_comparison(tmp_path / "a", ["ppo", "gppo"], ["sync", "stale4"])
    write_comparison(tmp_path / "b", ["gppo"], ["stale4-decoupled"])
    runs = load_tool("plot_staleness").read_runs([str(tmp_path / "a"), str(tmp_path / "b")])
    assert set(runs) == {
        ("ppo", "sync"),
        ("ppo", "stale4"),
        ("gppo", "sync"),
        ("gppo", "stale4"),
        ("gppo", "stale4-decoupled"),
    }
    assert sorted(runs[("gppo", "stale4")]) == [0, 1] and sorted(runs[("gppo", "stale4")][0]) == [0, 1, 2, 3]
    assert runs[("ppo", "stale4")][1][2]["reward/mean"] == 0.1 * 2 - 0.05


def test_the_command_writes_the_figure(tmp_path):
    write_comparison(tmp_path / "a", ["ppo", "cispo"], ["sync", "stale1"])
    out = tmp_path / "staleness.png"
    result = subprocess.run(
        [
            sys.executable,
            str(TOOLS / "plot_staleness.py"),
            str(tmp_path / "a"),
            "--out",
            str(out),
            "--objectives",
            "ppo",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000
    assert "| ppo |" in result.stdout and "| cispo |" not in result.stdout  # --objectives keeps ppo only


def test_the_table_pairs_each_variant_with_the_baseline(tmp_path):
    write_comparison(tmp_path / "a", ["ppo", "gppo"], ["sync", "stale4"])
    tool = load_tool("plot_staleness")
    text = tool.table(tool.read_runs([str(tmp_path / "a")]))
    lines = text.splitlines()
    assert lines[0] == "| objective | sync | stale4 | stale4 - sync |"
    # Every seed's final accuracy is 0.5 in every variant: no difference, and Holm leaves p at 1.
    assert lines[2] == "| ppo | 0.500 ± 0.000 | 0.500 ± 0.000 | +0.000 [+0.000, +0.000], p_holm = 1.000 |"
