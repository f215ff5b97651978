"""A local worker's torch thread count stays its own: it neither leaks into the controller nor
follows the controller's (the bug: a split-placement generation worker built with 1 thread left the
policy training on 1 thread for the rest of the run, and every later run in that process too)."""

from __future__ import annotations

import threading

import pytest
import torch

from posttrain.distributed.workers import LocalWorkers, torch_threads
from posttrain.modeling.loading import set_torch_threads


class OneThreadWorker:
    """Like GenerationWorker: sets its thread count in its constructor."""

    def __init__(self, num_threads: int | None = None) -> None:
        set_torch_threads(num_threads)

    def threads(self) -> int:
        return torch.get_num_threads()


def vllm_skip_set_num_threads(num_threads: int) -> None:
    """What vLLM's CPU worker puts in place of `torch.set_num_threads`, process-wide, once it has bound
    its threads (a local vLLM engine runs in the controller's process; CI once ran these tests in a
    pytest process after one)."""


@pytest.fixture(params=["torch", "after_vllm"])
def two_threads(request, monkeypatch):
    before = torch.get_num_threads()
    torch._C.set_num_threads(2)
    if request.param == "after_vllm":
        monkeypatch.setattr(torch, "set_num_threads", vllm_skip_set_num_threads)
    yield
    torch._C.set_num_threads(before)


def test_workers_set_their_thread_count_even_after_vllm(two_threads):
    """The workers' constructors (policy, generation worker, teacher, reward model, HF judge) set their
    count with `set_torch_threads`, which vLLM's replacement of `torch.set_num_threads` cannot disable."""
    set_torch_threads(1)
    assert torch.get_num_threads() == 1
    set_torch_threads(None)
    assert torch.get_num_threads() == 1


def test_a_local_workers_thread_count_does_not_leak_into_the_controller(two_threads):
    workers = LocalWorkers(OneThreadWorker, [{"num_threads": 1}], name="generation")
    assert torch.get_num_threads() == 2  # the constructor's setting was undone
    assert workers.run(OneThreadWorker.threads) == [1]  # the worker's calls run with its own
    assert torch.get_num_threads() == 2


def test_a_worker_called_from_another_thread_keeps_its_count_while_the_controller_keeps_its_own(two_threads):
    workers = LocalWorkers(OneThreadWorker, [{"num_threads": 1}], name="generation")
    seen: dict[str, int] = {}
    inside = threading.Event()
    release = threading.Event()

    class Probe(OneThreadWorker):
        def wait(self) -> int:
            inside.set()
            release.wait(10)
            return torch.get_num_threads()

    workers.instances = [Probe()]
    thread = threading.Thread(target=lambda: seen.update(worker=workers.run(Probe.wait)[0]))
    thread.start()
    assert inside.wait(10)
    seen["controller"] = torch.get_num_threads()  # while the worker's call is in flight
    release.set()
    thread.join(10)
    assert seen == {"worker": 1, "controller": 2}


def test_without_a_thread_count_nothing_changes(two_threads):
    workers = LocalWorkers(OneThreadWorker, [{}], name="policy")
    assert workers.run(OneThreadWorker.threads) == [2]
    with torch_threads(None):
        assert torch.get_num_threads() == 2
