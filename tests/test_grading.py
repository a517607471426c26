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
