"""genlm-core's sdist carries what its wheel is built from: the C sources and stories260K.

Usage: ``python check_sdist.py genlm_core-VERSION.tar.gz``. Also checks that nothing
compiled slipped in (a kernel built in a developer's tree must never ship as source).
"""

from __future__ import annotations

import sys
import tarfile

REQUIRED = [
    "src/genlm/core/_trie_kernel.c",
    "src/genlm/core/_ids.c",
    *(
        f"src/genlm/core/models/stories260K/{name}"
        for name in (
            "NOTICE.md",
            "config.json",
            "generation_config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
        )
    ),
]


def main(sdist: str) -> None:
    with tarfile.open(sdist) as archive:
        # Members are "genlm_core-VERSION/<path>".
        members = {name.partition("/")[2] for name in archive.getnames()}
    missing = [path for path in REQUIRED if path not in members]
    compiled = sorted(m for m in members if m.endswith((".so", ".pyd", ".dylib", ".o")))
    if missing or compiled:
        sys.exit(f"{sdist}: missing {missing}, compiled files {compiled}")
    print(f"{sdist}: carries the C sources and stories260K ({len(members)} files)")


if __name__ == "__main__":
    main(sys.argv[1])
