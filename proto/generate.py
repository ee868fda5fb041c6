"""Compile the .proto contracts in stoa_proto/ into Python modules beside them.

Run `uv run python proto/generate.py` after editing a .proto file; the test
proto/tests/test_generated.py fails while the committed modules are stale.
"""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path

from grpc_tools import protoc

HERE = Path(__file__).resolve().parent


def generate(out_dir: Path) -> None:
    protos = sorted(p.relative_to(HERE).as_posix() for p in (HERE / "stoa_proto").glob("*.proto"))
    include = str(resources.files("grpc_tools") / "_proto")
    args = ["protoc", f"-I{HERE}", f"-I{include}", f"--python_out={out_dir}", f"--pyi_out={out_dir}", *protos]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
