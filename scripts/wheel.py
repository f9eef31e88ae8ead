"""Packs the Python wheel from the native module scripts/dist.sh built.

dist.sh builds every native crate in one cargo invocation (one feature
resolution, so one compile of the dependency graph); maturin would build
the Python crate again on its own. This writes the same wheel maturin
would: the pure-Python package, the module as dlock/_dlock.abi3.so, and
the .dist-info (METADATA from pyproject.toml, WHEEL, the licence, RECORD).
auditwheel checks it afterwards.

usage: python scripts/wheel.py BINDINGS_DIR MODULE_SO TAGS OUT_DIR
  e.g. python scripts/wheel.py bindings/python target/.../lib_dlock.so \
         cp39-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64 dist
"""

from __future__ import annotations

import base64
import hashlib
import re
import sys
import tomllib
import zipfile
from pathlib import Path


def record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode()


def metadata(project: dict, licence_file: str) -> str:
    lines = [
        "Metadata-Version: 2.4",
        f"Name: {project['name']}",
        f"Version: {project['version']}",
    ]
    lines += [f"Classifier: {c}" for c in project.get("classifiers", [])]
    if "license" in project:
        lines.append(f"License-Expression: {project['license']}")
    lines.append(f"License-File: {licence_file}")
    if "description" in project:
        lines.append(f"Summary: {project['description']}")
    if "requires-python" in project:
        lines.append(f"Requires-Python: {project['requires-python']}")
    return "\n".join(lines) + "\n"


def main() -> None:
    bindings, module, tags, out = sys.argv[1:5]
    root = Path(bindings)
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    project, maturin = pyproject["project"], pyproject["tool"]["maturin"]
    package, _, native = maturin["module-name"].partition(".")  # dlock, _dlock
    source = root / maturin.get("python-source", ".") / package
    dist_name = re.sub(r"[-_.]+", "_", project["name"]).lower()
    version = project["version"]
    info = f"{dist_name}-{version}.dist-info"
    python_tag, abi_tag, platforms = tags.split("-", 2)

    files: list[tuple[str, bytes]] = []
    for path in sorted(source.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            files.append((f"{package}/{path.relative_to(source).as_posix()}", path.read_bytes()))
    files.append((f"{package}/{native}.abi3.so", Path(module).read_bytes()))
    # The alert rules, their promtool tests and the dashboard (docs/metrics.md).
    for extra in ("packaging/prometheus/dlock-alerts.yml", "packaging/prometheus/dlock-alerts.test.yml",
                  "packaging/grafana/dlock-dashboard.json"):
        files.append((f"{package}/data/{Path(extra).name}", Path(extra).read_bytes()))
    licence = Path("LICENSE")
    files.append((f"{info}/licenses/LICENSE", licence.read_bytes()))
    files.append((f"{info}/METADATA", metadata(project, "LICENSE").encode()))
    wheel = ["Wheel-Version: 1.0", "Generator: dlock scripts/wheel.py", "Root-Is-Purelib: false"]
    wheel += [f"Tag: {python_tag}-{abi_tag}-{p}" for p in platforms.split(".")]
    files.append((f"{info}/WHEEL", ("\n".join(wheel) + "\n").encode()))

    record = [f"{name},{record_hash(data)},{len(data)}" for name, data in files]
    record.append(f"{info}/RECORD,,")
    files.append((f"{info}/RECORD", ("\n".join(record) + "\n").encode()))

    target = Path(out) / f"{dist_name}-{version}-{tags}.whl"
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, data in files:
            entry = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            executable = name.endswith(".so")
            entry.external_attr = (0o755 if executable else 0o644) << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(entry, data)
    print(f"wheel.py: {target}")


if __name__ == "__main__":
    main()
