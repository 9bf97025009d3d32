"""runner.toml, validated once by its pydantic schema (src/dlbench/execution/registry.py): what each
runner declares it runs ([capabilities]), and one error naming the file and the field for each way
the file can be wrong."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest

from dlbench.axes import Compile, Mode, Precision, Scenario
from dlbench.definitions.loader import DefinitionError
from dlbench.execution.registry import SCHEMA_CHOICES, RunnerRegistry, RunnerToml

ROOT = Path(__file__).resolve().parents[2]
HEAD = 'name = "r"\nimport_name = "json"\nworker = "worker.py"\n[requirements]\ncpu = "cpu.txt"\ncuda = "cuda.txt"\n'
CAPABILITIES = '[capabilities]\nprecisions = ["fp32", "amp_bf16"]\ncompile = ["eager"]\nmodes = ["train", "infer"]\n'


def registry(tmp_path: Path, toml: str) -> RunnerRegistry:
    folder = tmp_path / "runners" / "r"
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("cpu.txt", "cuda.txt", "worker.py", "distributed_worker.py"):
        (folder / name).write_text("")
    (folder / "runner.toml").write_text(toml)
    return RunnerRegistry(folder.parent)


def test_every_runner_declares_what_it_runs():
    runners = RunnerRegistry(ROOT / "runners")
    assert set(runners.names()) >= {"torch", "tensorflow", "jax", "mxnet"}
    for name in runners.names():
        caps = runners.get(name).capabilities
        assert Precision.FP32 in caps.listed(Precision) and Mode.TRAIN in caps.listed(Mode), name
        assert Precision.FLOAT64 not in caps.listed(Precision)  # the check's precision: every runner takes it, none lists it
    jax = runners.get("jax")
    assert jax.capabilities.listed(Compile) == {Compile.COMPILED} and jax.default_compile == "compiled"
    assert runners.get("tensorflow").distributed.capabilities.listed(Precision) == {Precision.FP32}
    # MXNet's kvstore has no all-to-all, said once in its runner.toml; the other engines offer it
    assert "no all-to-all" in runners.get("mxnet").distributed.not_offered("all_to_all")
    assert all(runners.get(fw).distributed.not_offered("all_to_all") is None for fw in ("torch", "jax", "tensorflow"))


def test_a_runner_refuses_what_it_does_not_list_naming_what_it_runs(tmp_path):
    caps = registry(tmp_path, HEAD + CAPABILITIES).get("r").capabilities
    assert caps.supports(Precision.AMP_BF16) and caps.refusal("r", Precision.AMP_BF16) is None
    assert not caps.supports(Precision.AMP_FP16) and not caps.supports(Scenario.SERVER)
    assert caps.refusal("r", Precision.AMP_FP16) == (
        "r runner: precision amp_fp16 is not one it runs (runner.toml [capabilities]: fp32, amp_bf16)")
    assert caps.refusal("r", Mode.GENERATE).endswith("[capabilities]: train, infer)")
    assert caps.refusal("r", Scenario.OFFLINE).endswith("[capabilities]: none)")


def test_the_distributed_step_trains_in_fp32_unless_the_runner_says_more(tmp_path):
    launch = '[distributed]\nworker = "distributed_worker.py"\nlaunch = "ranks"\n'
    data_parallel = registry(tmp_path, HEAD + CAPABILITIES + launch).get("r").distributed.capabilities
    assert data_parallel.listed(Precision) == {Precision.FP32}
    assert data_parallel.refusal("r", Precision.TF32) == (
        "r data-parallel runner: precision tf32 is not one it trains in (runner.toml [distributed] precisions: fp32)")
    more = launch + 'precisions = ["fp32", "tf32"]\n'
    assert registry(tmp_path, HEAD + CAPABILITIES + more).get("r").distributed.capabilities.listed(Precision) == {
        Precision.FP32, Precision.TF32}


@pytest.mark.parametrize("toml, field, reason", [
    (HEAD, "capabilities", "missing"),
    (HEAD + '[capabilities]\nprecisions = ["fp32", "fp8"]\ncompile = ["eager"]\nmodes = ["train"]\n',
     "capabilities.precisions[1]", "'fp8' is not one of fp32, tf32, amp_bf16, amp_fp16, float64"),
    (HEAD + '[capabilities]\nprecisions = ["fp32", "float64"]\ncompile = ["eager"]\nmodes = ["train"]\n',
     "capabilities.precisions", "float64 is the equivalence check's precision, not a run's"),
    (HEAD + '[capabilities]\nprecisions = ["fp32"]\ncompile = ["eager", "eager"]\nmodes = ["train"]\n',
     "capabilities.compile", "lists eager twice"),
    (HEAD + '[capabilities]\nprecisions = []\ncompile = ["eager"]\nmodes = ["train"]\n',
     "capabilities.precisions", "at least 1 item"),
    (HEAD + '[capabilities]\nprecisions = ["fp32"]\ncompile = ["eager"]\nmodes = ["train"]\nkinds = ["comm"]\n',
     "capabilities.kinds", "unknown field"),
    (HEAD + '[capabilities]\nprecisions = ["fp32"]\ncompile = ["compiled"]\nmodes = ["train"]\n',
     "execution.compile", "'eager' is not in [capabilities] compile"),
    (HEAD + CAPABILITIES + '[distributed]\nworker = "distributed_worker.py"\nlaunch = "ranks"\nprecisions = ["bf16"]\n',
     "distributed.precisions[0]", "'bf16' is not one of"),
    (HEAD + CAPABILITIES + '[distributed]\nworker = "distributed_worker.py"\nlaunch = "ranks"\n'
     '[distributed.collectives_not_offered]\nalltoall = "no"\n',
     "distributed.collectives_not_offered.alltoall", "'alltoall' is not one of all_reduce"),
    (HEAD + CAPABILITIES + '[distributed]\nworker = "distributed_worker.py"\nlaunch = "ranks"\n'
     '[distributed.collectives_not_offered]\nall_to_all = ""\n',
     "distributed.collectives_not_offered.all_to_all", "at least 1 character"),
    (HEAD.replace('worker = "worker.py"', 'worker = 3') + CAPABILITIES, "worker", "valid string"),
    ('name = "r"\n' + CAPABILITIES, "import_name", "missing"),
    ('execution = "eager"\n' + HEAD + CAPABILITIES, "execution", "must be a table"),  # a key above the tables
])
def test_a_bad_runner_toml_is_one_error_naming_the_file_and_field(tmp_path, toml, field, reason):
    with pytest.raises(DefinitionError) as e:
        registry(tmp_path, toml).get("r")
    assert e.value.path.endswith("runners/r/runner.toml") and e.value.field == field
    assert reason in e.value.reason


def test_several_problems_are_one_error_that_counts_the_rest(tmp_path):
    with pytest.raises(DefinitionError) as e:
        registry(tmp_path, 'name = "r"\n').get("r")
    assert e.value.field == "import_name" and e.value.reason == "missing (and 3 more)"


def test_the_schemas_choices_are_the_models_and_launchers_own():
    """The Literal choices runner.toml is validated against are the tables the code acts on."""
    sections = {"model": RunnerToml.model_fields["model"].annotation,
                "distributed": typing.get_args(RunnerToml.model_fields["distributed"].annotation)[0]}
    for dotted, choices in SCHEMA_CHOICES.items():
        section, field = dotted.split(".")
        assert typing.get_args(sections[section].model_fields[field].annotation) == tuple(choices), dotted
