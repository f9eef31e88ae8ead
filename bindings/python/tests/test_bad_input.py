"""The Python player of scenarios/vectors/bad_input.json: every case gets
the vector's code (the exception's ``.code``), decided by the core; the face
only converts. Cases Python cannot express are skipped by the file itself
(``"skip": {"python": why}``); every word of a case's ``message_has`` is in
the error's message. Also: the constants the module exports are
the vector's (read from the native module, the core's)."""

from __future__ import annotations

import json
import pathlib
from typing import Any, Dict, List, Tuple

import pytest

import dlock
import dlock.prometheus

VECTOR = pathlib.Path(__file__).resolve().parents[3] / "scenarios" / "vectors" / "bad_input.json"
DATA: Dict[str, Any] = json.loads(VECTOR.read_text())
CASES: List[Dict[str, Any]] = DATA["cases"]


def play(case: Dict[str, Any]) -> Tuple[str, str]:
    """The code word the face answers ``case`` with (``"ok"``: accepted)
    and the error's message."""
    clients: List[dlock.Client] = []

    def client(**kw: Any) -> dlock.Client:
        c = dlock.Client(**kw)
        clients.append(c)
        return c

    kind = case["input"]
    try:
        if kind == "setting":
            client(memory=dlock.MemoryService(), **{case["setting"]: float(case["seconds"])})
        elif kind == "acquire_timeout":
            client(memory=dlock.MemoryService()).lock("bad-input/timeout").acquire(float(case["seconds"]))
        elif kind == "without_endpoints":
            client(**{case["setting"]: case["value"]})
        elif kind == "unknown_option":
            client(memory=dlock.MemoryService(), **{case["setting"]: 1})
        elif kind == "description":
            value = case["value"] if "value" in case else "x" * case["value_len"]
            client(memory=dlock.MemoryService(), description=value)
        elif kind == "lock_name":
            name = case["name"] if "name" in case else "a" * case["name_len"]
            client(memory=dlock.MemoryService()).lock(name)
        elif kind == "semaphore_limit":
            one = client(memory=dlock.MemoryService())
            if "first_limit" in case:
                one.semaphore(case["name"], case["first_limit"])
            one.semaphore(case["name"], case["limit"])
        else:
            pytest.fail(f"Python cannot play input {kind!r}, yet the vector does not skip it")
        return "ok", ""
    except dlock.Error as e:
        return e.code, str(e)
    finally:
        for c in clients:
            c.shutdown()


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_bad_input(case: Dict[str, Any]) -> None:
    why = case.get("skip", {}).get("python")
    if why:
        pytest.skip(why)
    code, message = play(case)
    assert code == case["code"], (case["id"], message)
    for word in case.get("message_has", []):
        assert word in message, (case["id"], word, message)


def test_an_unknown_keyword_of_a_session_is_invalid_option_too() -> None:
    c = dlock.Client(memory=dlock.MemoryService())
    with pytest.raises(dlock.InvalidOption) as e:
        c.session(frobnicate=1)
    assert e.value.code == "invalid_option" and "frobnicate" in str(e.value)
    c.shutdown()


def test_the_constants_are_the_cores() -> None:
    k = DATA["constants"]
    assert dlock.MAX_NAME_LEN == k["MAX_NAME_LEN"]
    assert dlock.MAX_KEY_LEN == k["MAX_KEY_LEN"]
    assert dlock.DEFAULT_MAX_OVERDUE * 1000 == k["DEFAULT_MAX_OVERDUE_MS"]
    assert dlock.RESIGN_GRACE * 1000 == k["RESIGN_GRACE_MS"]
    assert dlock.MAX_SEMAPHORE_LIMIT == k["MAX_SEMAPHORE_LIMIT"]
    assert dlock.prometheus.DEFAULT_LOCK_SERIES == k["DEFAULT_LOCK_SERIES"]
