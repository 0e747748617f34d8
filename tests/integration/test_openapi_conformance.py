"""The HTTP surface against its own OpenAPI document, by schemathesis (from PyPI; nobody here wrote
it): every operation, every default check, positive and negative data, a fixed seed, bounded to a
couple of minutes. tests/schemathesis/ holds its configuration and hooks (CONTRIBUTING.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .conftest import serving

HERE = Path(__file__).resolve().parent.parent / "schemathesis"
SCHEMATHESIS = Path(sys.executable).parent / "schemathesis"
SEED = "1"
MAX_EXAMPLES = "25"


def test_schemathesis_finds_nothing_with_every_default_check(tmp_path: Path) -> None:
    with serving(tmp_path) as running:
        done = subprocess.run(
            [
                str(SCHEMATHESIS),
                "--config-file",
                str(HERE / "schemathesis.toml"),
                "--no-color",
                "run",
                f"{running.http_url}/openapi.json",
                "--seed",
                SEED,
                "--max-examples",
                MAX_EXAMPLES,
                "--request-timeout",
                "30",
            ],
            capture_output=True,
            text=True,
            timeout=900,
            cwd=HERE,
            env=os.environ | {"PYTHONPATH": str(HERE)},
        )
    report = done.stdout[-6000:]
    assert done.returncode == 0, report + done.stderr[-2000:]
    assert "Selected: 20/20" in report and "Tested: 20" in report, report
    assert " passed" in report and "failures" not in report.rsplit("SUMMARY", 1)[-1], report
