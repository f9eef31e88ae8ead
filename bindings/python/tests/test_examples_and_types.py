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


def readme_block(face: str, lang: str) -> str:
    """The first ```LANG block under README.md's ``## FACE`` heading."""
    text = (ROOT / "README.md").read_text()
    section = text.split(f"\n## {face}\n", 1)[1]
    return section.split(f"```{lang}\n", 1)[1].split("```", 1)[0]


def test_the_readme_loop_stops_at_a_fence_as_its_comment_says() -> None:
    """Issue 32, 9: README.md's Python loop, as written, with the default
    reacquire: a fence (its lock key deleted) while it works stops it; no
    unit runs under the token of the reacquisition (it did in 14 of 40
    runs, when the loop's next permit came after the reacquisition). 30
    runs, each fenced at its third unit."""
    code = readme_block("Python", "python")
    harness = (
        "import threading, time\n"
        "import dlock\n"
        "units, stopped = [], []\n"
        "def do_one_unit(token):\n"
        "    units.append(token)\n"
        "    if len(units) == 3:\n"
        "        # the fence: an operator deletes the key; the lock reacquires\n"
        "        assert dlock.MemoryService.shared().delete_lock_key(NAME)\n"
        "        while lock.token == token: time.sleep(0.001)\n"
        "    assert len(units) < 50, 'the loop did not stop at the fence'\n"
        "def commit(): pass\n"
    )
    for run_ in range(30):
        name = f"readme-{os.getpid()}-{run_}"
        body = code.replace('client.lock("orders")', f"client.lock({name!r})")
        assert body != code, "the README's lock name moved: update this test"
        ns: dict = {"NAME": name}
        exec(compile(harness + body, "README.md", "exec"), ns)
        units = ns["units"]
        assert len(set(units)) == 1, f"run {run_}: worked under {sorted(set(units))} (the new token after the fence)"
        assert len(units) == 3, f"run {run_}: {len(units)} units"


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
    shown = out.stdout + out.stderr  # a failure shows every line it printed
    assert "committed 'unit 2' with token 1" in lines, shown
    assert "waiter gave up after 0.2 s; its state: Released" in lines, shown
    assert "next holder: token 2" in lines, shown


def test_stub_matches_the_module() -> None:
    out = run(sys.executable, "-m", "mypy.stubtest", "dlock")
    assert out.returncode == 0, out.stdout + out.stderr


def test_package_and_examples_pass_mypy_strict() -> None:
    out = run(sys.executable, "-m", "mypy", "--strict", "-p", "dlock")
    assert out.returncode == 0, out.stdout + out.stderr
    out = run(sys.executable, "-m", "mypy", "--strict", "worker.py", "worker_async.py", cwd=EXAMPLES)
    assert out.returncode == 0, out.stdout + out.stderr
