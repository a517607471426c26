"""The kernel's fingerprint (autograder/fingerprint.py), taken here with a stand-in for
IPython's shell, and the request that carries its source to the kernel (integrity.py).
Without a kernel; test_hostile.py's catalogue tampers with real kernels."""

from __future__ import annotations

import json
import math

from autograder import fingerprint, integrity


class _Shell:
    """What fingerprint() reads of IPython's shell."""

    def __init__(self):
        self.input_transformers_cleanup, self.input_transformers_post = [], []
        self.ast_transformers, self.custom_exceptions = [], ()
        self.user_ns = {"np": math, "x": 1.5}

    def run_cell(self, source):
        return source


def _take(shell):
    return json.loads(fingerprint.fingerprint(shell))


def test_the_fingerprint_sees_patched_modules_shadowed_builtins_and_hooks(monkeypatch):
    shell = _Shell()
    base, seen = _take(shell), {}
    assert integrity.differences(base, _take(shell), seen, {"all"}) == []
    monkeypatch.setattr(math, "isclose", lambda *a, **k: True)
    shell.user_ns["all"] = lambda items: True
    shell.run_cell = lambda source: None
    shell.custom_exceptions = (BaseException,)
    assert integrity.differences(base, _take(shell), seen, {"all"}) == [
        "math.isclose was replaced",
        "the kernel's custom_exceptions was changed",
        "the kernel's shell.run_cell was changed",
        "the notebook's name 'all' is a function shadowing the built-in",
    ]


def test_the_request_sends_the_fingerprint_module_itself():
    shell = _Shell()
    code, expression = integrity.fingerprint_request()
    assert code == ""
    assert integrity.FINGERPRINT_SOURCE == open(fingerprint.__file__, encoding="utf-8").read()
    # The kernel evaluates the expression in its namespace: here, one with only get_ipython.
    answer = eval(expression, {"get_ipython": lambda: shell})
    reply = {"user_expressions": {"fp": {"status": "ok", "data": {"text/plain": repr(answer)}}}}
    assert integrity.parse_reply(reply) == _take(shell)
    assert integrity.parse_reply({"user_expressions": {"fp": {"status": "error"}}}) is None


def test_the_light_request_after_a_plain_cell_notes_the_same_modules_as_a_whole_one():
    """After a cell that is not a test the grader sends only the names part
    (integrity.names_request): it must note the same modules as differences() does from a
    whole fingerprint, so that a later stand-in for ``np`` is still reported."""
    import types

    shell = _Shell()
    shell.user_ns.update({"m": math, "fake": types.ModuleType("math"), "k": 3})
    answer = eval(integrity.names_request(), {"get_ipython": lambda: shell})
    reply = {"user_expressions": {"fp": {"status": "ok", "data": {"text/plain": repr(answer)}}}}
    light = integrity.parse_reply(reply)
    assert light == {"names": _take(shell)["names"]}
    before = _Shell()
    before.user_ns = {}  # the baseline: taken before the notebook's first cell
    by_light, by_whole = {}, {}
    assert integrity.note_modules(light, by_light)
    integrity.differences(_take(before), _take(shell), by_whole, set())
    assert by_light == by_whole == {"np": "math", "m": "math"}
    # no answer, or one that is not a fingerprint: the grader treats the kernel as silent
    assert not integrity.note_modules(None, {})
    assert not integrity.note_modules({"names": ["np"]}, {})
    # the stand-in is then reported at the next test, as before
    shell.user_ns["np"] = type("Stand", (), {})
    changes = integrity.differences(_take(before), _take(shell), by_light, set(), {"np"})
    assert "the name 'np' no longer refers to the module math" in changes
