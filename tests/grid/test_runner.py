"""The one grid runner with a job that needs no model: resume, the grid's order, each cell once, Ctrl-C keeps rows."""

import sys
from dataclasses import dataclass, field

import pytest

from codeckv.grid import Local, run_grid
from codeckv.grid.runner import read_rows, write_rows


@dataclass
class Squares:
    """Cells 0..n-1, two rows each (x and x squared); `stop_at` raises KeyboardInterrupt in that cell (a Ctrl-C)."""

    n: int
    seed: int = 0
    stop_at: int = -1
    name: str = "squares"
    key: tuple = ("x",)
    same: tuple = ("seed",)
    opened: list = field(default_factory=list)

    def order(self):
        return [(str(x),) for x in range(self.n)]

    def cells(self, kept):
        """Each cell with the rows it lacks (as a RULER sample with the tiers it lacks)."""
        have = {(row["x"], row["what"]) for row in kept}
        missing = {x: [w for w in ("x", "square") if (str(x), w) not in have] for x in range(self.n)}
        return [{"x": x, "what": what} for x, what in missing.items() if what]

    def open(self):
        self.opened.append(True)

        def rows(cell):
            if cell["x"] == self.stop_at:
                raise KeyboardInterrupt
            values = {"x": cell["x"], "square": cell["x"] ** 2}
            return [{"x": cell["x"], "what": what, "value": values[what], "seed": self.seed} for what in cell["what"]]

        return rows


class Shuffled(Local):
    """A backend handing cells back out of order, one of them twice (as a cluster might): the CSV must not care."""

    def run(self, job, cells):
        done = list(super().run(job, cells))
        yield from [*reversed(done), done[0]]


def _values(path):
    return [(row["x"], row["what"], row["value"]) for row in read_rows(path)]


def test_rows_are_written_in_the_grids_order_each_cell_once(tmp_path):
    serial, shuffled = tmp_path / "serial.csv", tmp_path / "shuffled.csv"
    run_grid(Squares(4), serial, Local())
    run_grid(Squares(4), shuffled, Shuffled())
    assert _values(serial) == _values(shuffled) == [(str(x), what, str(v)) for x in range(4)
                                                    for what, v in (("x", x), ("square", x * x))]
    assert {row["node"] for row in read_rows(serial)} and read_rows(serial)[0]["node_kind"]


def test_update_measures_only_the_cells_the_csv_lacks_and_grows_the_grid(tmp_path):
    out = tmp_path / "grid.csv"
    run_grid(Squares(2), out, Local())
    grown = Squares(5)
    run_grid(grown, out, Local(), update=True)
    assert [x for x, what, _ in _values(out) if what == "x"] == ["0", "1", "2", "3", "4"]
    done = Squares(5)
    run_grid(done, out, Local(), update=True)
    assert done.opened == [], "nothing left to measure: the model is never loaded"


def test_update_refuses_a_csv_measured_another_way(tmp_path):
    out = tmp_path / "grid.csv"
    run_grid(Squares(2), out, Local())
    with pytest.raises(ValueError, match="measured with seed 0, not 7"):
        run_grid(Squares(3, seed=7), out, Local(), update=True)
    assert len(read_rows(out)) == 4, "a refused update leaves the CSV as it was"
    older = tmp_path / "older.csv"  # written before the job had its seed column
    write_rows([{k: v for k, v in row.items() if k != "seed"} for row in read_rows(out)], older)
    run_grid(Squares(3, seed=7), older, Local(), update=True)
    assert [row["seed"] for row in read_rows(older)] == ["", "", "", "", "7", "7"], "not refused for lacking it"


def test_an_interrupt_keeps_every_finished_cell_and_update_resumes(tmp_path, capsys):
    out = tmp_path / "grid.csv"
    with pytest.raises(KeyboardInterrupt):
        run_grid(Squares(4, stop_at=2), out, Local())
    assert [x for x, what, _ in _values(out) if what == "x"] == ["0", "1"]
    assert "holds the 4 rows done; --update resumes" in capsys.readouterr().err
    run_grid(Squares(4), out, Local(), update=True)
    assert _values(out) == _values(_full(tmp_path))


def _full(tmp_path, n=4):
    path = tmp_path / f"full-{n}.csv"
    run_grid(Squares(n), path, Local())
    return path


def test_without_ray_the_cluster_flag_says_how_to_install_it_in_one_line(tmp_path, monkeypatch, capsys):
    from codeckv.cli import main

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError, as where it is not installed
    code = main(["ruler", "--lengths", "512", "--tasks", "niah_single_1", "--samples", "1", "--tiers", "int8",
                 "--ray", "--out", str(tmp_path / "ruler.csv")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and err[-1] == ("error: --ray needs Ray, which is not installed: pip install 'codeckv[cluster]' "
                                     "(or pip install ray==2.60.0)")
    assert not (tmp_path / "ruler-samples.csv").exists()


def test_a_row_cut_off_by_a_killed_run_is_measured_again(tmp_path):
    out = tmp_path / "grid.csv"
    run_grid(Squares(3), out, Local())
    whole = out.read_bytes()
    out.write_bytes(whole[: whole.rindex(b"\n", 0, len(whole) - 1) + 5])  # the last row half written
    run_grid(Squares(3), out, Local(), update=True)
    assert _values(out) == _values(_full(tmp_path, 3)), "the half row dropped, its cell's missing row measured again"


def test_a_cluster_gets_a_worker_per_gpu_or_per_threads_cpus_never_more_than_cells():
    from codeckv.grid.cluster import workers

    assert workers({"CPU": 16.0, "GPU": 4.0}, threads=2, cells=100) == (4, 1)  # one GPU each: the Triton path
    assert workers({"CPU": 16.0}, threads=2, cells=100) == (8, 0)
    assert workers({"CPU": 2.0}, threads=4, cells=100) == (1, 0)  # fewer CPUs than threads: still one worker
    assert workers({"CPU": 16.0, "GPU": 8.0}, threads=1, cells=3) == (3, 1)


def test_an_address_nobody_answers_on_is_refused_in_seconds_not_minutes():
    from codeckv.grid.cluster import _check_reachable

    with pytest.raises(ConnectionError, match="no Ray cluster answers at 127.0.0.1:1"):
        _check_reachable("127.0.0.1:1")  # Ray's own connection waits minutes there
    _check_reachable("auto")  # left to Ray: it finds the cluster this node belongs to, or says there is none


def test_a_finished_grid_left_unsorted_is_sorted_by_an_update_with_nothing_to_measure(tmp_path):
    from codeckv.grid.runner import write_rows

    out = tmp_path / "grid.csv"
    run_grid(Squares(3), out, Local())
    rows = read_rows(out)
    cells = [rows[i : i + 2] for i in range(0, len(rows), 2)]
    write_rows([row for cell in cells[::-1] for row in cell], out)  # appended as cells arrived, then killed
    done = Squares(3)
    run_grid(done, out, Local(), update=True)
    assert done.opened == [] and _values(out) == _values(_full(tmp_path, 3))
