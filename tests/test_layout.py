"""The house stays walkable (issue 32): no folder under ``prefixgate/`` holds more than
:data:`MAX_MODULES` modules directly. A folder past that is split by concern into packages (as
``proxy/``, ``local_engine/``, ``cache/`` and ``rewriter/`` were) before it grows further.

A module is a ``.py`` file other than ``__init__.py`` (the package's face, not a concern);
subpackages count as one place each, not as their modules. Static assets (``static/``) and
``__pycache__`` are not packages.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_MODULES = 15


def crowded(top: Path, limit: int = MAX_MODULES) -> dict[str, int]:
    """``{folder (relative to top's parent): its module count}`` for every folder under ``top``
    (``top`` included) holding more than ``limit`` modules directly."""
    out: dict[str, int] = {}
    for folder in [top, *sorted(p for p in top.rglob("*") if p.is_dir())]:
        if "__pycache__" in folder.parts:
            continue
        n = sum(1 for f in folder.glob("*.py") if f.name != "__init__.py")
        if n > limit:
            out[str(folder.relative_to(top.parent))] = n
    return out


def test_no_folder_under_prefixgate_holds_more_than_15_modules() -> None:
    assert crowded(ROOT / "prefixgate") == {}


def test_a_crowded_folder_is_named_with_its_count(tmp_path: Path) -> None:
    pkg = tmp_path / "prefixgate" / "room"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    for i in range(MAX_MODULES):
        (pkg / f"m{i}.py").write_text("")
    assert crowded(tmp_path / "prefixgate") == {}
    (pkg / "one_more.py").write_text("")
    (pkg / "notes.txt").write_text("")
    assert crowded(tmp_path / "prefixgate") == {"prefixgate/room": MAX_MODULES + 1}
