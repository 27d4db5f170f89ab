"""The CUDA path (marked `gpu`; skipped, saying why, where there is no CUDA device): a worker
on a GPU, two workers sharing one GPU over gloo (tensors staged through the CPU), a wrapped
CUDA model, an asynchronous worker on the GPU lost and joining again, and NCCL across two
GPUs."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from hetsync.telemetry.rundir import RunDir
from hetsync.telemetry.summarize import summarize
from distributed import run_ranks
from processes import pid_of_rank

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(GPUS == 0, reason="no CUDA device here (torch "
                                 f"{torch.__version__}, cuda available: "
                                 f"{torch.cuda.is_available()})")]
RUN = ["-n", "lenet", "--time-budget", "6", "--eval-interval", "3", "--no-figures"]


def _hetsync(*args, env=None):
    out = subprocess.run([sys.executable, "-m", "hetsync", *args], capture_output=True,
                         text=True, timeout=300, env={**os.environ, **(env or {})})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return out


def test_a_worker_trains_on_the_gpu(tmp_path):
    _hetsync("worker", "-m", "local", "-g", "0", "--run-name", "gpu", "-ld", str(tmp_path), *RUN)
    run = json.loads((tmp_path / "gpu" / "run.json").read_text())
    assert run["ranks"][0]["device"] == "gpu0"
    assert summarize(tmp_path / "gpu")["final_accuracy"] > 0.6


def test_two_workers_share_one_gpu_over_gloo(tmp_path):
    _hetsync("launch", "-m", "esync", "--workers", "2", "--slowdowns", "1,2", "-g", "0",
             "--run-name", "shared", "-ld", str(tmp_path), "--quiet", "--no-live", *RUN)
    summary = summarize(tmp_path / "shared")
    assert [w["device"] for w in summary["per_worker"]] == ["gpu0", "gpu0"]
    assert summary["complete"] and summary["final_accuracy"] > 0.6


def _wrapped_cuda(rank, world):
    import hetsync

    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 4)).cuda()
    opt = hetsync.wrap(torch.optim.SGD(model.parameters(), lr=0.5), model, mode="sync")
    g = torch.Generator().manual_seed(rank)
    for _ in range(10 + 5 * rank):   # uneven
        x = torch.randn(32, 16, generator=g).cuda()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), x[:, :4].argmax(1)).backward()
        opt.step()
    opt.finish()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()


def test_a_wrapped_cuda_model_over_gloo_ends_as_one_model():
    a, b = run_ranks(_wrapped_cuda, 2, timeout=120, start="spawn")  # (no CUDA after fork)
    torch.testing.assert_close(a, b)


def test_an_asynchronous_worker_on_the_gpu_is_lost_and_joins_again(tmp_path):
    """async, 3 workers sharing gpu0: rank 1 killed with kill -9 joins again on a link of its
    own to the parameter server (CUDA tensors staged through the CPU on both groups)."""
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hetsync", "launch", "-m", "async", "--workers", "3",
         "--slowdowns", "1,2,2", "-g", "0", "--timeout", "30", "--time-budget", "25",
         "--eval-interval", "1", "-ld", str(tmp_path), "--run-name", "run", "--quiet",
         "--no-live", "--no-figures"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    deadline = time.monotonic() + 120
    while not (run / "worker-1.jsonl").exists() or pid_of_rank(run, 1) is None:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.2)
    time.sleep(3.0)
    os.kill(pid_of_rank(run, 1), signal.SIGKILL)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    assert [e["rank"] for e in RunDir(run).read_events("joined")] == [1]
    summary = summarize(run)
    assert summary["joined_workers"] == [1] and summary["final_accuracy"] > 0.6, out
    assert {w["device"] for w in summary["per_worker"]} == {"gpu0"}


@pytest.mark.skipif(GPUS < 2, reason=f"NCCL needs a GPU per rank: {GPUS} here")
def test_sync_over_nccl_on_two_gpus(tmp_path):
    _hetsync("launch", "-m", "sync", "--workers", "2", "--slowdowns", "1,1", "-g", "0",
             "--run-name", "nccl", "-ld", str(tmp_path), "--quiet", "--no-live", *RUN,
             env={"HETSYNC_BACKEND": "nccl", "HETSYNC_GPU_PER_LOCAL_RANK": "1"})
    summary = summarize(tmp_path / "nccl")
    assert [w["device"] for w in summary["per_worker"]] == ["gpu0", "gpu1"]
    assert summary["final_accuracy"] > 0.6
