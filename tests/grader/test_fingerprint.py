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
