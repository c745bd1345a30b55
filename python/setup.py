"""Builds kvrail_engine with its generated engine API module built in.

Everything declarative is in pyproject.toml; this file only adds the build step that compiles
proto/kvrail/v1/engine.proto (a symlink to the repository's proto/, so that the one .proto is
what pip sees from ./python) into kvrail_engine/engine_pb2.py and engine_pb2.pyi, with protoc
(Debian's protobuf-compiler, or $PROTOC), straight into the build tree: nothing generated is
written to the source tree.
"""

import os
import shutil
import subprocess
import sys
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_ROOT = os.path.join(HERE, "proto")
PROTO = "kvrail/v1/engine.proto"


def protoc() -> str:
    found = os.environ.get("PROTOC") or shutil.which("protoc")
    if not found:
        sys.exit("kvrail-engine setup.py: protoc not found on PATH (install Debian's "
                 "protobuf-compiler, or set PROTOC): it generates kvrail_engine/engine_pb2.py "
                 "from " + PROTO)
    return found


def generate(package_dir: str) -> None:
    """engine_pb2.py and engine_pb2.pyi from the proto, into `package_dir`."""
    if not os.path.isfile(os.path.join(PROTO_ROOT, PROTO)):
        sys.exit("kvrail-engine setup.py: %s is missing (python/proto/%s links to the "
                 "repository's proto/; copy the tree with its links followed, cp -rL)"
                 % (os.path.join(PROTO_ROOT, PROTO), PROTO))
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([protoc(), "--proto_path=" + PROTO_ROOT, "--python_out=" + out,
                        "--pyi_out=" + out, PROTO], check=True)
        os.makedirs(package_dir, exist_ok=True)
        for name in ("engine_pb2.py", "engine_pb2.pyi"):
            shutil.copyfile(os.path.join(out, "kvrail", "v1", name),
                            os.path.join(package_dir, name))


class BuildPyWithProto(build_py):
    def run(self) -> None:
        super().run()
        if not self.dry_run:
            generate(os.path.join(self.build_lib, "kvrail_engine"))


setup(cmdclass={"build_py": BuildPyWithProto})
