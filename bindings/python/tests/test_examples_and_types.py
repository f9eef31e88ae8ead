"""The examples' stories (examples/python), and the types: the stub of the
native module against the built module (mypy's stubtest), and the typed
examples under mypy --strict."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples" / "python"


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DLOCK_ENDPOINTS"}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_worker_example_refuses_the_stale_write() -> None:
    out = run(sys.executable, str(EXAMPLES / "worker.py"))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "a: committed 'unit 2 by a' with token 1" in lines
    assert any(line.startswith("a: fenced, token 1, 1 unit(s) in flight") for line in lines)
    assert "a: permit still valid? False" in lines
    assert "a: late write with token 1: refused (stale)" in lines
    assert lines[-1] == "row: 'unit 0 by b' token 2"


def test_async_worker_example() -> None:
    out = run(sys.executable, str(EXAMPLES / "worker_async.py"), cwd=EXAMPLES)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "committed 'unit 2' with token 1" in lines
    assert "waiter gave up after 0.2 s; its state: Released" in lines
    assert "next holder: token 2" in lines


def test_stub_matches_the_module() -> None:
    out = run(sys.executable, "-m", "mypy.stubtest", "dlock")
    assert out.returncode == 0, out.stdout + out.stderr


def test_package_and_examples_pass_mypy_strict() -> None:
    out = run(sys.executable, "-m", "mypy", "--strict", "-p", "dlock")
    assert out.returncode == 0, out.stdout + out.stderr
    out = run(sys.executable, "-m", "mypy", "--strict", "worker.py", "worker_async.py", cwd=EXAMPLES)
    assert out.returncode == 0, out.stdout + out.stderr
