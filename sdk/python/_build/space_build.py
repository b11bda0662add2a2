"""A minimal PEP 517 / PEP 660 build backend using only the standard library.

It builds a pure-Python wheel of the space_sandbox package, an sdist, and an
editable wheel (a .pth file pointing at this directory). The distribution's
name and version come from here and space_sandbox/__init__.py."""

import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = "space_sandbox"
NAME = "space-sandbox"
DIST = "space_sandbox"
SUMMARY = "Python SDK for SPACE sandboxes (standard library only)"


def _version():
    with open(os.path.join(ROOT, PKG, "__init__.py"), encoding="utf-8") as f:
        return re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)


def _metadata():
    readme = ""
    path = os.path.join(ROOT, "README.md")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            readme = f.read()
    return (f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {_version()}\nSummary: {SUMMARY}\n"
            f"License: Apache-2.0\nRequires-Python: >=3.9\n"
            f"Description-Content-Type: text/markdown\n\n{readme}").encode()


def _wheel_file():
    return b"Wheel-Version: 1.0\nGenerator: space_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n"


def _files():
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, PKG)):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for fn in sorted(filenames):
            if fn.endswith(".py"):
                full = os.path.join(dirpath, fn)
                yield full, os.path.relpath(full, ROOT).replace(os.sep, "/")


def _write_wheel(directory, entries):
    distinfo = f"{DIST}-{_version()}.dist-info"
    name = f"{DIST}-{_version()}-py3-none-any.whl"
    entries = list(entries) + [(f"{distinfo}/METADATA", _metadata()), (f"{distinfo}/WHEEL", _wheel_file())]
    record = []
    with zipfile.ZipFile(os.path.join(directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data in entries:
            z.writestr(arc, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{arc},sha256={digest},{len(data)}")
        record.append(f"{distinfo}/RECORD,,")
        z.writestr(f"{distinfo}/RECORD", "\n".join(record) + "\n")
    return name


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def _prepare(metadata_directory):
    distinfo = f"{DIST}-{_version()}.dist-info"
    os.makedirs(os.path.join(metadata_directory, distinfo), exist_ok=True)
    for fn, data in (("METADATA", _metadata()), ("WHEEL", _wheel_file())):
        with open(os.path.join(metadata_directory, distinfo, fn), "wb") as f:
            f.write(data)
    return distinfo


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    return _prepare(metadata_directory)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    return _prepare(metadata_directory)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, ((arc, _read(full)) for full, arc in _files()))


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, [(f"__editable__.{DIST}.pth", (ROOT + "\n").encode())])


def build_sdist(sdist_directory, config_settings=None):
    base = f"{DIST}-{_version()}"
    name = base + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as t:
        for rel in ["pyproject.toml", "README.md", "_build/space_build.py"]:
            if os.path.exists(os.path.join(ROOT, rel)):
                t.add(os.path.join(ROOT, rel), f"{base}/{rel}")
        for full, arc in _files():
            t.add(full, f"{base}/{arc}")
        for dirpath, _, filenames in os.walk(os.path.join(ROOT, "tests")):
            for fn in sorted(filenames):
                if fn.endswith(".py"):
                    full = os.path.join(dirpath, fn)
                    t.add(full, f"{base}/{os.path.relpath(full, ROOT)}")
        pkg_info = _metadata()
        ti = tarfile.TarInfo(f"{base}/PKG-INFO")
        ti.size = len(pkg_info)
        t.addfile(ti, io.BytesIO(pkg_info))
    return name
