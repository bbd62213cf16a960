"""Fail when a public name of a GenLM distribution is not documented.

Run by ``nox -s docs`` (``python docs/check_docstrings.py``). The sources are read
statically with griffe, the library mkdocstrings renders the reference with, so no
backend library (torch, vllm, mlx) needs to be installed. A public name is one listed in a
package's ``__all__``; where griffe cannot read ``__all__`` (the lazy packages build it
from ``_EXPORTS``), the names griffe sees as public: those defined at the top level and
those imported as ``from m import X as X`` (their ``TYPE_CHECKING`` mirror of
``_EXPORTS``; the ``griffe_public_redundant_aliases`` extension, as in mkdocs.yml).
The check demands a docstring for every public name and for every public method or
property of a public class. It demands no ``Args:``/``Returns:`` sections: a contract is
written once, on the class, and a method's docstring is one line unless the method
differs from it; reviewers judge what a docstring says, a script only that it exists.
Exit status 1 lists every problem, one per line.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import griffe

ROOT = Path(__file__).resolve().parent.parent

#: Folder of each distribution's sources -> the public modules it ships.
PUBLIC_MODULES = {
    "genlm-core/src": [
        "genlm.core",
        "genlm.core.backend",
        "genlm.core.hookspecs",
        "genlm.core.mock",
        "genlm.core.smc",
        "genlm.core.testing",
        "genlm.core.cli",
    ],
    "genlm-bytes/src": ["genlm.bytes"],
    "genlm-backend-hf/src": ["genlm.backends.hf"],
    "genlm-backend-vllm/src": ["genlm.backends.vllm"],
    "genlm-backend-mlx/src": ["genlm.backends.mlx"],
    # The seed-API facade; checked as soon as its folder exists.
    "genlm-backend/src": ["genlm.backend"],
}


def check_function(path: str, function: griffe.Function) -> list[str]:
    """Problems of one public function or method: only a missing docstring."""
    return [] if function.docstring else [f"{path}: no docstring"]


def check_class(path: str, cls: griffe.Class) -> list[str]:
    """Problems of one public class and the public methods it defines itself."""
    problems = [] if cls.docstring else [f"{path}: no docstring"]
    for name, member in cls.members.items():
        # __init__ is private here too: the class docstring is its contract.
        if member.is_alias or member.inherited or name.startswith("_"):
            continue
        if member.is_function:
            problems += check_function(f"{path}.{name}", member)
        elif member.is_attribute and "property" in member.labels and not member.docstring:
            problems.append(f"{path}.{name}: no docstring")
    return problems


def check_object(path: str, obj: griffe.Object) -> list[str]:
    """Problems of one public name, whatever its kind."""
    if obj.is_class:
        return check_class(path, obj)
    if obj.is_function:
        return check_function(path, obj)
    if obj.is_module:
        return [] if obj.docstring else [f"{path}: no docstring"]
    return [] if obj.docstring else [f"{path}: no docstring (add a string literal after it)"]


#: The griffe extensions mkdocs.yml loads: they decide which names are public.
EXTENSIONS = ["griffe_public_redundant_aliases"]


def public_names(module: griffe.Module) -> list[str]:
    """``__all__`` where griffe reads it, else the names griffe sees as public."""
    if module.exports:
        return [str(name) for name in module.exports]
    return [n for n, m in module.members.items() if not n.startswith("_") and m.is_public]


def check_module(module: griffe.Module) -> list[str]:
    """Problems of a public module and of each of its public names."""
    problems = [] if module.docstring else [f"{module.path}: no module docstring"]
    for name in public_names(module):
        path = f"{module.path}.{name}"
        try:
            obj = module[name]
            target = obj.final_target if obj.is_alias else obj
        except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError) as exc:
            problems.append(
                f"{path}: not found statically ({exc!r}); a lazily exported name needs an "
                "`if TYPE_CHECKING:` import in the package so tools (and this reference) see it"
            )
            continue
        problems += check_object(path, target)
    return problems


def main() -> int:
    """Check every public module whose distribution folder exists; print the problems."""
    logging.getLogger("griffe").setLevel(logging.ERROR)  # its own parse warnings are noise here
    search_paths = [str(ROOT / folder) for folder in PUBLIC_MODULES if (ROOT / folder).is_dir()]
    loader = griffe.GriffeLoader(
        search_paths=search_paths,
        docstring_parser="google",
        extensions=griffe.load_extensions(*EXTENSIONS),
    )
    problems: list[str] = []
    checked = 0
    for folder, modules in PUBLIC_MODULES.items():
        if not (ROOT / folder).is_dir():
            continue
        for name in modules:
            module = loader.load(name)
            loader.resolve_aliases(implicit=True, external=False)
            problems += check_module(module)
            checked += 1
    for problem in problems:
        print(problem)
    print(f"{len(problems)} documentation problem(s) in {checked} public modules", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
