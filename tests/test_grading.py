import functools
import sys
import threading

import pytest

import distopt.costs.memory
from distopt.costs.memory import training_state_bytes
from distopt.grading import NotYourOwnWork, own_work


def honest(n):
    return n * 16


def delegates_by_import(n):
    return training_state_bytes(n)


# Defined in a namespace of its own: this module's global `training_state_bytes` would
# otherwise be found by name before the call is made.
_namespace = {"distopt": distopt}
exec(
    "def delegates_by_module(n):\n    return distopt.costs.memory.training_state_bytes(n)",
    _namespace,
)
delegates_by_module = _namespace["delegates_by_module"]


def test_own_code_passes_through():
    assert own_work(honest, training_state_bytes)(3) == 48


def test_imported_package_function_is_caught_before_the_call():
    with pytest.raises(NotYourOwnWork, match="training_state_bytes"):
        own_work(delegates_by_import, training_state_bytes)


def test_call_through_the_module_is_caught_and_module_restored():
    checked = own_work(delegates_by_module, training_state_bytes)
    with pytest.raises(NotYourOwnWork, match="Write the computation yourself"):
        checked(3)
    assert distopt.costs.memory.training_state_bytes is training_state_bytes


# Every other way a student might hold the package's function: each must be caught while
# the student's function runs (the names are built inside, so the check before the call
# sees nothing).
def _routes():
    import functools
    import importlib.util
    import threading
    import types

    target = distopt.costs.memory.training_state_bytes
    spec = importlib.util.spec_from_file_location("memory_copy", distopt.costs.memory.__file__)
    copy = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = copy  # dataclasses look their module up while it loads
    try:
        spec.loader.exec_module(copy)
    finally:
        del sys.modules[spec.name]

    def by_default(n, _f=target):
        return _f(n)

    def by_keyword_default(n, *, _f=target):
        return _f(n)

    held = functools.partial(target)

    def by_partial(n):
        return held(n)

    box = {"f": target, "list": [target]}

    def by_container(n):
        return box["list"][0](n) + box["f"](n) - box["f"](n)

    def by_module_copy(n):
        return vars(copy)["training_state_bytes"](n)  # a name the check before sees not

    class Holder:
        pass

    bound = types.MethodType(lambda self, n: target(n), Holder())

    def by_bound_method(n):
        return bound(n)

    class Caller:
        __call__ = staticmethod(target)

    def by_class(n):
        return Caller()(n)

    def by_thread(n):
        out = []
        thread = threading.Thread(target=lambda: out.append(box["f"](n)))
        thread.start()
        thread.join()
        return out[0] if out else 0

    def caught_then_retried(n):
        try:
            return box["f"](n)
        except Exception:
            return box["f"](n)

    def switches_profiling_off(n):
        import sys

        sys.setprofile(None)
        return box["f"](n)

    return {
        f.__name__: f
        for f in (
            by_default,
            by_keyword_default,
            by_partial,
            by_container,
            by_module_copy,
            by_bound_method,
            by_class,
            by_thread,
            caught_then_retried,
            switches_profiling_off,
        )
    }


ROUTES = _routes()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
@pytest.mark.parametrize("route", sorted(ROUTES))
def test_every_route_to_the_package_function_is_caught(route):
    with pytest.raises(NotYourOwnWork, match="training_state_bytes|profiling"):
        own_work(ROUTES[route], training_state_bytes)(3)  # before the call, or during it
    assert distopt.costs.memory.training_state_bytes is training_state_bytes
    assert sys.getprofile() is None and threading.getprofile() is None


def test_a_reference_too_deep_to_see_before_is_caught_when_it_runs():
    box = {"a": {"b": [[{"c": training_state_bytes}]]}}

    def buried(n):
        return box["a"]["b"][0][0]["c"](n)

    checked = own_work(buried, training_state_bytes)  # nothing seen before the call
    with pytest.raises(NotYourOwnWork, match="buried uses distopt.costs.memory"):
        checked(3)


def test_a_class_target_is_caught_in_any_of_its_methods():
    from distopt.optim import optimizers

    def builds_lamb(params):
        return type(optimizers).__getattribute__(optimizers, "LAMB")(params, lr=0.1)

    import torch

    with pytest.raises(NotYourOwnWork, match="LAMB"):
        own_work(builds_lamb, optimizers.LAMB)([torch.nn.Parameter(torch.ones(2))])


def test_other_package_functions_and_own_threads_still_work():
    def honest_with_helpers(n):
        out = []
        thread = threading.Thread(target=lambda: out.append(distopt.costs.memory.__name__))
        thread.start()
        thread.join()
        return honest(n) + len(out)

    assert own_work(honest_with_helpers, training_state_bytes)(3) == 49
    assert sys.getprofile() is None


def _c_routes():
    """References to a target without Python code (np.dot): only the check before the call
    can see them, in defaults, containers, partials and classes."""
    import functools

    import numpy as np

    def by_default(a, b, _f=np.dot):
        return _f(a, b)

    def by_keyword_default(a, b, *, _f=np.dot):
        return _f(a, b)

    held = {"f": functools.partial(np.dot)}

    def by_partial_in_a_dict(a, b):
        return held["f"](a, b)

    class Caller:
        dot = staticmethod(np.dot)

    def by_class(a, b):
        return Caller.dot(a, b)

    return [by_default, by_keyword_default, by_partial_in_a_dict, by_class]


@pytest.mark.parametrize("route", _c_routes(), ids=lambda f: f.__name__)
def test_references_to_a_builtin_target_are_caught_before_the_call(route):
    import numpy as np

    with pytest.raises(NotYourOwnWork, match="dot"):
        own_work(route, np.dot)


# --- given: an earlier answer handed to a dependent exercise's test ----------------------


def _earlier(num_params, stage, world_size):
    """A student's earlier answer, with a bug: ZeRO never shards anything."""
    return 16.0 * num_params


def _later(num_params, world_size):
    """A dependent answer that builds on the earlier one, as a student writes it."""
    return _earlier(num_params, 3, world_size) / 1e9


def _reference_earlier(num_params, stage, world_size):
    return training_state_bytes(num_params, zero_stage=stage, world_size=world_size)


def test_given_replaces_the_earlier_answer_so_its_bug_does_not_cascade():
    assert _later(70e9, 64) == 1120.0  # the bug, when the later answer is called as written
    checked = own_work(_later, training_state_bytes, given={"_earlier": _reference_earlier})
    assert checked(70e9, 64) == pytest.approx(17.5)
    assert _later(70e9, 64) == 1120.0  # the student's own namespace is untouched


def test_given_allows_the_targets_only_inside_the_given_reference():
    def later_cheats(num_params, world_size):
        return distopt.costs.memory.training_state_bytes(num_params, zero_stage=3,
                                                         world_size=world_size) / 1e9  # fmt: skip

    with pytest.raises(NotYourOwnWork, match="training_state_bytes"):
        checked = own_work(
            later_cheats, training_state_bytes, given={"_earlier": _reference_earlier}
        )
        checked(70e9, 64)


def test_given_needs_a_python_function():
    with pytest.raises(TypeError, match="given= needs a Python function"):
        own_work(len, given={"x": abs})


def test_an_earlier_answer_held_as_a_package_shortcut_does_not_cascade():
    """The earlier answer is replaced by given=, so how the student wrote it does not matter."""
    namespace = {"_earlier": functools.partial(training_state_bytes)}
    exec("def later(n, world_size):\n    return _earlier(n, 3, world_size) / 1e9", namespace)
    checked = own_work(
        namespace["later"], training_state_bytes, given={"_earlier": _reference_earlier}
    )
    assert checked(70e9, 64) == pytest.approx(17.5)
