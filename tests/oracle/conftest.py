"""Shared fixtures of the oracle tests: the lingtab binary and make-tiny models made for the run."""

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
LINGTAB_BIN = Path(os.environ.get("LINGTAB_BIN", REPO_ROOT / "target" / "debug" / "lingtab"))
FIXTURE = REPO_ROOT / "tests" / "fixtures" / "tiny-ling"


def lingtab(*args: str) -> str:
    """Runs the lingtab CLI and returns its stdout; fails the test with its stderr."""
    result = subprocess.run([str(LINGTAB_BIN), *args], capture_output=True, text=True)
    assert result.returncode == 0, f"lingtab {' '.join(args)} failed:\n{result.stderr}"
    return result.stdout


def inspect_json(first_part: Path) -> dict:
    return json.loads(lingtab("inspect", "--json", "--full", str(first_part)))


@pytest.fixture(scope="session")
def make_tiny(tmp_path_factory):
    """make_tiny(seed, *extra_args) -> path of part 1 of a freshly made model (cached per arguments)."""
    made = {}

    def make(seed: int, *extra: str) -> Path:
        key = (seed, extra)
        if key not in made:
            out = tmp_path_factory.mktemp(f"tiny-{seed}")
            lingtab("make-tiny", "--out", str(out), "--seed", str(seed), *extra)
            made[key] = sorted(out.glob("*-00001-of-*.gguf"))[0]
        return made[key]

    return make
