"""Gradient compression of data-parallel training (issue 44 part 2): the `Compression` axis (its
spellings and refusals), gTop-k's tree, top-k's k, the analytical bytes of every method
(performance/communication.py exchange_bytes, worked out by hand here), runner.toml's
[distributed] compressions, the schema-17 migration, and `dlbench run --compression` end to end
with the fake runner (which lists none only: a compressed run is recorded skipped with its reason)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from dlbench.axes import Compression, CompressionMethod, gtopk_tree, topk_count
from dlbench.definitions.loader import DefinitionError
from dlbench.execution.registry import parse_runner_toml
from dlbench.performance.communication import exchange_bytes, powersgd_compressed
from dlbench.store import migrations
from dlbench.store.record import SCHEMA_VERSION, Record
from runners.common.contract import EVERY_COMPRESSION

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "records"


# ------------------------------------------------------------------ the axis


@pytest.mark.parametrize("text", EVERY_COMPRESSION)
def test_every_method_parses_and_prints_as_it_is_spelt(text):
    c = Compression.parse(text, who="--compression")
    assert str(c) == c.value == text and c == text and hash(c) == hash(Compression.parse(text, who="x"))


def test_a_parameter_is_typed():
    assert Compression.parse("powersgd:4", who="x").rank == 4
    topk = Compression.parse(" topk:0.01 ", who="x")
    assert topk.method is CompressionMethod.TOPK and topk.density == 0.01 and topk.rank is None
    assert Compression.parse("gtopk:1", who="x").density == 1.0
    assert Compression.parse("none", who="x").dense and not topk.dense
    assert [str(c) for c in Compression.every()] == list(EVERY_COMPRESSION)
    with pytest.raises(AttributeError):
        topk.density = 0.5
    two_bit = Compression.parse("2bit:0.5", who="x")
    assert two_bit.method is CompressionMethod.TWO_BIT and two_bit.threshold == 0.5 and two_bit.density is None
    assert str(Compression.parse("2bit:2", who="x")) == "2bit:2" and CompressionMethod("2bit:0.5") is two_bit.method


@pytest.mark.parametrize("text, why", [
    ("zip", "is not one it accepts"),
    ("powersgd", "needs its rank, as powersgd:RANK"),
    ("powersgd:0", "needs a rank that is a whole number >= 1"),
    ("powersgd:1.5", "needs a rank that is a whole number >= 1"),
    ("topk:0", "needs a density in (0, 1]"),
    ("topk:1.5", "needs a density in (0, 1]"),
    ("gtopk:nan", "needs a density in (0, 1]"),
    ("topk:dense", "needs a density in (0, 1]"),
    ("fp16:2", "takes no parameter after fp16"),
    ("2bit", "needs its threshold, as 2bit:THRESHOLD"),
    ("2bit:0", "needs a threshold > 0"),
    ("2bit:-1", "needs a threshold > 0"),
    ("2bit:inf", "needs a threshold > 0"),
])
def test_a_bad_value_is_one_error_naming_who_and_what_is_accepted(text, why):
    with pytest.raises(ValueError) as e:
        Compression.parse(text, who="--compression")
    assert str(e.value) == (f"--compression: compression {text!r} {why} "
                            "(none, fp16, bf16, powersgd:RANK, topk:DENSITY, gtopk:DENSITY, 2bit:THRESHOLD)")


def test_a_subset_is_refused_by_the_methods_it_accepts():
    with pytest.raises(ValueError, match=r"'topk:0.1' is not one it accepts \(none, fp16\)"):
        Compression.parse("topk:0.1", who="r", accepted=("none", "fp16"))


def test_k_is_the_density_times_the_size_rounded_up():
    assert topk_count(100, 0.01) == 1  # not 2 from 1.0000000000000002
    assert topk_count(101, 0.01) == 2
    assert topk_count(3, 0.01) == 1  # at least one
    assert topk_count(7, 1.0) == 7
    assert topk_count(14_680_064, 0.01) == 146_801


@pytest.mark.parametrize("ranks", range(1, 10))
def test_gtopk_tree_reaches_rank_0_and_comes_back_to_every_rank(ranks):
    up, down = gtopk_tree(ranks)
    assert len(up) == len(down) == math.ceil(math.log2(ranks))
    senders = [s for edges in up for s, _ in edges]
    assert sorted(senders) == list(range(1, ranks))  # every rank but 0 sends its pairs once
    holding = {0}
    for edges in down:  # a rank sends down only what it already holds
        assert all(s in holding for s, _ in edges)
        holding |= {d for _, d in edges}
    assert holding == set(range(ranks))
    for edges in up:  # no rank sends after it has sent, nor receives from two in one round
        assert len({d for _, d in edges}) == len(edges)


def test_gtopk_tree_of_four():
    assert gtopk_tree(4) == ([[(1, 0), (3, 2)], [(2, 0)]], [[(0, 2)], [(0, 1), (2, 3)]])


# ------------------------------------------------------------------ analytical bytes

# 48 + 8 + 24 = 80 float32 elements: a dense weight, its bias, a 3x2x2x2 convolution's weight
SHAPES = [(8, 6), (8,), (3, 2, 2, 2)]


def bytes_of(text, workers, shapes=SHAPES):
    return exchange_bytes(Compression.parse(text, who="test"), shapes, workers)


def test_dense_is_a_ring_all_reduce_of_the_float32_gradients():
    b = bytes_of("none", 4)
    assert (b.payload, b.per_rank, b.total, b.rounds) == (320, 480.0, 1920.0, 6)  # 2 (4-1)/4 x 320 per rank


@pytest.mark.parametrize("text", ["fp16", "bf16"])
def test_half_precision_halves_the_all_reduce(text):
    b = bytes_of(text, 4)
    assert (b.payload, b.per_rank, b.total) == (160, 240.0, 960.0)


def test_powersgd_sends_the_factors_of_each_matrix_they_shrink_and_the_rest_whole():
    # rank 2: (8, 6) -> (8 + 6) 2 = 28 < 48; the bias whole (8); (3, 8) -> 22 < 24: 58 elements
    assert bytes_of("powersgd:2", 2).payload == 4 * 58 and bytes_of("powersgd:2", 2).per_rank == 4 * 58
    # rank 3: (8, 6) -> 42 < 48; (3, 8) -> 33 >= 24, sent whole: 42 + 8 + 24 = 74
    assert bytes_of("powersgd:3", 2).payload == 4 * 74
    assert powersgd_compressed((8, 6), 3) and not powersgd_compressed((3, 2, 2, 2), 3)
    assert not powersgd_compressed((4096,), 1)  # a vector never
    b = bytes_of("powersgd:2", 4)
    assert (b.per_rank, b.rounds) == (2 * 3 / 4 * 4 * 58, 6)  # P then Q: one ring all-reduce's traffic


def test_topk_all_gathers_every_ranks_pairs():
    # k: ceil(4.8) + ceil(0.8) + ceil(2.4) = 5 + 1 + 3 = 9 pairs of 8 bytes
    b = bytes_of("topk:0.1", 4)
    assert (b.payload, b.per_rank, b.total, b.rounds) == (72, 3 * 72, 4 * 3 * 72, 3)


def test_topk_through_parameter_servers_moves_the_all_gathers_bytes_in_a_push_and_a_pull():
    # MXNet's kvstore: each rank pushes its 72 bytes of pairs, pulls the other ranks' 3 x 72;
    # wherever the servers sit, 4 x 3 x 72 bytes cross between hosts in all, in 2 rounds
    b = exchange_bytes(Compression.parse("topk:0.1", who="test"), SHAPES, 4, servers=True)
    ring = bytes_of("topk:0.1", 4)
    assert (b.payload, b.per_rank, b.total, b.rounds) == (72, 3 * 72, 4 * 3 * 72, 2)
    assert (b.payload, b.per_rank, b.total) == (ring.payload, ring.per_rank, ring.total)
    assert "parameter servers" in b.formula and "ring" in ring.formula
    from dlbench.performance.communication import exchange_time
    assert (exchange_time(b).messages, exchange_time(b).bytes) == (2, 3 * 72)
    assert (exchange_time(ring).messages, exchange_time(ring).bytes) == (3, 3 * 72)
    assert exchange_bytes(Compression.parse("topk:0.1", who="test"), SHAPES, 1, servers=True).total == 0
    # only top-k's count depends on the transport
    for text in ("none", "fp16", "powersgd:2", "gtopk:0.1", "2bit:0.5"):
        assert exchange_bytes(Compression.parse(text, who="test"), SHAPES, 4, servers=True) == bytes_of(text, 4)


def test_gtopk_sends_the_pairs_up_and_down_a_tree():
    b = bytes_of("gtopk:0.1", 4)
    assert (b.payload, b.total, b.per_rank, b.rounds) == (72, 2 * 3 * 72, 2 * 3 * 72 / 4, 4)
    b3 = bytes_of("gtopk:0.1", 3)
    assert (b3.total, b3.rounds) == (2 * 2 * 72, 4)  # ceil(log2 3) = 2 rounds each way


def test_two_bit_pushes_codes_to_the_servers_and_pulls_the_float32_sum():
    # 16 codes a float32 word: ceil(48/16) + ceil(8/16) + ceil(24/16) = 3 + 1 + 2 = 6 words = 24 bytes;
    # the sum pulled is float32: 320 bytes; (n-1)/n of both cross to other hosts
    b = bytes_of("2bit:0.5", 4)
    assert (b.payload, b.per_rank, b.total, b.rounds) == (24, 3 / 4 * (24 + 320), 3 * (24 + 320), 2)
    assert bytes_of("2bit:0.5", 2).per_rank == (24 + 320) / 2
    assert bytes_of("2bit:0.5", 2).per_rank < bytes_of("none", 2).per_rank  # the push shrinks, not the pull
    from dlbench.performance.communication import exchange_time
    assert (exchange_time(b).messages, exchange_time(b).bytes) == (2, b.per_rank)


@pytest.mark.parametrize("text", EVERY_COMPRESSION)
def test_one_worker_sends_nothing(text):
    assert bytes_of(text, 1).per_rank == bytes_of(text, 1).total == 0


def test_fcn5_at_two_workers():
    """The issue's network: 57 MB of float32 gradients; each method's bytes against dense."""
    shapes = [(2048, 784), (2048,), (4096, 2048), (4096,), (1024, 4096), (1024,), (10, 1024), (10,)]
    dense = bytes_of("none", 2, shapes)
    assert dense.payload == 4 * sum(math.prod(s) for s in shapes) == 56_823_848
    assert bytes_of("fp16", 2, shapes).per_rank == dense.per_rank / 2
    assert bytes_of("powersgd:4", 2, shapes).payload == 4 * (
        (2048 + 784) * 4 + 2048 + (4096 + 2048) * 4 + 4096 + (1024 + 4096) * 4 + 1024 + (10 + 1024) * 4 + 10)
    assert bytes_of("topk:0.01", 2, shapes).payload == 8 * sum(topk_count(math.prod(s), 0.01) for s in shapes)
    # through MXNet's servers at 2 workers: each pushes its pairs and pulls the other's, 1.14 MB a host
    through_servers = exchange_bytes(Compression.parse("topk:0.01", who="test"), shapes, 2, servers=True)
    assert through_servers.per_rank == through_servers.payload == 1_136_520
    # 2-bit: 1/16 of the words pushed, the float32 sum pulled: 30.2 MB a host instead of 56.8
    two_bit = bytes_of("2bit:0.5", 2, shapes)
    assert two_bit.payload == 4 * sum(-(-math.prod(s) // 16) for s in shapes) == 3_551_492
    assert two_bit.per_rank == (3_551_492 + 56_823_848) / 2


# ------------------------------------------------------------------ runner.toml


def runner_toml(tmp_path, distributed: str) -> Path:
    path = tmp_path / "runner.toml"
    path.write_text('name = "x"\nimport_name = "x"\nworker = "w.py"\n[requirements]\ncpu = "a"\ncuda = "b"\n'
                    '[capabilities]\nprecisions = ["fp32"]\ncompile = ["eager"]\nmodes = ["train"]\n'
                    '[distributed]\nworker = "d.py"\nlaunch = "ranks"\n' + distributed)
    return path


def test_runner_toml_lists_methods_and_the_reasons_for_the_rest(tmp_path):
    toml = parse_runner_toml(runner_toml(tmp_path, 'compressions = ["none", "topk"]\n'
                                                   '[distributed.compression_refused]\nfp16 = "no cast"\n'))
    assert toml.distributed.compressions == (CompressionMethod.NONE, CompressionMethod.TOPK)
    assert toml.distributed.compression_refused == {CompressionMethod.FP16: "no cast"}
    assert parse_runner_toml(runner_toml(tmp_path, "")).distributed.compressions == (CompressionMethod.NONE,)


@pytest.mark.parametrize("distributed, field, message", [
    ('compressions = ["none", "zip"]\n', "distributed.compressions[1]", "'zip' is not one of"),
    ('compressions = ["none", "none"]\n', "distributed.compressions", "lists none twice"),
    ('compressions = ["none", "fp16"]\n[distributed.compression_refused]\nfp16 = "x"\n', "distributed",
     "compression_refused gives a reason for fp16, which compressions lists"),
])
def test_a_bad_runner_toml_is_one_error_naming_the_field(tmp_path, distributed, field, message):
    with pytest.raises(DefinitionError) as e:
        parse_runner_toml(runner_toml(tmp_path, distributed))
    assert field in str(e.value) and message in str(e.value)


def test_every_shipped_runner_says_why_for_each_method_it_leaves_out():
    from dlbench import paths
    from dlbench.execution.registry import RunnerRegistry

    registry = RunnerRegistry(paths.runners_dir())
    for name in ("torch", "jax", "mxnet", "tensorflow"):
        d = registry.get(name).distributed
        left_out = set(CompressionMethod) - d.capabilities.listed(CompressionMethod)
        assert {m for m, _ in d.compression_refused} == left_out, name
    # every method but MXNet's parameter-server 2-bit
    every_collective = set(CompressionMethod) - {CompressionMethod.TWO_BIT}
    assert registry.get("torch").distributed.capabilities.listed(CompressionMethod) == every_collective
    assert registry.get("jax").distributed.capabilities.listed(CompressionMethod) == every_collective
    assert registry.get("tensorflow").distributed.capabilities.listed(CompressionMethod) == every_collective - {
        CompressionMethod.GTOPK}
    assert registry.get("mxnet").distributed.capabilities.listed(CompressionMethod) == {
        CompressionMethod.NONE, CompressionMethod.FP16, CompressionMethod.POWERSGD, CompressionMethod.TWO_BIT,
        CompressionMethod.TOPK}


def test_mxnet_topk_skips_a_tensor_its_float32_indices_cannot_address_and_no_distributed_network_has_one():
    from dlbench import paths
    from dlbench.definitions.catalog import SuiteCatalog
    from dlbench.definitions.weights import is_state, weight_shapes
    from runners.mxnet.distributed import topk_unavailable

    assert topk_unavailable([10, 2 ** 24]) is None  # index 2^24 - 1: a float32 integer
    why = topk_unavailable([10, 2 ** 24 + 1])
    assert "16777217 elements" in why and "float32" in why
    suite = SuiteCatalog(paths.suites_dir()).load_distributed_suite(paths.suites_dir() / "distributed.yaml",
                                                                    "default", "cpu")
    for b in suite.benchmarks:
        sizes = [math.prod(s) for name, s in weight_shapes(b.network.resolved).items() if not is_state(name)]
        assert topk_unavailable(sizes) is None, b.network.name


# ------------------------------------------------------------------ the record


def record_of(version: int) -> dict:
    data = json.loads((FIXTURES / f"v{version}.json").read_text())
    data.pop("checksum", None)  # the file's, not the record's
    return data


def test_older_data_parallel_training_records_read_as_dense():
    v5 = record_of(5)  # torch fcn5-train-w2 of the distributed suite
    assert Record.model_validate(migrations.upgrade(v5, SCHEMA_VERSION)).workload.compression == "none"
    v14 = record_of(14)  # a single-process run
    upgraded = Record.model_validate(migrations.upgrade(v14, SCHEMA_VERSION))
    assert upgraded.workload.compression is None and upgraded.distributed is None


def test_runs_pair_on_their_compression():
    from dlbench.analysis.comparison import KEY_FIELDS, record_identity

    v17 = Record.model_validate(record_of(17))
    assert "compression" in KEY_FIELDS and record_identity(v17)["compression"] == v17.workload.compression


# ------------------------------------------------------------------ dlbench run --compression


def test_each_compression_is_a_run_a_method_the_runner_leaves_out_is_skipped(
        cli_env, fast_fake_runner, invoke, tmp_path):
    store = tmp_path / "s"
    code, out, err = invoke("run", "--suite", "distributed", "--framework", "fake", "--env", "current", "--profile",
                            "smoke", "--benchmark", "fcn5", "--store", str(store), "--compression", "none,topk:0.01",
                            "--workers", "2", "--threads", "1")
    assert code == 0, err
    records = [json.loads(p.read_text()) for p in (store / "runs").glob("*.json")]
    by = {(r["distributed"]["workers"], r["workload"]["compression"]): r for r in records}
    assert sorted(by) == [(1, "none"), (2, "none"), (2, "topk:0.01")]  # one dense baseline for both
    dense, topk = by[(2, "none")], by[(2, "topk:0.01")]
    assert dense["status"] == "ok" and dense["distributed"]["scaling"]["baseline_run_id"] == by[(1, "none")]["run_id"]
    params = dense["params"]
    assert dense["distributed"]["exchange"]["payload_bytes"] == 4 * params
    assert dense["distributed"]["exchange"]["bytes_per_rank"] == 4 * params  # 2 (2-1)/2 B
    assert by[(1, "none")]["distributed"]["exchange"] is None  # one worker exchanges nothing
    assert topk["status"] == "skipped" and not topk["repeats"]
    assert topk["reason"] == ("fake data-parallel runner: compression topk is not one it trains in "
                              "(runner.toml [distributed] compressions: none)")
    assert "topk:0.01" in out


@pytest.mark.parametrize("value, message", [
    ("topk:2", "--compression: compression 'topk:2' needs a density in (0, 1]"),
    ("lz4", "--compression: compression 'lz4' is not one it accepts"),
])
def test_a_bad_compression_ends_the_command_before_anything_runs(
        cli_env, fast_fake_runner, invoke, tmp_path, value, message):
    code, _, err = invoke("run", "--suite", "distributed", "--framework", "fake", "--env", "current", "--profile",
                          "smoke", "--store", str(tmp_path / "s"), "--compression", value)
    assert code == 2 and message in err and not (tmp_path / "s").exists()


def test_a_single_process_suite_refuses_compression(cli_env, fast_fake_runner, invoke, tmp_path):
    code, _, err = invoke("run", "--suite", "fcn", "--framework", "fake", "--env", "current", "--profile", "smoke",
                          "--store", str(tmp_path / "s"), "--compression", "fp16")
    assert code == 2 and "--compression is not taken by suite 'fcn'" in err


# ------------------------------------------------------------------ the crossover bandwidth


def test_the_crossover_is_where_the_bytes_saved_pay_for_the_extra_work():
    from dlbench.performance.communication import crossover_bandwidth, exchange_time

    dense, topk = bytes_of("none", 2), bytes_of("topk:0.1", 2)
    assert exchange_time(dense).bytes == 320 and exchange_time(dense).messages == 2
    assert exchange_time(topk).bytes == 72 and exchange_time(topk).messages == 1
    # 248 bytes saved, one start-up fewer: with 1 ms of extra work and α = 0.2 ms, β* = 0.8 ms / 248 B
    bandwidth = crossover_bandwidth(topk, dense, alpha_s=2e-4, extra_s=1e-3)
    assert bandwidth == pytest.approx(248 / 8e-4)
    beta = 1 / bandwidth  # at the crossover both take as long
    assert 1e-3 + 1 * 2e-4 + 72 * beta == pytest.approx(2 * 2e-4 + 320 * beta)
    assert crossover_bandwidth(topk, dense, alpha_s=2e-3, extra_s=1e-3) == math.inf  # start-ups saved pay it
    gtopk4, dense4 = bytes_of("gtopk:0.1", 4), bytes_of("none", 4)
    assert exchange_time(gtopk4).bytes == 4 * 72 and exchange_time(gtopk4).messages == 4
    # sends more than dense on the longest path (the example's tensors are tiny): never faster
    assert crossover_bandwidth(bytes_of("topk:1", 4), dense4, alpha_s=0.0, extra_s=1e-3) is None
