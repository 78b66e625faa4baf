"""Keep a held-out set's saved runs in git, compressed, so that its replays outlive a checkout (issue 16).

``benchmarks/monitors.py`` saves every run it trains (losses, gradient norms and each check's
monitor signals; about 1 MB of JSON a deep run) under ``benchmarks/results/monitors/``, which git
ignores. Everything that reads a set again without training reads those files: the matched replay,
``candidate_replay.py``, ``sublayer_margin.py``, ``restore_replay.py`` and the run-by-run facts in
``benchmarks/monitors-heldout.md``. On 2026-12-01 a new checkout arrived without them, and with
them went every saved run of the sets before 272-273 (``benchmarks/monitors-log.md``).

``pack`` writes the saved runs of some seeds (every failure, kind and policy) into one xz-compressed
tar, ``benchmarks/results/runs/monitors-A-B.tar.xz`` (about a sixth of the JSON's size). The archive is
a function of the files alone (sorted names, zero times and owners), so packing the same runs again
leaves git with nothing to commit. ``unpack`` puts back every archived run missing from the runs
folder; a run there that differs from its archived copy (trained again under other monitor code, say)
is kept and named, never overwritten.

Run: python benchmarks/runs_archive.py pack --seeds 272-273 | unpack [--runs DIR] [--archives DIR]
(seconds).
"""

from __future__ import annotations

import argparse
import io
import json
import tarfile
from pathlib import Path

from matched_detectors import RUNS, seed_range

from rksp_cli.files import atomic_path

ARCHIVES = Path(__file__).parent / "results" / "runs"


def archive_path(seeds: set[int], archives: Path = ARCHIVES) -> Path:
    span = f"{min(seeds)}-{max(seeds)}" if len(seeds) > 1 else f"{min(seeds)}"
    return archives / f"monitors-{span}.tar.xz"


def runs_of(seeds: set[int], runs: Path = RUNS) -> list[Path]:
    """Every run saved under ``runs`` whose seed is in ``seeds``, guarded twins included (the seed is
    read from the run, not parsed from a name that policies extend)."""
    return sorted(p for p in runs.glob("*.json") if json.loads(p.read_bytes())["seed"] in seeds)


def pack(paths: list[Path], out: Path) -> None:
    """``paths`` into one reproducible tar.xz at ``out``, written whole or not at all."""
    with atomic_path(out) as tmp, tarfile.open(tmp, "w:xz", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(paths, key=lambda p: p.name):
            data = path.read_bytes()
            info = tarfile.TarInfo(path.name)
            info.size, info.mode = len(data), 0o644  # mtime, uid and gid stay 0
            tar.addfile(info, io.BytesIO(data))


def unpack(archive: Path, runs: Path = RUNS) -> tuple[list[str], list[str]]:
    """Put back ``archive``'s runs missing under ``runs``. Returns the names restored, and those kept
    because the saved run there differs from the archived one."""
    runs.mkdir(parents=True, exist_ok=True)
    restored, differing = [], []
    with tarfile.open(archive, "r:xz") as tar:
        for member in tar.getmembers():
            if not member.isfile() or Path(member.name).name != member.name:
                raise ValueError(f"{archive}: {member.name!r} is not a saved run's file name")
            data = tar.extractfile(member).read()
            target = runs / member.name
            if not target.exists():
                with atomic_path(target) as tmp:
                    tmp.write_bytes(data)
                restored.append(member.name)
            elif target.read_bytes() != data:
                differing.append(member.name)
    return restored, differing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("pack", "unpack"))
    parser.add_argument("--seeds", type=seed_range, help="pack: the seeds (a range a-b), one archive")
    parser.add_argument("--runs", type=Path, default=RUNS, help="folder of the saved runs")
    parser.add_argument("--archives", type=Path, default=ARCHIVES, help="folder of the archives")
    args = parser.parse_args()
    if args.action == "pack":
        if args.seeds is None:
            parser.error("pack needs --seeds A-B")
        if not (paths := runs_of(args.seeds, args.runs)):
            parser.error(f"no saved runs of seeds {min(args.seeds)}-{max(args.seeds)} under {args.runs}")
        out = archive_path(args.seeds, args.archives)
        pack(paths, out)
        print(f"{out}: {len(paths)} runs, {out.stat().st_size / 2**20:.1f} MiB")
        return
    archives = sorted(args.archives.glob("monitors-*.tar.xz"))
    for archive in archives:
        try:
            restored, differing = unpack(archive, args.runs)
        except (tarfile.TarError, ValueError, EOFError) as error:
            parser.exit(2, f"error: {archive}: not a runs archive ({error})\n")
        kept = f"; kept {len(differing)} saved run(s) that differ from it: {', '.join(differing)}" if differing else ""
        print(f"{archive.name}: restored {len(restored)} run(s){kept}")
    if not archives:
        print(f"no archives under {args.archives}")


if __name__ == "__main__":
    main()
