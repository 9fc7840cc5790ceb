"""The wheel holds every kfbot package, the JSON schema, and the rules/ folder."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_contents(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(ROOT)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("kfbot-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    packages = {p.parent.relative_to(ROOT).as_posix() for p in (ROOT / "kfbot").rglob("*.py")}
    for package in packages:
        assert f"{package}/__init__.py" in names, f"{package} is missing from the wheel"
    assert "kfbot/schemas/scan-v1.json" in names
    rules = {p.relative_to(ROOT / "rules").as_posix() for p in (ROOT / "rules").rglob("*")
             if p.is_file()}
    assert rules and {f"kfbot/rules/{r}" for r in rules} <= names
    assert "kfbot/rules/anticheat.yaml" in names  # the static anti-cheating rules
    assert not any(n.startswith(("tests/", "fixtures/")) for n in names)
