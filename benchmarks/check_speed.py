"""Time `splitsync check` over the first N scored files of the check corpus.

The files are read with the local modules they import (as `splitsync check` does), so more
files are analysed than named; the report gives both counts, the CPU time (this process and
the worker processes that read the files, all cores together: less sensitive than the wall
clock to other load on the machine) and the wall time, as the median of a few repeats.

    python benchmarks/check_corpus/build.py --mirrors DIR     # once
    PYTHONPATH=src python benchmarks/check_speed.py [--files 150] [--repeats 3] [--jobs N]

`--jobs 1` reads every file in this process (the CPU time of one core); the default is what
`splitsync check` does (one process per core for that many files).
"""

from __future__ import annotations

import argparse
import csv
import resource
import statistics
import time
from pathlib import Path

CORPUS = Path(__file__).resolve().parent / "check_corpus"


def main() -> int:
    from splitsync.check import check_paths

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=None,
                        help="processes reading the files (default: as splitsync check)")
    args = parser.parse_args()
    with open(CORPUS / "corpus.tsv", newline="") as fh:
        rows = [r for r in csv.DictReader(fh, delimiter="\t") if r["split"] != "context"]
    files = [CORPUS / "files" / r["repo"].replace("/", "__") / r["path"]
             for r in rows[:args.files]]
    missing = [f for f in files if not f.is_file()]
    if missing:
        raise SystemExit(f"missing {missing[0]}: run benchmarks/check_corpus/build.py first")
    cpu, wall, checked = [], [], 0
    def spent() -> float:  # this process and the workers it waited for
        return time.process_time() + sum(
            getattr(resource.getrusage(resource.RUSAGE_CHILDREN), f) for f in ("ru_utime",
                                                                              "ru_stime"))

    for _ in range(args.repeats):
        c0, w0 = spent(), time.perf_counter()
        _, checked = check_paths(files, jobs=args.jobs)
        cpu.append(spent() - c0)
        wall.append(time.perf_counter() - w0)
    print(f"{len(files)} files named, {checked} analysed (with their imports, "
          f"jobs={args.jobs or 'auto'}): "
          f"median CPU {statistics.median(cpu):.2f} s, wall {statistics.median(wall):.2f} s, "
          f"{1000 * statistics.median(cpu) / checked:.1f} ms CPU per analysed file")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
