"""Operation classes and their measured efficiencies (performance/class_efficiency.py, probes.py) and
where a prediction's time came from (model.SOURCES): the arithmetic by hand, framework-free."""

from __future__ import annotations

import math
from datetime import datetime, timezone

import pytest

from dlbench.performance.accuracy import accuracy_table_rows, datasheet_matcher, prediction_errors
from dlbench.performance.class_efficiency import (ClassPoint, efficiency_class, fit_class, matmul_aspect,
                                                  leave_one_out_error, operand_elements, output_elements, probe_stratum,
                                                  probe_roles, select_probes, work_size)
from dlbench.performance.kernel_suite import KernelPolicy
from dlbench.performance.kernels import KernelSpec
from dlbench.performance.model import FrameworkFacts, class_fits, class_points, op_time, predict
from dlbench.performance.probes import class_probes, plan_probes, probe_policy
from dlbench.performance.workload import Op, decompose
from dlbench.store.profiles import BandwidthPoint, KernelTime, MachineProfile, MatmulCeiling, ProbeTime

EAGER, GRAPH = FrameworkFacts("eager"), FrameworkFacts("graph")


def profile(**kw) -> MachineProfile:
    """1 GFLOP/s, 1 GB/s at every size, a 1 µs warm call and a 3 µs cold one for `fw`."""
    base = dict(machine_id="m" * 64, revision=1, created_at=datetime(2026, 12, 2, tzinfo=timezone.utc),
                dlbench={"version": "test"}, machine={"hostname": "box"}, device="cpu", threads=2,
                matmul_peak={"float32": MatmulCeiling(flops_per_s=1e9, framework="fw", kernel="k")},
                copy_bandwidth=[BandwidthPoint(bytes=1000, bytes_per_s=1e9, framework="fw")],
                dispatch_s={"fw": 1e-6}, dispatch_cold_s={"fw": 3e-6})
    base.update(kw)
    return MachineProfile(**base)


def mm(m, n, k):
    return KernelSpec.of("matmul", m=m, n=n, k=k)


def probe(spec: KernelSpec, seconds: float, cache="cold") -> ProbeTime:
    return ProbeTime(spec=spec.to_dict(), median_s=seconds, run_id="r1", cache=cache)


# --------------------------------------------------------------------------- classes


def test_classes_by_aspect_family_and_path():
    # one matmul class per dtype, its probes spread over the aspects
    assert efficiency_class(mm(64, 2048, 784)) == efficiency_class(mm(256, 768, 3072)) == "matmul float32"
    assert efficiency_class(KernelSpec.of("matmul", "bfloat16", m=256, n=768, k=3072)) == "matmul bfloat16"
    assert probe_stratum(mm(64, 2048, 784)) == "matmul float32 small-m"
    assert probe_stratum(mm(784, 2048, 64)) == "matmul float32 small-k"
    assert probe_stratum(mm(64, 10, 2048)) == "matmul float32 small-n"  # the smallest of the small ones
    assert probe_stratum(mm(256, 768, 3072)) == "matmul float32 large"
    assert matmul_aspect(mm(128, 128, 128)) == "large" and matmul_aspect(mm(127, 127, 127)) == "small-m"
    assert operand_elements(mm(2, 3, 4)) == 2 * 4 + 4 * 3 + 2 * 3
    assert operand_elements(KernelSpec.of("sgd_momentum", elements=10)) == 0
    # a dense layer's backward is probed as a class of its own (its layout is the step's)
    dense = KernelSpec.of("dense_bwd", batch=2, positions=5, inputs=4, units=3, bias=1, input_grad=1)
    assert efficiency_class(dense) == probe_stratum(dense) == "dense_bwd float32"
    conv = dict(batch=8, channels=64, height=8, width=8, filters=64, sh=1, sw=1, ph=1, pw=1)
    assert efficiency_class(KernelSpec.of("conv2d_fwd", kh=3, kw=3, **conv)) == "conv2d_fwd 3x3 float32"
    assert efficiency_class(KernelSpec.of("conv2d_fwd", kh=1, kw=1, **conv)) == "conv2d_fwd 1x1 float32"
    assert efficiency_class(KernelSpec.of("conv2d_bwd", kh=11, kw=11, input_grad=0, **conv)) == \
        "conv2d_bwd large no-dx float32"
    assert efficiency_class(KernelSpec.of("conv2d_bwd", kh=5, kw=5, input_grad=1, **conv)) == "conv2d_bwd large float32"
    # a forward over an image's channels (a network's first layer) apart from those over feature maps
    image = {**conv, "channels": 3}
    assert efficiency_class(KernelSpec.of("conv2d_fwd", kh=3, kw=3, **image)) == "conv2d_fwd 3x3 image-input float32"
    assert efficiency_class(KernelSpec.of("conv2d_fwd", kh=7, kw=7, **image)) == "conv2d_fwd large image-input float32"
    assert efficiency_class(KernelSpec.of("conv2d_bwd", kh=7, kw=7, input_grad=0, **image)) == \
        "conv2d_bwd large no-dx float32"  # its backward is already apart: no input gradient
    att = dict(batch=2, heads=4, steps=32, head_size=16, causal=1)
    assert efficiency_class(KernelSpec.of("attention_fwd", dropout=100, **att)) == "attention_fwd dropout float32"
    assert efficiency_class(KernelSpec.of("attention_bwd", dropout=0, **att)) == "attention_bwd float32"
    assert efficiency_class(KernelSpec.of("sgd_momentum", elements=10)) == "sgd_momentum float32"
    # pooling by operation: a window's maximum, its mean, the mean over the whole map
    pool = dict(batch=8, channels=32, height=16, width=16, kh=3, kw=3, sh=2, sw=2, ph=0, pw=0)
    assert efficiency_class(KernelSpec.of("pool2d_fwd", op=0, **pool)) == "pool2d_fwd max float32"
    assert efficiency_class(KernelSpec.of("pool2d_bwd", "bfloat16", op=1, **pool)) == "pool2d_bwd avg bfloat16"
    assert efficiency_class(KernelSpec.of("pool2d_fwd", op=2, **{**pool, "kh": 16, "kw": 16})) == \
        "pool2d_fwd global float32"
    # work: FLOPs for the compute kinds, bytes for the memory-bound ones
    assert work_size(mm(2, 3, 4)) == 48 and work_size(KernelSpec.of("sgd_momentum", elements=10)) == 200


def test_a_class_is_fitted_as_overhead_plus_slowed_work():
    # three probes made of 30 µs overhead + 4x the roofline: fitted back
    points = [ClassPoint(r, 30e-6 + 4 * r, f"p{i}") for i, r in enumerate((1e-6, 1e-4, 1e-2))]
    fit = fit_class(points)
    assert fit.overhead_s == pytest.approx(30e-6, rel=1e-6) and fit.slowdown == pytest.approx(4, rel=1e-6)
    assert fit.efficiency == pytest.approx(0.25) and fit.seconds(1.0) == pytest.approx(4 + 30e-6)
    # the marginal work is never taken faster than the ceilings unless a probe was: slowdown >= 1
    flat = fit_class([ClassPoint(1e-6, 50e-6, "a"), ClassPoint(1e-5, 50e-6, "b")])
    assert flat.slowdown == pytest.approx(1.0) and flat.overhead_s == pytest.approx(45e-6, rel=0.2)
    # one probe: a constant efficiency, or, when it is overhead-bound, overhead with the work at the ceilings
    assert fit_class([ClassPoint(1e-3, 4e-3, "a")]) == type(fit)(0.0, 4.0, 1)
    assert fit_class([ClassPoint(1e-6, 41e-6, "a", overhead_bound=True)]) == type(fit)(pytest.approx(40e-6), 1.0, 1)
    # a single probe at under a tenth of the ceilings is overhead too, not a slow steady state
    assert fit_class([ClassPoint(1e-4, 2e-3, "a")]) == type(fit)(pytest.approx(1.9e-3), 1.0, 1)
    assert fit_class([ClassPoint(1e-4, 9e-4, "a")]) == type(fit)(0.0, pytest.approx(9.0), 1)
    with pytest.raises(ValueError):
        fit_class([])


def test_a_matmul_class_is_fitted_with_an_operand_term():
    """Five probes of 20 µs + 1.5 x FLOPs at the peak + 2 ns per operand element: fitted back. Three
    distinct probes are needed for the term; with two, the class is fitted as any other."""
    shapes = [mm(64, 2048, 784), mm(784, 2048, 64), mm(1024, 10000, 256), mm(16, 4096, 1000), mm(512, 512, 512)]
    points = [ClassPoint(s.flops / 1e9, 20e-6 + 1.5 * s.flops / 1e9 + 2e-9 * operand_elements(s), s.key,
                         operands=operand_elements(s)) for s in shapes]
    fit = fit_class(points)
    assert fit.overhead_s == pytest.approx(20e-6, rel=1e-3) and fit.slowdown == pytest.approx(1.5, rel=1e-6)
    assert fit.per_operand_s == pytest.approx(2e-9, rel=1e-6)
    other = mm(64, 4096, 2048)
    assert fit.seconds(other.flops / 1e9, operand_elements(other)) == pytest.approx(
        20e-6 + 1.5 * 2 * 64 * 4096 * 2048 / 1e9 + 2e-9 * (64 * 2048 + 2048 * 4096 + 64 * 4096), rel=1e-6)
    assert fit_class(points[:2]).per_operand_s == 0.0


MATMUL_PROBES = [mm(64, 2048, 784), mm(784, 2048, 64), mm(1024, 10000, 256), mm(16, 4096, 1000), mm(512, 512, 512),
                 mm(38, 30522, 768), mm(256, 64, 4096)]


def matmul_points(seconds) -> list[ClassPoint]:
    """The probes at a peak of 100 GFLOP/s, taking `seconds(spec)` each."""
    return [ClassPoint(s.flops / 1e11, seconds(s), s.key, operands=operand_elements(s), outputs=output_elements(s))
            for s in MATMUL_PROBES]


def test_a_matmul_class_takes_the_form_its_left_out_probes_choose():
    """Probes whose outputs cost 5 ns an element beyond 1 ns per operand element: the `outputs` form
    predicts each left-out probe exactly and is chosen, its terms fitted back; probes with no such
    extra cost keep the plain operand term (the richer form must win by LOO_MARGIN, not tie)."""
    def with_outputs(s):
        return 20e-6 + 1.5 * s.flops / 1e11 + 1e-9 * operand_elements(s) + 5e-9 * output_elements(s)

    points = matmul_points(with_outputs)
    assert leave_one_out_error(points, "outputs") == pytest.approx(0.0, abs=1e-6)
    assert leave_one_out_error(points, "operands") > 0.05
    fit = fit_class(points)
    assert fit.form == "outputs"
    assert (fit.per_operand_s, fit.per_output_s) == (pytest.approx(1e-9, rel=1e-4), pytest.approx(5e-9, rel=1e-4))
    s = mm(64, 4096, 2048)
    assert fit.seconds(s.flops / 1e11, operand_elements(s), output_elements(s)) == pytest.approx(with_outputs(s), rel=1e-4)
    plain = fit_class(matmul_points(lambda s: 20e-6 + 1.5 * s.flops / 1e11 + 2e-9 * operand_elements(s)))
    assert (plain.form, plain.per_output_s) == ("operands", 0.0)
    assert output_elements(mm(2, 3, 4)) == 2 * 3 and output_elements(KernelSpec.of("sgd_momentum", elements=10)) == 0


def test_the_model_charges_a_matmul_its_output_elements():
    """A profile (1 GFLOP/s) whose matmul probes cost 10 ns per operand and 200 ns more per output
    element predicts an unmeasured GEMM with both terms (eager: the call added)."""
    probes = [ProbeTime(spec=s.to_dict(), median_s=1e-6 + 20e-6 + s.flops / 1e9 + 1e-8 * operand_elements(s)
                        + 2e-7 * output_elements(s), run_id="r", cache="cold") for s in MATMUL_PROBES]
    p = profile(class_probes={"fw": probes})
    assert class_fits(p, "fw")["matmul float32"].form == "outputs"
    s = mm(64, 4096, 2048)
    seconds, sources, _ = op_time(Op("dense", s.flops, s.bytes, s), "fw", p, {}, classes=class_fits(p, "fw"))
    assert seconds == pytest.approx(1e-6 + 20e-6 + s.flops / 1e9 + 1e-8 * operand_elements(s)
                                    + 2e-7 * output_elements(s), rel=1e-4)
    assert set(sources) == {"class"}


def test_probes_spread_over_each_class_and_respect_the_cap():
    small_m = [mm(16, n, 512) for n in (256, 512, 1024, 2048, 4096)]
    large = [mm(256, 256, 256), mm(512, 512, 512)]
    chosen = select_probes(small_m + large + small_m[:2], per_class=3)  # duplicates counted once
    assert [s.key for s in chosen] == [mm(256, 256, 256).key, mm(512, 512, 512).key,
                                       small_m[0].key, small_m[2].key, small_m[4].key]
    assert [s.key for s in select_probes(small_m, per_class=1)] == [small_m[2].key]  # the median
    # too slow per call: left out before the spread is chosen
    capped = select_probes(small_m, 3, estimate_s=lambda s: s.flops / 1e9, max_probe_s=2 * 16 * 1024 * 512 / 1e9)
    assert [s["n"] for s in capped] == [256, 512, 1024]


def test_overhead_bound_probes_are_left_out_where_three_others_fit():
    """Four probes of 50 µs + 2 x roofline, and two tiny overhead-bound ones whose net time was clipped
    at their roofline (a compiled step's call taken off): fitted with them, relative residuals would
    pull the overhead towards 0; left out, the law comes back. With only two steady probes the
    bound ones are kept."""
    steady = [ClassPoint(r, 50e-6 + 2 * r, f"s{r}") for r in (1e-4, 1e-3, 1e-2, 1e-1)]
    bound = [ClassPoint(r, r, f"b{r}", overhead_bound=True) for r in (1e-7, 1e-6)]
    fit = fit_class(bound + steady)
    assert (fit.overhead_s, fit.slowdown, fit.probes) == (pytest.approx(50e-6), pytest.approx(2.0), 4)
    assert fit_class(bound + steady[:2]).probes == 4


def test_a_matmul_stratum_also_probes_its_widest_output():
    """Spread by work, the large stratum's picks are the smallest, the middle and the largest; the
    shape writing the most output elements (4096 x 4096) is timed besides, and a budget gives it up
    with the largest, after the smallest."""
    from dlbench.performance.probes import probe_tiers

    specs = [mm(256, 256, 256), mm(512, 512, 512), mm(1024, 1024, 1024), mm(4096, 4096, 130), mm(256, 256, 65536)]
    roles = probe_roles(specs, per_class=3)
    assert [(s.key, role) for s, role in roles] == [(specs[0].key, "smallest"), (specs[2].key, "middle"),
                                                     (specs[3].key, "widest"), (specs[4].key, "largest")]
    tiers = probe_tiers(roles)
    assert [tiers[specs[i].key] for i in (0, 2, 3, 4)] == [2, 0, 1, 1]
    assert [s.key for s in select_probes(specs, per_class=1)] == [specs[2].key]  # one probe: the median only


def test_a_small_matmul_stratum_also_probes_its_largest_small_dimension():
    """small-m shapes spread by work pick m = 2, 16 and 38 (the largest work, which also writes the
    most output); the m = 64 shape, small in work, is timed besides as the thickest, and a
    reduced-precision copy of it ranks three tiers later."""
    from dlbench.performance.probes import probe_tiers

    specs = [mm(2, 768, 768), mm(64, 512, 512), mm(16, 4096, 1000), mm(16, 4096, 9216), mm(38, 30522, 768)]
    roles = dict((s.key, role) for s, role in probe_roles(specs, per_class=3))
    assert roles == {specs[0].key: "smallest", specs[2].key: "middle", specs[1].key: "thickest",
                     specs[4].key: "largest"}
    half = [KernelSpec.of("matmul", "bfloat16", m=s["m"], n=s["n"], k=s["k"]) for s in specs]
    tiers = probe_tiers(probe_roles(specs + half, per_class=3))
    assert (tiers[specs[1].key], tiers[half[1].key]) == (1, 4)
    # the large aspect has no small dimension to spread over: no thickest pick there
    large = [mm(256, 256, 256), mm(512, 512, 512), mm(1024, 1024, 1024), mm(2048, 256, 256)]
    assert "thickest" not in {role for _, role in probe_roles(large, per_class=3)}


def test_a_stratum_also_probes_its_busiest_shape_and_a_budget_keeps_it_longest():
    """Given each shape's executions per iteration, the stratum also times the one executed most
    often (a small shape the spread by work passes over), in the first tier; without them, or with
    one probe per class, nothing changes."""
    from dlbench.performance.probes import probe_tiers

    specs = [mm(256, 256, 256), mm(384, 384, 384), mm(512, 512, 512), mm(1024, 1024, 1024), mm(2048, 2048, 2048)]
    plain = probe_roles(specs, per_class=3)
    uses = {specs[0].key: 1, specs[1].key: 48, specs[2].key: 2, specs[3].key: 1, specs[4].key: 1}
    roles = dict((s.key, role) for s, role in probe_roles(specs, per_class=3, uses=uses))
    assert roles[specs[1].key] == "busiest" and set(roles) == {s.key for s, _ in plain} | {specs[1].key}
    assert probe_tiers(probe_roles(specs, per_class=3, uses=uses))[specs[1].key] == 0
    # a busiest shape the spread already picked keeps its role
    assert dict((s.key, r) for s, r in probe_roles(specs, per_class=3, uses={specs[2].key: 9}))[specs[2].key] == "middle"
    assert [s.key for s in select_probes(specs, per_class=1, uses=uses)] == [specs[2].key]


def test_the_busiest_shapes_are_the_suites_most_executed_ones():
    """ResNet-56's first stage runs its 3x3 16-channel convolution 18 times a training iteration and
    18 times an inference one: the kernels suite's layer shapes count it so (KernelBenchmark.uses),
    and the default calibration probes it (its 3x3 class was fitted from a strided convolution and
    ResNet-50's and AlexNet's before)."""
    from pathlib import Path

    from dlbench.definitions.catalog import SuiteCatalog
    from dlbench.performance.kernel_suite import load_kernel_suite
    from dlbench.performance.probes import candidate_uses, candidates, layer_benchmarks

    root = Path(__file__).resolve().parents[2] / "suites"
    catalog = SuiteCatalog(root)
    names = layer_benchmarks(root / "kernels.yaml", catalog.suite_names())
    suite = load_kernel_suite(root / "kernels.yaml", catalog, "default", "cpu")
    uses = candidate_uses(suite, names)
    stage1 = dict(batch=32, channels=16, height=32, width=32, filters=16, kh=3, kw=3, sh=1, sw=1, ph=1, pw=1)
    forward = KernelSpec.of("conv2d_fwd", **stage1)
    backward = KernelSpec.of("conv2d_bwd", input_grad=1, **stage1)
    assert (uses[forward.key], uses[backward.key]) == (36, 18)
    specs = [s for s in candidates(suite, names, {}) if s.dtype == "float32"]
    roles = dict((s.key, role) for s, role in probe_roles(specs, per_class=3, uses=uses))
    assert roles[forward.key] == roles[backward.key] == "busiest"


def test_plan_stays_within_the_budget_and_the_per_call_cap():
    specs = [mm(16, n, 512) for n in (256, 1024, 4096)] + [KernelSpec.of("sgd_momentum", elements=e)
                                                             for e in (1000, 10_000)]
    policy = probe_policy(KernelPolicy(cache="cold"), "default")
    assert (policy.warmup_iters, policy.min_iters, policy.max_iters, policy.repeats, policy.cache) == (1, 3, 5, 1, "cold")
    cost = {s.key: 1.0 for s in specs} | {specs[2].key: 5.0}  # seconds per call

    def estimate(s):
        return cost[s.key]

    calls = 1 + 1 + 5
    plan = plan_probes(specs, policy, "default", "calibrate", estimate, budget_s=calls * 4.5)
    kept = [s.key for b in plan.benchmarks for s in b.specs]
    assert specs[2].key not in kept and specs[2].key in plan.left_out and len(kept) == 4
    assert plan.estimated_s == pytest.approx(calls * 4) and plan.estimated_s <= calls * 4.5
    assert [b.name for b in plan.benchmarks] == ["probes-matmul", "probes-memory-bound"]
    assert plan.classes == 2
    # a tighter budget gives up each class's smallest probe before its middle one
    tight = plan_probes(specs, policy, "default", "calibrate", estimate, budget_s=calls * 2.5)
    assert sorted(s.key for b in tight.benchmarks for s in b.specs) == sorted(
        [specs[1].key, specs[4].key])
    assert {specs[0].key, specs[3].key} <= set(tight.left_out)
    # reduced precisions go before any float32 probe
    half = KernelSpec.of("matmul", "bfloat16", m=16, n=1024, k=512)
    cost[half.key] = 0.5
    mixed = plan_probes(specs + [half], policy, "default", "calibrate", estimate, budget_s=calls * 4)
    assert half.key in mixed.left_out and len([s for b in mixed.benchmarks for s in b.specs]) == 4


# --------------------------------------------------------------------------- the model


def test_a_shape_not_timed_takes_its_class_efficiency_by_hand():
    """Probe: matmul 16 x 1024 x 512 (16.8 MFLOP; roofline 16.78 ms at 1 GFLOP/s) measured cold at
    50.003 ms. Eager: net of the 3 µs cold call, 50 ms: efficiency 0.33554, one probe, not
    overhead-bound: a constant efficiency. Another small-m shape of 4x the work, not timed:
    4 x 16.78 ms / 0.33554 + the 1 µs warm call an eager step pays (a compiled one pays neither
    the call nor the class's overhead per operation)."""
    p = mm(16, 1024, 512)
    other = mm(16, 4096, 512)
    prof = profile(class_probes={"fw": [probe(p, 0.050003)]})
    (point,) = class_points(prof, "fw", compiled=False)["matmul float32"]
    assert point.efficiency == pytest.approx(p.flops / 1e9 / 0.050) and not point.overhead_bound
    fits = class_fits(prof, "fw", compiled=False)
    op = Op("fc", other.flops, other.bytes, other)
    seconds, sources, missing = op_time(op, "fw", prof, {}, False, False, fits)
    assert seconds == pytest.approx(4 * 0.050 + 1e-6) and sources == {"class": seconds} and missing == [other.key]
    # compiled: the probe's own cold call (3 µs) is taken off, and no call is added per operation
    seconds, _, _ = op_time(op, "fw", prof, {}, True, False, class_fits(prof, "fw", compiled=True))
    assert seconds == pytest.approx(4 * 0.050)
    # another class (bfloat16 products) has no probe: the roofline at the ceilings, marked so
    wgrad = KernelSpec.of("matmul", "bfloat16", m=512, n=1024, k=16)
    seconds, sources, _ = op_time(Op("w", wgrad.flops, wgrad.bytes, wgrad), "fw", prof, {}, False, False, fits)
    assert seconds == pytest.approx(wgrad.flops / 1e9 + 1e-6) and sources == {"ceilings": seconds}
    # a measured shape wins over its class (eager: less what the flush added to its call)
    measured = {other.key: KernelTime(median_s=0.1, run_id="r", cache="cold")}
    assert op_time(op, "fw", prof, measured, False, False, fits)[:2] == (0.1 - 2e-6, {"shape": 0.1 - 2e-6})
    # a probe whose work at the ceilings is shorter than a call is overhead-bound: 1x1x1 (2 FLOP: 2 ns)
    # at 23 µs cold is 20 µs of overhead, and a larger shape of its class is that overhead + its roofline
    tiny = profile(class_probes={"fw": [probe(mm(1, 1, 1), 23e-6)]})
    (point,) = class_points(tiny, "fw")["matmul float32"]
    assert point.overhead_bound
    seconds, _, _ = op_time(op, "fw", tiny, {}, False, False, class_fits(tiny, "fw"))
    assert seconds == pytest.approx(20e-6 - 2e-9 + other.flops / 1e9 + 1e-6)
    # a compiled step pays that overhead no more than the call: the operation runs inside its executable
    fit = class_fits(tiny, "fw", compiled=True)
    assert fit["matmul float32"].overhead_s == pytest.approx(20e-6 - 2e-9)
    seconds, _, _ = op_time(op, "fw", tiny, {}, True, False, fit)
    assert seconds == pytest.approx(other.flops / 1e9)


def test_a_dense_backward_probe_is_a_measured_shape_not_a_fit():
    """dense_bwd probes are timed for their shapes (class_efficiency.UNFITTED_KINDS): no class is fitted
    from them, so another dense backward is its parts: the first layer of a 4 -> 3 dense network at
    batch 2 computes its weight gradient (4, 3, 2), here from the matmul class's one probe (10x its
    roofline: a constant efficiency), and its bias gradient (24 B at 1 GB/s)."""
    from dlbench.definitions.layers import network_model
    from dlbench.definitions.network import analyse

    probed = KernelSpec.of("dense_bwd", batch=2, positions=5, inputs=4, units=3, bias=1, input_grad=0)
    gemm = mm(64, 64, 64)
    prof = profile(class_probes={"fw": [probe(probed, 1.0), probe(gemm, 10 * gemm.flops / 1e9)]})
    fits = class_fits(prof, "fw", compiled=True)
    assert set(fits) == {"matmul float32"}
    net = analyse(network_model().model_validate({"name": "one", "input": {"kind": "tensor", "shape": [4], "classes": 3},
                                                  "layers": [{"type": "dense", "units": 3}]}))
    (bwd,) = decompose(net.resolved, 2, "train").layers[0].backward
    assert bwd.kernel.key == "dense_bwd batch=2 positions=1 inputs=4 units=3 bias=1 input_grad=0 float32"
    seconds, sources, missing = op_time(bwd, "fw", prof, {}, True, False, fits)
    weight = bwd.parts[0].kernel
    assert weight.key == "matmul m=4 n=3 k=2 float32"
    assert seconds == pytest.approx(fits["matmul float32"].seconds(weight.flops / 1e9) + 24e-9)
    assert sources == {"class": pytest.approx(seconds - 24e-9), "ceilings": pytest.approx(24e-9)}
    assert bwd.kernel.key in missing


def test_a_prediction_splits_its_time_by_source():
    from dlbench.definitions.loader import load_network
    from pathlib import Path

    net = load_network(Path(__file__).resolve().parents[2] / "suites" / "networks" / "fcn5.yaml")
    work = decompose(net.resolved, 16, "train")
    kernels = {op.kernel.key: op.kernel for layer in work.layers for op in layer.forward if op.kernel is not None}
    first = next(k for k in kernels.values() if k.kind == "matmul")  # 16 x 2048 x 784
    assert efficiency_class(first) == "matmul float32"
    prof = profile(class_probes={"fw": [probe(first, 0.01)]},
                   kernels={"fw": {KernelSpec.of("softmax_xent_fwd", rows=16, classes=10).key:
                                   KernelTime(median_s=1e-4, run_id="r", cache="cold")}})
    p = predict(work, "fw", prof, facts=EAGER)
    shares = p.source_shares
    assert set(shares) == {"shape", "class", "ceilings"} and sum(shares.values()) == pytest.approx(1.0)
    seconds = {s: sum(layer.sources.get(s, 0.0) for layer in p.layers) for s in shares}
    assert seconds["shape"] == pytest.approx(1e-4 - 2e-6)  # less what the flush added to its call
    assert sum(seconds.values()) == pytest.approx(p.forward_s + p.backward_s + p.update_s)
    assert p.to_record()["sources"] == shares and p.measured_share == pytest.approx(shares["shape"])
    # the framework's measured element-wise bandwidth counts as a class rate for work that is no kernel
    with_relu = prof.model_copy(update={"elementwise_bandwidth": {"fw": [BandwidthPoint(bytes=1000, bytes_per_s=2e9,
                                                                                        framework="fw")]}})
    assert predict(work, "fw", with_relu, facts=EAGER).source_shares["class"] > shares["class"]
    # without probes the note says what calibrate would add
    bare = predict(work, "fw", profile(), facts=EAGER)
    assert set(bare.source_shares) == {"ceilings"} and any("no kernel times or class probes" in n for n in bare.notes)


def test_a_datasheet_prediction_is_all_datasheet():
    from dlbench.definitions.catalog import SuiteCatalog
    from dlbench.definitions.loader import load_network
    from dlbench.performance.datasheet import DatasheetMachines
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "suites"
    sheet = DatasheetMachines(SuiteCatalog(root).machines_dir).profile("h200", ["fw"])
    net = load_network(root / "networks" / "fcn5.yaml")
    p = predict(decompose(net.resolved, 64, "train"), "fw", sheet, facts=EAGER)
    assert p.source_shares == {"datasheet": pytest.approx(1.0)}


def test_class_probes_from_kernel_records():
    from types import SimpleNamespace as NS

    spec = mm(16, 1024, 512)
    ok = NS(kernels=[NS(spec=spec.to_dict(), status="ok", median_s=0.05),
                     NS(spec=mm(1, 1, 1).to_dict(), status="failed", median_s=None)],
            status="ok", device="cpu", policy={"cache": "cold"}, framework={"name": "fw"}, run_id="r1")
    failed = NS(kernels=[], status="failed", device="cpu", policy={}, framework={"name": "other"}, run_id="r2")
    probes = class_probes([ok, failed])
    assert list(probes) == ["fw"] and [(p.median_s, p.cache, p.run_id) for p in probes["fw"]] == [(0.05, "cold", "r1")]


# --------------------------------------------------------------------------- held to account


def test_accuracy_sets_the_datasheet_beside_the_calibrated_prediction():
    """A CUDA run on a board named as h200.yaml's gpu_names: predicted again from the sheet, its error
    beside the stored prediction's; a CPU run is not matched."""
    from types import SimpleNamespace as NS
    from pathlib import Path

    from dlbench.definitions.catalog import SuiteCatalog
    from dlbench.definitions.loader import load_network
    from dlbench.performance.datasheet import DatasheetMachines

    root = Path(__file__).resolve().parents[2] / "suites"
    machines = DatasheetMachines(SuiteCatalog(root).machines_dir)
    match = datasheet_matcher({n: machines.sheet(n).gpu_names for n in machines.names()})
    assert match({"gpus": [{"name": "nvidia h200 "}]}) == "h200" and match({"gpus": []}) is None
    assert match({"gpus": [{"name": "NVIDIA GeForce RTX 4090"}]}) is None
    net = load_network(root / "networks" / "fcn5.yaml")
    sheet = machines.profile("h200", ["torch"])
    on_sheet = predict(decompose(net.resolved, 1024, "train"), "torch", sheet).iteration_s

    def record(run_id, device, gpu, measured, predicted, sources):
        return NS(run_id=run_id, status="ok", suite="fcn", benchmark="fcn5-train", framework={"name": "torch"},
                  summary=NS(median_s=measured), distributed=None, network=NS(definition=net.resolved),
                  workload=NS(mode="train", batch_size=1024, precision="fp32", device=device),
                  machine={"gpus": [{"name": gpu}]} if gpu else {},
                  settings=NS(threads_requested=None), repeats=[],
                  started_at=datetime(2026, 12, 3, 6, 0, tzinfo=timezone.utc),
                  prediction=NS(iteration_s=predicted, profile="abc@1", sources=sources))

    records = [record("a", "cuda", "NVIDIA H200", 2 * on_sheet, 2.2 * on_sheet, {"shape": 0.6, "class": 0.4}),
               record("b", "cpu", None, 1.0, 0.5, {"class": 1.0})]
    rows = prediction_errors(records, datasheets={"h200": sheet}, match_datasheet=match)
    a, b = rows
    assert a["error"] == pytest.approx(0.1) and a["datasheet"] == "datasheet:h200"
    assert a["datasheet_predicted_s"] == pytest.approx(on_sheet) and a["datasheet_error"] == pytest.approx(-0.5)
    assert "datasheet" not in b and b["error"] == pytest.approx(-0.5)
    groups = {(g["suite"], g["framework"]): g for g in accuracy_table_rows(rows)}
    g = groups[("fcn", "torch")]
    assert g["datasheet_predicted"] == 1 and g["datasheet_median_abs_error"] == pytest.approx(0.5)
    assert g["median_abs_error"] == pytest.approx(0.3)  # median of 10% and 50%
    assert g["sources"] == {"shape": pytest.approx(0.3), "class": pytest.approx(0.7)}


def test_probe_candidates_are_the_single_process_suites_layer_shapes():
    """What --full times and what the probes are chosen from: the kernels suite's layer_shapes
    benchmarks of fcn, cnn, rnn, transformer and llm (not the distributed suite's per-worker batches, timed
    with --threads 1), in the dtypes the device computes in."""
    from pathlib import Path

    from dlbench.definitions.catalog import SuiteCatalog
    from dlbench.performance.kernel_suite import load_kernel_suite
    from dlbench.performance.probes import candidates, layer_benchmarks, layer_sets

    root = Path(__file__).resolve().parents[2] / "suites"
    catalog = SuiteCatalog(root)
    names = layer_benchmarks(root / "kernels.yaml", catalog.suite_names())
    assert set(names) == {"fcn-layers", "cnn-layers", "rnn-layers", "transformer-layers", "llm-layers",
                          "fcn-layers-reduced", "cnn-layers-reduced", "rnn-layers-reduced", "transformer-layers-reduced"}
    suite = load_kernel_suite(root / "kernels.yaml", catalog, "smoke", "cpu")
    float32_only = candidates(suite, names, {"float32": None, "bfloat16": "no", "float16": "no"})
    assert float32_only and {s.dtype for s in float32_only} == {"float32"}
    assert not any(s.kind in ("copy", "transpose") for s in float32_only)
    keys = {s.key for b in suite.benchmarks if b.name in names for s in b.specs}
    assert {s.key for s in float32_only} == keys
    # calibrate --full's layer sets (the default profile's): all, or some suites' in some precisions
    suite = load_kernel_suite(root / "kernels.yaml", catalog, "default", "cpu")
    assert [b.name for b in layer_sets(suite, names)] == list(names)
    fcn32 = layer_sets(suite, names, ["fcn", "rnn"], ["float32"])
    assert [b.name for b in fcn32] == ["fcn-layers", "rnn-layers"] and {s.dtype for b in fcn32 for s in b.specs} == {"float32"}
    reduced = layer_sets(suite, names, ["cnn"], ["bfloat16"])
    assert [b.name for b in reduced] == ["cnn-layers-reduced"] and {s.dtype for s in reduced[0].specs} == {"bfloat16"}
    with pytest.raises(ValueError, match="nope: the kernels suite times the layers of cnn, fcn, llm, rnn, transformer"):
        layer_sets(suite, names, ["nope"])
