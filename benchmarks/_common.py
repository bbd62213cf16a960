"""What the benchmark scripts share: keeping a results file's notes, and checking that a
reference process really runs the reference releases.

Imported by the scripts in this folder and by the reference-side workers, which run under
the reference's interpreter: it imports nothing from this repository and nothing beyond
the standard library at module level.
"""

from __future__ import annotations

import importlib
from importlib import metadata
from pathlib import Path

#: The reference every benchmark compares against: the releases the issues name.
REFERENCE_VERSIONS = {"genlm-backend": "0.3.1", "genlm-bytes": "0.2.0"}
#: The module each reference distribution ships.
REFERENCE_MODULES = {"genlm-backend": "genlm.backend", "genlm-bytes": "genlm.bytes"}


def require_reference(*names: str) -> dict[str, str]:
    """Raise unless this process imports each named reference distribution (default: both)
    at its reference version, from that distribution's own files; returns ``name -> file``.

    An interpreter where this repository's genlm-bytes or its ``genlm.backend`` facade is
    importable would otherwise pass for the reference (both ship the modules the workers
    import), and the "reference" column would silently measure this repository.
    """
    found = {}
    for name in names or tuple(REFERENCE_VERSIONS):
        want = REFERENCE_VERSIONS[name]
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise RuntimeError(f"not the reference: no {name} installed (want {want})") from None
        if dist.version != want:
            raise RuntimeError(f"not the reference: {name} is {dist.version}, want {want}")
        module = importlib.import_module(REFERENCE_MODULES[name])
        file = Path(module.__file__).resolve()
        shipped = {Path(dist.locate_file(f)).resolve() for f in dist.files or ()}
        if file not in shipped:
            raise RuntimeError(
                f"not the reference: {module.__name__} comes from {file}, "
                f"not from {name} {want} ({dist.locate_file('')})"
            )
        found[name] = str(file)
    return found


def kept_notes(path: Path) -> str:
    """What follows the measured tables in ``path``: the hand-written notes of earlier
    rounds, from the first ``### `` heading on, which a rerun keeps ("" if none)."""
    if not path.is_file():
        return ""
    text = path.read_text(encoding="utf-8")
    start = text.find("\n### ")
    return "" if start < 0 else text[start:]


def write_results(path: Path, text: str) -> None:
    """Write a rerun's ``text`` to the results file ``path``, keeping its dated ``###``
    notes (:func:`kept_notes`) below it."""
    notes = kept_notes(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.rstrip("\n") + "\n" + notes, encoding="utf-8")
