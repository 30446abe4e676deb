"""Writes the hosts file's JSON Schema next to this module
(``python -m services.bootstrap.hosts_schema``), for editors and other tools;
a test fails when it drifts from libs/inventory.py. (proto_gen can publish
the same text as proto/hosts.schema.json.)"""

from __future__ import annotations

import sys
from pathlib import Path

from libs.inventory import render_hosts_schema

PATH = Path(__file__).with_name("hosts.schema.json")


def main() -> int:
    PATH.write_text(render_hosts_schema())
    print(f"wrote {PATH}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
