"""Saved runs kept in git as one archive a set (benchmarks/runs_archive.py)."""

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def archive(benchmark_script):
    return benchmark_script("runs_archive")


def save(runs: Path, name: str, seed: int, loss: float = 5.5) -> Path:
    runs.mkdir(parents=True, exist_ok=True)
    path = runs / f"{name}.json"
    path.write_text(json.dumps({"seed": seed, "losses": [loss, loss / 2]}))
    return path


@pytest.fixture
def runs(tmp_path):
    folder = tmp_path / "runs"
    save(folder, "post_ln_without_warmup-failing-272", 272)
    save(folder, "post_ln_without_warmup-failing-272-rollback-once", 272)  # a policy extends the name
    save(folder, "post_ln_without_warmup-control_low_lr-273", 273)
    save(folder, "post_ln_without_warmup-failing-274", 274)
    return folder


def test_a_set_s_runs_are_chosen_by_the_seed_they_hold(archive, runs):
    names = [p.name for p in archive.runs_of({272, 273}, runs)]
    assert names == [
        "post_ln_without_warmup-control_low_lr-273.json",
        "post_ln_without_warmup-failing-272-rollback-once.json",
        "post_ln_without_warmup-failing-272.json",
    ]


def test_unpacking_gives_back_every_run_byte_for_byte(archive, runs, tmp_path):
    out = archive.archive_path({272, 273}, tmp_path / "archives")
    archive.pack(archive.runs_of({272, 273}, runs), out)
    restored, differing = archive.unpack(out, tmp_path / "fresh")
    assert len(restored) == 3 and differing == []
    for name in restored:
        assert (tmp_path / "fresh" / name).read_bytes() == (runs / name).read_bytes()
    assert archive.unpack(out, tmp_path / "fresh") == ([], [])  # nothing missing the second time


def test_packing_the_same_runs_again_gives_the_same_bytes(archive, runs, tmp_path):
    """Else every pack would leave git a binary change to commit."""
    first, second = tmp_path / "a.tar.xz", tmp_path / "b.tar.xz"
    archive.pack(archive.runs_of({272}, runs), first)
    (runs / "post_ln_without_warmup-failing-272.json").touch()  # a newer mtime, the same content
    archive.pack(archive.runs_of({272}, runs), second)
    assert first.read_bytes() == second.read_bytes()


def test_a_saved_run_that_differs_from_the_archive_is_kept_and_named(archive, runs, tmp_path):
    out = tmp_path / "set.tar.xz"
    archive.pack(archive.runs_of({273}, runs), out)
    retrained = save(tmp_path / "fresh", "post_ln_without_warmup-control_low_lr-273", 273, loss=4.0)
    before = retrained.read_bytes()
    assert archive.unpack(out, tmp_path / "fresh") == ([], ["post_ln_without_warmup-control_low_lr-273.json"])
    assert retrained.read_bytes() == before


def test_one_seed_names_its_archive_by_that_seed(archive, tmp_path):
    assert archive.archive_path({268}, tmp_path).name == "monitors-268.tar.xz"
    assert archive.archive_path({272, 273}, tmp_path).name == "monitors-272-273.tar.xz"


def script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "runs_archive.py"), *args], capture_output=True, text=True
    )


def test_a_file_that_is_not_an_archive_is_refused_with_exit_2(tmp_path):
    (tmp_path / "monitors-1-2.tar.xz").write_text("not xz")
    done = script("unpack", "--archives", str(tmp_path), "--runs", str(tmp_path / "runs"))
    assert done.returncode == 2
    assert "monitors-1-2.tar.xz: not a runs archive" in done.stderr


def test_packing_seeds_with_no_saved_run_is_a_usage_error(tmp_path):
    done = script("pack", "--seeds", "5-6", "--runs", str(tmp_path), "--archives", str(tmp_path / "a"))
    assert done.returncode == 2 and "no saved runs of seeds 5-6" in done.stderr
    assert not (tmp_path / "a").exists()


def test_an_archived_name_with_a_folder_is_refused_before_anything_is_written(archive, tmp_path):
    out = tmp_path / "evil.tar.xz"
    with tarfile.open(out, "w:xz") as tar:
        info = tarfile.TarInfo("../outside.json")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"{}"))
    with pytest.raises(ValueError, match="not a saved run's file name"):
        archive.unpack(out, tmp_path / "runs")
    assert not (tmp_path / "outside.json").exists()
