"""The backend and device a launch picks (distopt.engine.device): gloo on CPUs, NCCL with one
GPU per rank, and the errors that say why NCCL cannot run. The GPUs are pretended
(``visible=``); a launch on this machine checks that nothing changes without CUDA."""

from __future__ import annotations

import collections

import pytest
import torch

import distopt
from distopt.engine import device


@pytest.fixture(autouse=True)
def _no_backend_in_the_environment(monkeypatch):
    monkeypatch.delenv(device.ENV, raising=False)


def gpus(count: int, nccl: bool = True):
    return lambda: (count, nccl)


def test_the_default_is_gloo_even_with_gpus_until_a_gpu_run_has_passed():
    placement = device.choose(2, visible=gpus(8))
    assert device.DEFAULT == "gloo" and placement.backend == "gloo"
    assert "DISTOPT_BACKEND=auto" in placement.why


def test_no_cuda_means_gloo_on_cpu():
    placement = device.choose(4, "auto", visible=gpus(0, False))
    assert (placement.backend, placement.device_type) == ("gloo", "cpu")
    assert [placement.device(r) for r in range(4)] == ["cpu"] * 4
    assert "no CUDA device" in placement.why


def test_a_gpu_for_every_rank_means_nccl_rank_r_on_cuda_r():
    placement = device.choose(4, "auto", visible=gpus(8))
    assert (placement.backend, placement.device_type) == ("nccl", "cuda")
    assert [placement.device(r) for r in range(4)] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]


def test_more_ranks_than_gpus_falls_back_to_gloo_and_says_why():
    placement = device.choose(3, "auto", visible=gpus(1))
    assert placement.backend == "gloo" and placement.device(2) == "cpu"
    assert "3 ranks but 1 GPU" in placement.why and "refuses two ranks on one GPU" in placement.why


def test_torch_without_nccl_falls_back_to_gloo():
    placement = device.choose(2, "auto", visible=gpus(2, nccl=False))
    assert placement.backend == "gloo" and "no NCCL" in placement.why


def test_gloo_asked_for_never_looks_at_the_gpus():
    def fail():
        raise AssertionError("gloo must not query CUDA")

    assert device.choose(2, "gloo", visible=fail).backend == "gloo"


@pytest.mark.parametrize(
    "visible, says",
    [
        (gpus(0, False), "no CUDA device"),
        (gpus(1), "2 ranks but 1 GPU"),
        (gpus(4, False), "no NCCL"),
    ],
)
def test_nccl_asked_for_where_it_cannot_run_is_an_error_that_says_what_to_do(visible, says):
    with pytest.raises(ValueError, match="cannot run here") as caught:
        device.choose(2, "nccl", visible=visible)
    assert says in str(caught.value) and "backend='gloo'" in str(caught.value)


def test_the_environment_chooses_when_the_call_does_not(monkeypatch):
    monkeypatch.setenv(device.ENV, "NCCL ")
    assert device.choose(2, visible=gpus(2)).backend == "nccl"
    monkeypatch.setenv(device.ENV, "auto")
    assert device.choose(2, visible=gpus(2)).backend == "nccl"
    assert device.choose(2, "gloo", visible=gpus(2)).backend == "gloo"  # the call wins
    monkeypatch.setenv(device.ENV, "mpi")
    with pytest.raises(ValueError, match=r"\$DISTOPT_BACKEND='mpi' is not a backend"):
        device.choose(2, visible=gpus(2))


def test_an_unknown_backend_is_refused_before_any_process_starts():
    with pytest.raises(ValueError, match="'ucc' is not a backend; use one of auto, gloo, nccl"):
        distopt.launch(lambda rank, world_size: rank, 2, backend="ucc")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_on_this_cpu_machine_nccl_is_refused_and_auto_is_gloo(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="no CUDA device is visible"):
        distopt.launch(lambda rank, world_size: rank, 2, backend="nccl")
    log = tmp_path / "backends.txt"
    monkeypatch.setenv(device.LOG_ENV, str(log))
    where = distopt.launch(_where, 2, timeout=60, backend="auto")
    assert where == [("gloo", "cpu", "cpu"), ("gloo", "cpu", "cpu")]
    assert distopt.launch(_where, 1, timeout=60) == [("gloo", "cpu", "cpu")]  # the default
    assert log.read_text().splitlines() == [
        "2 gloo gloo on CPUs: no CUDA device is visible",
        "1 gloo gloo, the default (set DISTOPT_BACKEND=auto for NCCL where there is a GPU per "
        "rank): CPU tensors",
    ]


def _where(rank: int, world_size: int) -> tuple[str, str, str]:
    import torch.distributed as dist

    return dist.get_backend(), str(device.current()), str(torch.zeros(1).device)


def test_to_cpu_and_put_keep_containers_and_values():
    value = {"a": [torch.ones(2), (torch.zeros(1), 3)], "b": "text"}
    moved = device.to_cpu(value)
    assert moved["b"] == "text" and moved["a"][1][1] == 3
    assert torch.equal(moved["a"][0], torch.ones(2)) and isinstance(moved["a"][1], tuple)
    assert device.put(torch.ones(1)).device == torch.device("cpu")  # outside a launch: CPU
    counts = device.to_cpu(collections.defaultdict(list, {"a": [torch.ones(1)]}))
    assert isinstance(counts, collections.defaultdict) and counts["b"] == []
