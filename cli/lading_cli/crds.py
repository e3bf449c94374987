"""
`lading crds`: write the CustomResourceDefinitions generated from the models, or check them.

The YAML under `crds/` (and the Helm chart's copy) is generated, never edited: `--check` is what
CI and the tests run, and it names every file that differs.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from lading_operator import crds

DEFAULT_OUTPUT_DIR = "crds"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output-dir",
        action="append",
        type=pathlib.Path,
        help=f"directory to write the CRD YAML files into; repeatable (default: {DEFAULT_OUTPUT_DIR})",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if any directory differs from what would be written",
    )


def run(args: argparse.Namespace) -> int:
    directories: list[pathlib.Path] = args.output_dir or [pathlib.Path(DEFAULT_OUTPUT_DIR)]
    if args.check:
        problems = [problem for directory in directories for problem in crds.stale(directory)]
        for problem in problems:
            print(f"lading crds: {problem}", file=sys.stderr)
        if problems:
            print("lading crds: run `make crds` (or `lading crds`) to regenerate", file=sys.stderr)
            return 1
        print(f"{len(crds.KINDS)} CRDs up to date in {', '.join(map(str, directories))}")
        return 0
    for directory in directories:
        written = crds.write(directory)
        print(f"{directory}: {len(written)} file(s) changed of {len(crds.KINDS)}")
    return 0
