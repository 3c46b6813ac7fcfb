"""`ladmac sweep lad`: a grid of LAD configs, each point a Ray task running `ladmac eval lad`
inside SmolLM2; cached points are not rerun; table, JSON and Pareto plot written."""
import json
import math

import pytest

from benchmarks.sweep import grid, pareto
from ladmac_cli import main


def test_grid_is_the_product_of_the_value_lists():
    assert grid(["a=1,2", "b=x"]) == [{"a": "1", "b": "x"}, {"a": "2", "b": "x"}]
    assert len(grid(["a=1,2,3", "b=x,y"])) == 6
    assert grid([]) == [{}]


def test_pareto_keeps_only_undominated_points():
    rows = [{"d": 1.0, "k": 50.0}, {"d": 0.5, "k": 60.0}, {"d": 2.0, "k": 70.0}, {"error": "x"}]
    assert pareto(rows, ("d", "k")) == [True, True, False, False]


@pytest.mark.parametrize("argv, fragment", [
    (["sweep", "lad", "--set", "center_cos="], "NAME=V1,V2"),
    (["sweep", "lad", "--set", "bogus=1,2"], "unknown parameter 'bogus'"),
    (["sweep", "lad", "--set", "center_cos=0.9,2.0"], "center_cos"),
    (["sweep", "lad", "--hardware", "--set", "max_centers=0"], "max_centers"),
    (["sweep", "lad", "--tokens", "0"], "--tokens must be positive, got 0"),
    (["sweep", "lad", "--workers", "0"], "--workers must be positive, got 0"),
    (["sweep", "lad", "--context", "-1"], "--context must be >= 0, got -1"),
])
def test_bad_sweeps_exit_2_before_running(argv, fragment, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert fragment in err and len(err.strip().splitlines()) == 1, err


def test_hardware_sweep_runs_points_ranks_them_by_energy_caches_them_and_plots(tmp_path, capsys):
    """Two points of the bit-accurate tile (--hardware), each a Ray task: the table, JSON and Pareto
    plot written; each point keeps its activity record and the table gains the system model's
    energy per token (SmolLM2, DDR4-3200, state streamed; a tile per KV group), a Pareto axis; a
    second run reruns nothing."""
    argv = ["sweep", "lad", "--hardware", "--set", "center_cos=0.5,0.98", "--tokens", "24",
            "--out", str(tmp_path), "--workers", "2"]
    assert main(argv) == 0
    data = json.loads((tmp_path / "sweep.json").read_text())
    rows = data["rows"]
    assert [r["point"] for r in rows] == [{"center_cos": "0.5"}, {"center_cos": "0.98"}]
    for r in rows:
        assert "error" not in r and math.isfinite(r["perplexity"]) and r["perplexity"] > 1
        assert 0 < r["keys_read_pct"] <= 100
    # a looser center test merges more keys into fewer centers: the points differ
    assert rows[0]["centers_mean"] < rows[1]["centers_mean"]
    energies = [r["energy_uj"] for r in rows]
    assert all(math.isfinite(e) and e > 1000 for e in energies), energies   # weights alone: > 10 mJ per token
    assert energies[0] != energies[1]                                        # the points' activity differs
    assert len(list((tmp_path / "points").glob("*.activity.json"))) == 2
    assert any(data["pareto"])
    assert (tmp_path / "pareto.png").stat().st_size > 1000
    table = (tmp_path / "sweep.md").read_text()
    assert "center_cos" in table and "energy/token uJ" in table
    capsys.readouterr()
    assert main(argv) == 0   # resumes: both points cached, nothing rerun
    assert "2 cached, 0 to run" in capsys.readouterr().err
