"""The kernels suite's float32 is IEEE float32 in every framework, as an fp32 run's is: each runner
pins TF32 off before it prepares a kernel and says so in the kernel's settings (on the CPU the
flags are what the same code sets on a GPU, where JAX, TensorFlow and cuDNN default to TF32)."""

from __future__ import annotations

import pytest

from dlbench import paths
from dlbench.execution.environments import VenvBackend
from dlbench.execution.kernels import kernel_request
from dlbench.execution.launcher import run_worker
from dlbench.execution.registry import RunnerRegistry
from dlbench.performance.kernel_suite import KernelPolicy
from dlbench.performance.kernels import KernelSpec

pytestmark = pytest.mark.integration

# what each framework reports once float32 math is pinned (the keys are the runners' own)
IEEE_FLOAT32 = {
    "torch": {"torch.backends.cudnn.allow_tf32": False, "torch.backends.cuda.matmul.allow_tf32": False,
              "torch.get_float32_matmul_precision()": "highest"},
    "tensorflow": {"tensor_float_32_execution_enabled": False},
    "jax": {"jax_default_matmul_precision": "highest"},
    "mxnet": {"NVIDIA_TF32_OVERRIDE": "0", "MXNET_CUDA_TENSOR_OP_MATH_ALLOW_CONVERSION": "0"},
}


@pytest.mark.parametrize("framework", sorted(IEEE_FLOAT32))
def test_kernels_run_under_the_precisions_math_and_record_it(framework):
    runner = RunnerRegistry(paths.runners_dir()).get(framework)
    env = VenvBackend(paths.cache_dir()).ensure(runner, "cpu")
    specs = [KernelSpec.of("matmul", "float32", m=64, n=64, k=64), KernelSpec.of("matmul", "bfloat16", m=64, n=64, k=64)]
    policy = KernelPolicy(warmup_iters=1, min_iters=2, min_time_s=0.0, max_iters=3, repeats=1, cache="warm")
    outcome = run_worker(env.python, runner.worker, kernel_request(specs, policy, "cpu", 1), timeout_s=300)
    assert outcome.status == "ok", outcome.reason or outcome.output_tail
    fp32, bf16 = outcome.result["kernels"]
    assert fp32["status"] == "ok", fp32
    flags = fp32["settings"]["precision_effective"]
    assert {k: flags.get(k) for k in IEEE_FLOAT32[framework]} == IEEE_FLOAT32[framework]
    # bfloat16 runs, or is skipped with the framework's reason (MXNet's oneDNN needs AVX-512 for it)
    assert bf16["status"] == "ok" or (bf16["status"] == "skipped" and bf16["reason"]), bf16
