import functools
import importlib
import inspect
import subprocess
import sys
import textwrap
import threading
import types

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


def test_the_given_route_trusts_only_the_references_the_test_gave():
    """Issue 53 (a red team found it): the function that runs a given reference is itself
    reachable; handing it a target instead of a given reference is refused."""
    namespace = {"distopt": distopt}  # as a notebook's answer cell, no target by name
    exec(  # noqa: S102
        "from distopt.grading import _given_call\n"
        "def through_the_given_route(num_params, world_size):\n"
        "    target = distopt.costs.memory.training_state_bytes\n"
        "    return _given_call(target, num_params, zero_stage=3, world_size=world_size) / 1e9\n",
        namespace,
    )
    for given in ({}, {"_earlier": _reference_earlier}):
        checked = own_work(namespace["through_the_given_route"], training_state_bytes, given=given)
        with pytest.raises(NotYourOwnWork, match="training_state_bytes"):
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


# --- a copy of a target's source, run under another name ----------------------------------


def _copy(target, new_name):
    """``target``'s source run under ``new_name`` in its module's globals, as a student can:
    ``exec(inspect.getsource(...))``. Its code has another name, file and line."""
    source = textwrap.dedent(inspect.getsource(target)).replace(
        f"def {target.__name__}(", f"def {new_name}("
    )
    found = {}
    exec(source, vars(sys.modules[target.__module__]), found)
    return found[new_name]


_SOURCE = inspect.getsource(training_state_bytes).replace("def training_state_bytes(", "def mine(")


def _copied_routes():
    """A copy held where the check before the call sees it, or made while the function runs."""
    copy = _copy(training_state_bytes, "state_bytes")
    assert copy(3) == training_state_bytes(3)  # the copy computes what the target does

    def by_default(n, _f=copy):
        return _f(n)

    namespace = {"state_bytes": copy}
    exec("def by_global(n):\n    return state_bytes(n)", namespace)
    box = {"f": [copy]}

    def by_container(n):
        return box["f"][0](n)

    def made_during_the_call(n):
        found = {}
        exec(_SOURCE, vars(distopt.costs.memory), found)  # the module's name is replaced now
        return found["mine"](n)

    return {
        "called_directly": copy,
        "by_default": by_default,
        "by_global": namespace["by_global"],
        "by_container": by_container,
        "made_during_the_call": made_during_the_call,
    }


COPIED = _copied_routes()


@pytest.mark.parametrize("route", sorted(COPIED))
def test_a_copy_of_the_target_under_another_name_is_caught(route):
    with pytest.raises(NotYourOwnWork, match="training_state_bytes"):
        own_work(COPIED[route], training_state_bytes)(3)  # before the call, or during it


def test_a_copy_nested_in_the_students_function_is_caught():
    """The target's source pasted, indented, as a function inside the student's: its
    docstring is indented deeper, its bytecode compiled in another unit."""
    nested = textwrap.indent(textwrap.dedent(_SOURCE), "    ")
    namespace = dict(vars(distopt.costs.memory))
    exec(f"def outer(n):\n{nested}\n    return mine(n) + 0", namespace)
    with pytest.raises(NotYourOwnWork, match="outer uses distopt.costs.memory"):
        own_work(namespace["outer"], training_state_bytes)(3)


class _Meter:
    """A stand-in for a package class an exercise re-creates, with one documented method."""

    def power(self, volts, amps):
        """Watts drawn at ``volts`` and ``amps``."""
        return volts * amps

    @staticmethod
    def forward(ctx, x):
        return x


def test_a_copy_of_a_method_of_a_target_class_is_caught():
    power = _copy(_Meter.power, "my_power")

    def reads(volts, amps):
        box = {"f": {"g": [[power]]}}  # too deep for the check before the call
        return box["f"]["g"][0][0](None, volts, amps)

    assert reads(2, 3) == 6
    with pytest.raises(NotYourOwnWork, match="_Meter"):
        own_work(reads, _Meter)(2, 3)


def test_own_code_equal_to_a_short_undocumented_method_passes():
    """A short computation has one natural spelling: section 03's students write
    ``CopyToTensorParallel.forward`` as ``return x``, as the package does. Only a body with
    a docstring, or a long one, is taken for a copy."""

    class Mine:
        @staticmethod
        def forward(ctx, x):
            return x

    assert Mine.forward.__code__.co_code == _Meter.forward.__code__.co_code
    assert own_work(lambda x: Mine.forward(None, x), _Meter)(5) == 5


def test_a_decorated_copy_is_caught_before_the_call():
    """``lamb_update_`` runs under ``@torch.no_grad()``: its copy does too."""
    from distopt.optim import optimizers

    copy = _copy(optimizers.lamb_update_, "my_lamb")

    def by_default(*args, _f=copy, **kwargs):
        return _f(*args, **kwargs)

    with pytest.raises(NotYourOwnWork, match="lamb_update_"):
        own_work(by_default, optimizers.lamb_update_)


def test_own_code_with_the_targets_name_docstring_and_names_passes():
    """Only a copy of the target's body is refused: a function with its name, docstring,
    constants and the names it looks up, but one more step of its own, is the student's."""
    source = inspect.getsource(training_state_bytes)
    assert source.count("    return sum(parts.values())\n") == 1
    namespace = dict(vars(distopt.costs.memory))
    exec(
        source.replace(
            "    return sum(parts.values())\n",
            "    total = sum(parts.values())\n    return total\n",
        ),
        namespace,
    )
    own = namespace["training_state_bytes"]
    assert own.__code__.co_names == training_state_bytes.__code__.co_names
    assert own.__code__.co_consts == training_state_bytes.__code__.co_consts
    assert own_work(own, training_state_bytes)(3) == 48


# --- C function targets -------------------------------------------------------------------


def test_a_builtin_target_is_caught_when_called_by_a_route_the_module_does_not_see():
    import math

    box = {"a": {"b": [[{"c": math.hypot}]]}}  # too deep for the check before the call

    def norm(x, y):
        return box["a"]["b"][0][0]["c"](x, y)

    assert own_work(norm, math.sqrt)(3, 4) == 5.0  # another builtin is the student's to use
    with pytest.raises(NotYourOwnWork, match="norm uses math.hypot"):
        own_work(norm, math.hypot)(3, 4)
    assert math.hypot(3, 4) == 5.0 and sys.getprofile() is None


def test_a_bound_builtin_without_a_module_is_caught_though_each_access_is_a_new_object():
    import random

    rng = random.Random(0)
    assert rng.random is not rng.random  # a fresh bound method per access, equal to the last

    def draws(n):
        return [rng.random() for _ in range(n)]

    with pytest.raises(NotYourOwnWork, match="built-in method random"):
        own_work(draws, rng.random)(2)  # __module__ None: no module to replace it in


def _tiny_adamw_arguments():
    import torch

    param, grad = torch.ones(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
    moments = [torch.zeros(3, dtype=torch.float64) for _ in range(2)]
    return ([param], [grad], moments[:1], moments[1:], [], [torch.tensor(1.0)]), {
        "lr": 0.01, "beta1": 0.9, "beta2": 0.95, "weight_decay": 0.1, "eps": 1e-8,
        "amsgrad": False, "maximize": False,
    }  # fmt: skip


def _fused_in_a_helper(params):
    """A helper of the student's, in another function, that reaches torch's fused AdamW
    kernel without the name ``torch._fused_adamw_``."""
    import torch

    args, kwargs = _tiny_adamw_arguments()
    torch._C._VariableFunctions._fused_adamw_(*args, **kwargs)
    return args[0][0]


def _calls_a_helper(x):
    return _fused_in_a_helper(x)


def _by_operator(x):
    import torch

    args, kwargs = _tiny_adamw_arguments()
    torch.ops.aten._fused_adamw_.default(*args, **kwargs)  # __module__ torch._ops.aten: none
    return args[0][0]


def test_torch_fused_optimizer_ops_lists_the_kernels():
    import torch

    from distopt.grading import torch_fused_optimizer_ops

    ops = torch_fused_optimizer_ops()
    assert {torch._fused_adam_, torch._fused_adamw_, torch._fused_sgd_} <= set(ops)
    assert torch.ops.aten._fused_adamw_.default in ops
    args, kwargs = _tiny_adamw_arguments()
    torch._fused_adamw_(*args, **kwargs)  # the call signature the routes below use
    assert args[0][0][0].item() == pytest.approx(1 - 0.01 * 0.1 - 0.01)


@pytest.mark.parametrize("route", [_calls_a_helper, _by_operator], ids=lambda f: f.__name__)
def test_torch_fused_kernels_are_caught_by_any_route(route):
    import torch

    from distopt.grading import torch_fused_optimizer_ops

    ops = torch_fused_optimizer_ops()
    fused_adamw = torch._fused_adamw_
    with pytest.raises(NotYourOwnWork, match=r"uses torch\..*_fused_adamw_"):
        own_work(route, *ops)(None)
    assert torch._fused_adamw_ is fused_adamw and sys.getprofile() is None


def test_own_torch_arithmetic_passes_the_fused_kernels_check():
    import torch

    from distopt.grading import torch_fused_optimizer_ops

    def own_arithmetic(x):
        return torch.ones(3).mul_(0.5).sqrt()

    assert own_work(own_arithmetic, *torch_fused_optimizer_ops())(None).shape == (3,)


def test_the_grading_module_imports_no_torch():
    """Sections without torch import distopt.grading too."""
    code = "import sys, distopt.grading; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_class_target_is_not_matched_by_its_methods_shared_decorator():
    """torch.optim.Optimizer's methods are wrapped by torch's ``_disable_dynamo``, whose
    ``inner`` code every function it decorates shares (some of torch's own, which
    ``torch.manual_seed`` calls in a fresh process): the watch keys each method's own code,
    so other decorated functions still run."""
    import torch

    @torch._disable_dynamo  # the wrapper of Optimizer's methods, around the student's own
    def own_adam_step(x):
        return x * 2

    assert own_work(own_adam_step, torch.optim.Optimizer)(3) == 6

    def uses_torch_adam(x):
        return torch.optim.Adam([torch.zeros(1, requires_grad=True)], lr=0.1)

    with pytest.raises(NotYourOwnWork, match="Optimizer"):
        own_work(uses_torch_adam, torch.optim.Optimizer)(3)


# --- whole modules, private torch routes, copies made with CodeType.replace -------------------


def _diagnose_module():
    import distopt.project.diagnose as module

    return module


def test_a_module_target_refuses_each_of_its_functions_private_ones_included():
    """07's diagnose assembled from the module's private helpers is refused; an answer of
    its own, which reads a constant of the module, passes."""
    module = _diagnose_module()
    history = module.synthetic_history("loss_spikes", steps=300, seed=0)

    def from_private_helpers(history):
        import numpy as np

        return "loss_spikes" if module._has_spike(np.asarray(history["loss"])) else "healthy"

    with pytest.raises(NotYourOwnWork, match=r"distopt\.project\.diagnose\._has_spike"):
        own_work(from_private_helpers, module)(history)

    def own_answer(history):
        return "healthy" if set(module.REQUIRED_KEYS) <= set(history) else "?"

    assert own_work(own_answer, module)(history) == "healthy"


def test_a_torch_optimizer_target_refuses_its_private_routes():
    import torch

    def by_single_tensor_route(p):
        from torch.optim import adam

        state = [torch.zeros(3)], [torch.zeros(3)], [], [torch.tensor(1.0)]
        adam._single_tensor_adam(
            [p], [torch.ones(3)], *state, foreach=False, grad_scale=None, found_inf=None,
            amsgrad=False, has_complex=False, beta1=0.9, beta2=0.999, lr=0.1,
            weight_decay=0.0, eps=1e-8, maximize=False, capturable=False, differentiable=False,
        )  # fmt: skip
        return p

    for target in (torch.optim.Adam, importlib.import_module("torch.optim.adam").adam):
        with pytest.raises(NotYourOwnWork, match="_single_tensor_adam"):
            own_work(by_single_tensor_route, target)(torch.zeros(3))

    def own_arithmetic(p):
        return p - 0.1 * torch.ones(3)

    assert own_work(own_arithmetic, torch.optim.Adam)(torch.zeros(3)).tolist() == pytest.approx(
        [-0.1] * 3
    )


def _replaced(target, **changes):
    """A function running ``target``'s code under another name, line and docstring, as
    ``CodeType.replace`` makes it (``changes`` change more, the file for one)."""
    code = target.__code__
    consts = (None, *code.co_consts[1:]) if isinstance(code.co_consts[0], str) else code.co_consts
    copy = code.replace(
        co_name="mine", co_qualname="mine", co_firstlineno=7, co_consts=consts, **changes
    )
    return type(target)(copy, target.__globals__, "mine")


def test_a_copy_made_by_code_replace_is_caught_by_its_file_or_its_body():
    module = _diagnose_module()
    history = module.synthetic_history("divergence", steps=300, seed=0)
    same_file = _replaced(module.diagnose)
    other_file = _replaced(module.diagnose, co_filename="/home/student/mine.py")
    assert same_file(history) == other_file(history) == "divergence"  # working copies
    for copy in (same_file, other_file):
        with pytest.raises(NotYourOwnWork, match="diagnose"):  # held: seen before the call
            own_work(copy, module.diagnose)(history)

        def made_during_the_call(history, _code=copy.__code__):
            return types.FunctionType(_code, module.__dict__)(history)

        with pytest.raises(NotYourOwnWork, match="diagnose"):  # made inside: seen as it runs
            own_work(made_during_the_call, module.diagnose)(history)


def test_a_code_object_claiming_a_package_file_it_is_not_of_is_a_copy():
    """A short function of a target's module given another name keeps the module's file:
    the file's own code objects do not hold it, so it is a copy, body too short or not."""
    module = _diagnose_module()
    short = _replaced(module._tenth)
    assert short(100) == module._tenth(100)

    def uses_it(n):
        return short(n)

    with pytest.raises(NotYourOwnWork, match="_tenth"):
        own_work(uses_it, module)(100)
    # The module's own code, reloaded from its file, is the module's, not a forged copy.
    from distopt.grading import _forged

    assert not _forged(module._tenth.__code__) and _forged(short.__code__)


def test_a_package_targets_private_helpers_are_refused_with_it():
    """06's minibatch helper: run_federated's private _minibatch is part of run_federated."""
    import numpy as np

    from distopt.sim import federated

    def draws_with_the_helper(n):
        return federated._minibatch(np.random.default_rng(0), n, 4)

    with pytest.raises(NotYourOwnWork, match=r"distopt\.sim\.federated\._minibatch"):
        own_work(draws_with_the_helper, federated.run_federated)(10)

    def draws_its_own(n):
        return np.random.default_rng(0).integers(0, n, 4)

    assert len(own_work(draws_its_own, federated.run_federated)(10)) == 4
