"""Similar answers: planted copies are flagged, honest answers are not.

Honest: the reference answer and every catalogued wrong answer of every section (the class
run's students are made of these), and two independent rewrites of section 02's ZeRO-1
exercise. Planted: that rewrite renamed, reordered, reformatted and commented; and the
package's own ZeRO traffic function pasted as an answer.

Messages: rank code run by the launcher with the recorder's log on, as the grader runs it.
Planted: two students whose code differs but sends the same odd messages. Honest: two who
pass with the reference's (ZeRO's reduce-scatter and all-gather: in a class this small, only
their passing tells it from a copy), one stopped early by a failed check, one with an odd
pattern of its own. (The class run, tests/grader/test_autograder.py,
checks that the grader's logs of its honest students raise no flag.)
"""

from __future__ import annotations

import os
import time

import nbformat
import pytest
import torch
import torch.distributed as dist

from autograder import course, similarity
from distopt import launch
from distopt.engine import record
from tests.grader import mutants

SECTION, NOTEBOOK = "02_memory_sharding", "memory_sharding"

# A student's own ZeRO-1 (not the reference's structure: a helper, chunks, an explicit loop).
OWN = """\
def zero1_adam(rank, world_size, problem):
    def as_vector(tensors):
        return torch.cat([t.reshape(-1) for t in tensors])

    net = problem.new_model(rank)
    weights = list(net.parameters())
    for w in weights:
        dist.broadcast(w.data, 0)
    total = sum(w.numel() for w in weights)
    per_rank = (total + world_size - 1) // world_size
    pad = per_rank * world_size - total
    first = torch.zeros(per_rank, dtype=torch.float64)
    second = torch.zeros(per_rank, dtype=torch.float64)
    for t in range(problem.steps):
        inputs, targets = problem.batch(t, rank)
        net.zero_grad()
        loss = problem.loss_sum(net, inputs, targets) / problem.global_batch
        loss.backward()
        g = torch.nn.functional.pad(as_vector([w.grad for w in weights]), (0, pad))
        mine = torch.zeros(per_rank, dtype=torch.float64)
        dist.reduce_scatter_tensor(mine, g)
        first = 0.9 * first + 0.1 * mine
        second = 0.999 * second + 0.001 * mine * mine
        m_hat = first / (1 - 0.9 ** (t + 1))
        corrected = m_hat / ((second / (1 - 0.999 ** (t + 1))).sqrt() + 1e-8)
        flat = torch.nn.functional.pad(as_vector(weights).detach(), (0, pad))
        updated = flat.chunk(world_size)[rank] - problem.adam_lr * corrected
        dist.all_gather_into_tensor(flat, updated.contiguous())
        with torch.no_grad():
            offset = 0
            for w in weights:
                w.copy_(flat[offset:offset + w.numel()].view_as(w))
                offset += w.numel()
    return [w.detach() for w in weights], [first, second]
"""

# The same, as a copier disguises it: names changed, comments added, statements that do not
# depend on each other swapped, spacing and line breaks changed.
DISGUISED = """\
def zero1_adam(rank, world_size, problem):
    # ZeRO stage 1, my own work
    def vec(ts):
        return torch.cat([x.reshape(-1) for x in ts])

    model = problem.new_model(rank)
    ps = list(model.parameters())
    for p in ps:
        dist.broadcast(p.data, 0)
    n = sum(p.numel() for p in ps)
    chunk = (n + world_size - 1) // world_size
    extra = chunk * world_size - n
    v_ = torch.zeros(chunk, dtype=torch.float64)   # second moment
    m_ = torch.zeros(chunk, dtype=torch.float64)   # first moment
    for it in range(problem.steps):
        xb, yb = problem.batch(it, rank)
        model.zero_grad()
        l = problem.loss_sum(model, xb, yb) / problem.global_batch
        l.backward()
        gr = torch.nn.functional.pad(vec([p.grad for p in ps]),
                                     (0, extra))
        part = torch.zeros(chunk, dtype=torch.float64)
        dist.reduce_scatter_tensor(part, gr)
        m_ = 0.9 * m_ + 0.1 * part
        v_ = 0.999 * v_ + 0.001 * part * part
        mh = m_ / (1 - 0.9 ** (it + 1))
        step = mh / ((v_ / (1 - 0.999 ** (it + 1))).sqrt() + 1e-8)
        fl = torch.nn.functional.pad(vec(ps).detach(), (0, extra))
        new = fl.chunk(world_size)[rank] - problem.adam_lr * step
        dist.all_gather_into_tensor(fl, new.contiguous())
        with torch.no_grad():
            at = 0
            for p in ps:
                p.copy_(fl[at:at + p.numel()].view_as(p))
                at += p.numel()
    return [p.detach() for p in ps], [m_, v_]
"""

# Another student's own, written independently: state in a dict, moments updated in place.
OTHER = """\
def zero1_adam(rank, world_size, problem):
    model = problem.new_model(rank)
    params = list(model.parameters())
    [dist.broadcast(p.data, src=0) for p in params]
    sizes = [p.numel() for p in params]
    P = sum(sizes)
    S = -(-P // world_size)
    state = {"m": torch.zeros(S, dtype=torch.float64), "v": torch.zeros(S, dtype=torch.float64)}
    lo, hi = rank * S, min((rank + 1) * S, P)
    for k in range(1, problem.steps + 1):
        model.zero_grad()
        x, y = problem.batch(k - 1, rank)
        problem.loss_sum(model, x, y).div(problem.global_batch).backward()
        full = torch.zeros(world_size * S, dtype=torch.float64)
        full[:P] = torch.cat([p.grad.flatten() for p in params])
        g = torch.empty(S, dtype=torch.float64)
        dist.reduce_scatter_tensor(g, full)
        state["m"].lerp_(g, 0.1)
        state["v"].mul_(0.999).add_(0.001 * g.square())
        mhat = state["m"] / (1 - 0.9**k)
        vhat = state["v"] / (1 - 0.999**k)
        w = torch.zeros(world_size * S, dtype=torch.float64)
        w[:P] = torch.cat([p.detach().flatten() for p in params])
        w_mine = w[lo:lo + S] - problem.adam_lr * mhat / (vhat.sqrt() + 1e-8)
        dist.all_gather_into_tensor(w, w_mine)
        with torch.no_grad():
            for p, piece in zip(params, w[:P].split(sizes)):
                p.copy_(piece.view_as(p))
    return [p.detach() for p in params], [state["m"], state["v"]]
"""


def _section_inputs(section: str, notebook: str):
    reference = similarity._cells(course.SOLUTIONS / section / f"{notebook}.ipynb", "reference")
    stubs = similarity._cells(course.NOTEBOOKS / section / f"{notebook}.ipynb", "stub")
    return reference, stubs


@pytest.mark.parametrize(("section", "notebook"), mutants.sections())
def test_the_reference_and_the_catalogued_wrong_answers_raise_no_flag(section, notebook):
    reference, stubs = _section_inputs(section, notebook)
    answers = {"reference": dict(reference)}
    for i, variant in enumerate(mutants.variants(notebook)):
        answers[f"variant-{i}"] = {variant.answer: variant.apply(reference[variant.answer])}
    flags = similarity.flags_of(section, answers, reference, stubs, similarity.package_functions())
    assert flags == [], [(f.answer, f.first, f.second, f.similarity) for f in flags]


def test_a_disguised_copy_is_flagged_and_an_independent_answer_is_not():
    reference, stubs = _section_inputs(SECTION, NOTEBOOK)
    answers = {s: {"zero1_adam": code} for s, code in (("ann", OWN), ("ben", DISGUISED))}
    answers["cat"] = {"zero1_adam": OTHER}
    answers["dan"] = {"zero1_adam": reference["zero1_adam"]}
    flags = similarity.flags_of(SECTION, answers, reference, stubs, {})
    assert [(f.first, f.second) for f in flags] == [("ann", "ben")], flags
    assert flags[0].similarity >= 0.9 and flags[0].overlap >= similarity.MIN_OVERLAP
    lines = similarity.markdown(flags)
    assert "| 02_memory_sharding | zero1_adam | ann | ben |" in "\n".join(lines)
    assert any("<td><pre>" in line and "ZeRO stage 1, my own work" in line for line in lines)


def test_a_copy_of_the_package_source_is_flagged_with_the_function_it_copies():
    reference, stubs = _section_inputs(SECTION, NOTEBOOK)
    package = similarity.package_functions()
    name = "distopt.costs.comm.sharded_step_traffic"
    pasted = package[name].replace("def sharded_step_traffic(", "def bytes_sent_per_step(")
    answers = {"eve": {"bytes_sent_per_step": pasted}, "fay": {"bytes_sent_per_step": OTHER}}
    flags = similarity.flags_of(SECTION, answers, reference, stubs, package)
    assert [(f.first, f.second) for f in flags] == [("eve", f"distopt: {name}")], flags


def test_answers_are_read_from_a_notebook_whose_metadata_was_stripped(tmp_path):
    released = nbformat.read(course.NOTEBOOKS / SECTION / f"{NOTEBOOK}.ipynb", as_version=4)
    nb = nbformat.read(course.NOTEBOOKS / SECTION / f"{NOTEBOOK}.ipynb", as_version=4)
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "zero1_adam":
            cell.source = OWN
        cell.metadata.pop("nbgrader", None)
    nbformat.write(nb, tmp_path / "x.ipynb")
    assert similarity.answers_of(tmp_path / "x.ipynb", released)["zero1_adam"] == OWN


# --- messages -------------------------------------------------------------------------------


def _reference(g, rounds):
    """ZeRO's traffic: reduce-scatter the gradient, all-gather the weights."""
    part = torch.empty(g.numel() // dist.get_world_size(), dtype=g.dtype)
    for _ in range(rounds):
        dist.reduce_scatter_tensor(part, g)
        dist.all_gather_into_tensor(g, part)


def _odd(g, rounds):
    """One student's own idea: all-reduce the halves one by one, then broadcast a scalar."""
    for _ in range(rounds):
        for half in g.chunk(2):
            dist.all_reduce(half)
        dist.broadcast(g[:1], 0)


def _odd_copied(g, rounds):
    """The same messages from code that looks different."""
    k = 0
    while k < rounds:
        first, second = g[: g.numel() // 2], g[g.numel() // 2 :]
        dist.all_reduce(first)
        dist.all_reduce(second)
        head = g.narrow(0, 0, 1)
        dist.broadcast(head, src=0)
        k += 1


def _odd_alone(g, rounds):
    """Another student's odd pattern: all-reduce everything, twice."""
    for _ in range(rounds):
        dist.all_reduce(g)
        dist.all_reduce(g)


CLASS = {  # student -> (rank code, rounds)
    "ann": (_odd, 4),
    "ben": (_odd_copied, 4),
    "cat": (_reference, 4),
    "dan": (_reference, 4),
    "fay": (_reference, 2),  # stopped early: part of the reference's messages
    "gus": (_odd_alone, 4),
}
PASSED = ("cat", "dan")  # the others failed the test


def _class_messages(rank, world_size, logs):
    """Each student's rank code in turn, logged to that student's file as the grader logs."""
    for student, (code, rounds) in CLASS.items():
        os.environ[record.LOG_ENV] = logs[student]
        with record.communication():
            code(torch.arange(8, dtype=torch.float32) * (rank + 1), rounds)
    return True


def test_a_rare_message_pattern_two_students_share_is_flagged_and_common_ones_are_not(tmp_path):
    logs = {s: str(tmp_path / f"{s}.messages.jsonl") for s in CLASS}
    began = time.time()
    assert launch(_class_messages, 2, logs, timeout=60) == [True, True]
    ended = time.time()
    patterns, passed = {}, {}
    failed = [nbformat.v4.new_output("error", ename="AssertionError", evalue="", traceback=[])]
    for student, log in logs.items():
        cell = nbformat.v4.new_code_cell(metadata={"nbgrader": {"grade_id": "test_exchange"}})
        cell.outputs = [] if student in PASSED else failed
        times = tmp_path / f"{student}.test-times.jsonl"
        similarity.note_test_cell(times, cell, began, ended)
        patterns[student] = similarity.message_patterns(tmp_path / log, times)
        passed[student] = similarity.passed_tests(times)
    # every student's messages are found, rank by rank, as the recorder logged them
    assert {s: len(p["test_exchange"]) for s, p in patterns.items()} == dict.fromkeys(CLASS, 2)
    assert [s for s in CLASS if passed[s]] == list(PASSED)
    answers = {"ann": {"exchange": "ann's code"}, "ben": {"exchange": "ben's code"}}
    flags = similarity.message_flags("00_test", patterns, answers, passed)
    assert [(f.first, f.second, f.made_by, f.apart) for f in flags] == [("ann", "ben", 2, 0)]
    text = "\n".join(similarity.markdown(flags))
    assert "| 00_test | test_exchange | ann | ben | 2 | 0 |" in text
    # side by side: both patterns (all_reduce of 16 B halves, broadcast of 4 B) and the answers
    assert text.count("N=2 rank 0: all_reduce 16 B (x 2)") == 2 * 4, text
    assert "N=2 rank 1: broadcast 4 B peer 0" in text and "ben&#x27;s code" in text
    # without knowing who passed, the two who send the reference's messages look rare too
    unknown = similarity.message_flags("00_test", patterns)
    assert [(f.first, f.second) for f in unknown] == [("ann", "ben"), ("cat", "dan")]
    # logged outside the test's time: not that test's
    elsewhere = tmp_path / "elsewhere.test-times.jsonl"
    similarity.note_test_cell(elsewhere, cell, ended + 1, ended + 2)
    assert similarity.message_patterns(tmp_path / logs["ann"], elsewhere) == {}


# A student's own 14-line answer (a search, not the reference's formula), and the same with
# every name changed: what the floor MIN_OVERLAP is measured against.
SHORT_OWN = """\
def min_gpus_to_fit(num_params, zero_stage, device_bytes, *,
                    weight_bytes=2, grad_bytes=2, optimizer_bytes=12):
    kw = dict(weight_bytes=weight_bytes, grad_bytes=grad_bytes, optimizer_bytes=optimizer_bytes)
    previous = None
    n = 1
    while n < max(1_000_000, num_params // 1000):
        need = state_bytes_per_gpu(num_params, zero_stage, n, **kw)
        if need <= device_bytes:
            return n
        if previous is not None and need >= previous or need - device_bytes > 64 * device_bytes:
            return None
        previous = need
        n = n + 1 if need < 2 * device_bytes else max(n + 1, int(n * need / device_bytes) // 2)
    return None
"""
SHORT_RENAMED = (
    SHORT_OWN.replace("kw", "widths")
    .replace("previous", "before")
    .replace("need", "per_gpu")
    .replace(" n ", " gpus ")
    .replace("(n ", "(gpus ")
    .replace(" n:", " gpus:")
    .replace(", n,", ", gpus,")
    .replace("return n\n", "return gpus\n")
    .replace("int(n ", "int(gpus ")
    .replace("    n = ", "    gpus = ")
)


def test_a_short_renamed_copy_is_flagged_below_the_old_floor_of_200():
    assert SHORT_OWN.count("\n") == 14 and " n " not in SHORT_RENAMED, SHORT_RENAMED
    reference, stubs = _section_inputs(SECTION, NOTEBOOK)
    answers = {"gil": {"min_gpus_to_fit": SHORT_OWN}, "hal": {"min_gpus_to_fit": SHORT_RENAMED}}
    answers["ida"] = {"min_gpus_to_fit": reference["min_gpus_to_fit"]}
    flags = similarity.flags_of(SECTION, answers, reference, stubs, {})
    assert [(f.first, f.second) for f in flags] == [("gil", "hal")], flags
    assert similarity.MIN_OVERLAP <= flags[0].overlap < 200, flags[0].overlap


def test_similar_answers_are_read_from_the_file_the_grader_graded(tmp_path, monkeypatch):
    """A student who worked in a copy beside the blank notebook, and one who renamed it: both
    compared on the file graded, not on the name the notebook was released under."""
    monkeypatch.setattr(course, "SUBMITTED", tmp_path / "submitted")
    monkeypatch.setattr(course, "AUTOGRADED", tmp_path / "autograded")
    released = course.NOTEBOOKS / SECTION / f"{NOTEBOOK}.ipynb"
    for student, code, name in (("gil", SHORT_OWN, "mine.ipynb"), ("hal", SHORT_RENAMED, None)):
        folder = tmp_path / "submitted" / student / SECTION
        folder.mkdir(parents=True)
        nb = nbformat.read(released, as_version=4)
        cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id")
                    == "min_gpus_to_fit")  # fmt: skip
        cell.source = code
        if name is None:  # hal: the blank notebook, the answers in a copy beside it
            (folder / f"{NOTEBOOK}.ipynb").write_bytes(released.read_bytes())
            nbformat.write(nb, folder / f"{NOTEBOOK}-Copy1.ipynb")
        else:  # gil: renamed
            nbformat.write(nb, folder / name)
    flags = similarity.class_flags([("gil", SECTION), ("hal", SECTION)])
    assert [(f.first, f.second, f.answer) for f in flags if isinstance(f, similarity.Flag)] == [
        ("gil", "hal", "min_gpus_to_fit")
    ], flags
