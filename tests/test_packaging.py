"""Installed, prefixgate is one top-level package (issue 11, item 5): building and installing the
wheel puts ``prefixgate`` (and its dist-info) in site-packages and nothing named ``config``,
``cache`` or ``proxy`` that would shadow a user's own module; a user's ``config.py`` in the
working directory still wins ``import config`` next to a working prefixgate; the wheel carries
its data files (default policy, dashboard page), its licence, URLs and the ``prefixgate`` script.
"""

from __future__ import annotations

import fcntl
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """The wheel, built once per test run: pip builds in the checkout's own ``build/``, so two
    xdist workers building at once raced there (a flaky setup error); the first builds under a
    lock in the run's shared temp folder, the others take its wheel."""
    base = tmp_path_factory.getbasetemp()
    root = base if worker_id == "master" else base.parent  # this run's, shared by its workers
    out = root / "prefixgate-wheel"
    with open(root / "prefixgate-wheel.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not list(out.glob("prefixgate-*.whl")):
            out.mkdir(exist_ok=True)
            # --no-build-isolation: build with this environment's setuptools (no download)
            subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                            "--no-build-isolation", "-w", str(out), str(REPO)],
                           check=True, capture_output=True, timeout=300)
        (whl,) = out.glob("prefixgate-*.whl")
    return whl


@pytest.mark.slow
def test_wheel_has_one_top_level_package_and_its_data(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"prefixgate", next(t for t in tops if t.endswith(".dist-info"))}
    for want in ("prefixgate/config/default_policy.yaml", "prefixgate/proxy/observe/static/dashboard.html",
                 "prefixgate/proxy/observe/static/uplot/uPlot.iife.min.js", "prefixgate/__main__.py"):
        assert want in names, want
    meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
    meta = Parser().parsestr(zipfile.ZipFile(wheel).read(meta_name).decode())
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("Project-URL")
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "prefixgate = prefixgate.proxy.cli:app" in zipfile.ZipFile(wheel).read(entry).decode()


@pytest.mark.slow
def test_a_users_config_module_wins_next_to_installed_prefixgate(wheel: Path,
                                                                   tmp_path: Path) -> None:
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(site), str(wheel)], check=True, capture_output=True, timeout=300)
    assert not {"config", "cache", "proxy", "rewriter", "local_engine"} & {
        p.name for p in site.iterdir()}
    work = tmp_path / "work"
    work.mkdir()
    for name in ("config", "cache", "proxy"):  # a user's own modules, as many projects have
        (work / f"{name}.py").write_text(f"WHO = 'user {name}'\n")
    probe = ("import config, cache, proxy, prefixgate, prefixgate.proxy.app\n"
             "import prefixgate.config.loader as L\n"
             "assert (config.WHO, cache.WHO, proxy.WHO) == "
             "('user config', 'user cache', 'user proxy')\n"
             "assert L.default_policy().backends\n"
             "print(prefixgate.__file__)\n")
    r = subprocess.run([sys.executable, "-c", probe], cwd=work, capture_output=True, text=True,
                       timeout=120, env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin",
                                         "HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().startswith(str(site))
    v = subprocess.run([sys.executable, "-m", "prefixgate", "--version"], cwd=work,
                       capture_output=True, text=True, timeout=120,
                       env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert v.returncode == 0 and v.stdout.startswith("prefixgate "), v.stderr
