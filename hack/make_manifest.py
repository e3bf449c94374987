"""
Write the JSON-lines document manifest of a directory of text documents, for an
ExtractionBatch's `spec.manifestUri` (format: docs/large-batches.md).

    python hack/make_manifest.py DOCS_DIR [-o manifest.jsonl] [--uri-prefix PREFIX]

Every `*.txt` file under DOCS_DIR (recursively, in path order) becomes one line: the key is its
path relative to DOCS_DIR without `.txt`, the URI is PREFIX + that relative path (default
PREFIX: `file://` + DOCS_DIR's absolute path + `/`), plus the file's SHA-256 and size. Use
--uri-prefix for the path where the workers see the directory (`file:///data/acme/march/`: root
/data, namespace acme) or for where it is served over HTTP (`https://files.example/march/`).

    python hack/make_manifest.py --example [--check]   (re)write examples/large-batch/manifest.jsonl
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import sys
import urllib.parse

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "large-batch"
EXAMPLE_PREFIX = "file:///data/acme/large-batch/documents/"
"""Where the example's documents are when the shared volume is mounted at /data (the document
root) and the example sits in namespace acme's directory."""


def manifest_lines(documents: pathlib.Path, *, uri_prefix: str | None = None) -> list[str]:
    base = documents.resolve()
    prefix = uri_prefix if uri_prefix is not None else base.as_uri() + "/"
    lines = []
    for path in sorted(base.rglob("*.txt")):
        relative = path.relative_to(base).as_posix()
        data = path.read_bytes()
        lines.append(
            json.dumps(
                {
                    "key": relative.removesuffix(".txt"),
                    "uri": prefix + urllib.parse.quote(relative),
                    "sha256": hashlib.sha256(data).hexdigest(),
                    "bytes": len(data),
                },
                separators=(", ", ": "),
            )
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("documents", nargs="?", type=pathlib.Path, help="directory of *.txt documents")
    parser.add_argument("-o", "--output", type=pathlib.Path, help="manifest file (default: stdout)")
    parser.add_argument("--uri-prefix", help="URI of DOCS_DIR as the workers see it, ending in '/'")
    parser.add_argument("--example", action="store_true", help="write examples/large-batch/manifest.jsonl")
    parser.add_argument("--check", action="store_true", help="with --example: exit 1 if the file is not current")
    args = parser.parse_args()
    if args.example:
        text = "\n".join(manifest_lines(EXAMPLE / "documents", uri_prefix=EXAMPLE_PREFIX)) + "\n"
        target = EXAMPLE / "manifest.jsonl"
        if args.check:
            if target.read_text() != text:
                print(f"{target} is not current; run python hack/make_manifest.py --example", file=sys.stderr)
                return 1
            return 0
        target.write_text(text)
        return 0
    if args.documents is None or not args.documents.is_dir():
        parser.error("DOCS_DIR must be a directory")
    if args.uri_prefix is not None and not args.uri_prefix.endswith("/"):
        parser.error("--uri-prefix must end in '/'")
    text = "\n".join(manifest_lines(args.documents, uri_prefix=args.uri_prefix)) + "\n"
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
