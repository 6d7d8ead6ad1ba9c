"""Rebuild the check corpus: the listed files of public training code, at the listed commits.

The corpus is kept as a list (``corpus.tsv``: repository, commit, path, split) and labels
(``labels.tsv``); the third-party files themselves are never committed. This script writes
them under ``benchmarks/check_corpus/files/<owner>__<name>/<path>`` (git-ignored) from local
git mirrors of the repositories, one per repository:

    python benchmarks/check_corpus/build.py --mirrors /path/to/mirrors

A mirror is looked up as ``MIRRORS/<owner>+<name>/repo``, ``MIRRORS/<owner>+<name>`` or
``MIRRORS/<owner>/<name>`` (a bare or ordinary git directory holding the commit). Nothing is
downloaded. Tests never need the corpus; ``benchmarks/check_precision.py`` does.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
FILES = HERE / "files"


def corpus_rows(path: Path = HERE / "corpus.tsv") -> list[dict[str, str]]:
    """The corpus list: one dict per file (repo, commit, path, split)."""
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


def local_path(repo: str, path: str) -> Path:
    """Where a corpus file is rebuilt: ``files/<owner>__<name>/<path>``."""
    return FILES / repo.replace("/", "__") / path


def _mirror(mirrors: Path, repo: str) -> Path:
    owner, name = repo.split("/")
    for candidate in (mirrors / f"{owner}+{name}" / "repo", mirrors / f"{owner}+{name}",
                      mirrors / owner / name):
        if candidate.is_dir():
            return candidate
    raise SystemExit(f"no git mirror of {repo} under {mirrors} (expected {owner}+{name}/repo); "
                     "clone it there first")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirrors", type=Path, required=True,
                        help="folder of git mirrors, one per repository")
    parser.add_argument("--split", action="append",
                        help="rebuild only the files of this split (repeatable) and the context "
                             "files of their repositories")
    args = parser.parse_args()
    rows = corpus_rows()
    if args.split:
        repos = {r["repo"] for r in rows if r["split"] in args.split}
        rows = [r for r in rows if r["repo"] in repos
                and (r["split"] in args.split or r["split"] == "context")]
    written = 0
    for row in rows:
        mirror = _mirror(args.mirrors, row["repo"])
        try:
            text = subprocess.run(["git", "-C", str(mirror), "show",
                                   f"{row['commit']}:{row['path']}"], check=True,
                                  capture_output=True).stdout
        except subprocess.CalledProcessError as err:
            raise SystemExit(f"{row['repo']}@{row['commit'][:10]}:{row['path']}: "
                             f"{err.stderr.decode().strip()}") from err
        out = local_path(row["repo"], row["path"])
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(text)
        written += 1
    print(f"rebuilt {written} files under {FILES}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
