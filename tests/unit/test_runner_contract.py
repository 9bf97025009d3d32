"""The runner contract in code (runners/common/contract.py) and the shape of every runner folder,
checked without any framework: the runners' modules are parsed (ast), never imported, and only the
standard-library modules of runners/common are imported.

Per runner folder (every folder of runners/ with a runner.toml):
- no module imports a private name (`_x`) of another file, or reaches one as `module._x`;
- the folder's modules import each other without a cycle (imports inside functions count);
- the same module names as every other runner (STANDARD_MODULES; which may import which is the
  import-linter contract "a runner's modules import only downward", tests/unit/test_layers.py);
- layers.py holds the network's building blocks: a module-level LAYERS table with an entry for
  every layer type of the schema;
- the classes that worker.py and distributed_worker.py hand the harnesses have every member the
  `Runner` and `DistributedRunner` protocols require, with a compatible number of arguments.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNNERS = ROOT / "runners"
COMMON = RUNNERS / "common"
FAKE = ROOT / "tests" / "fixtures" / "runners" / "fake"
ENTRY_POINTS = ("worker.py", "distributed_worker.py")

from runners.common import contract  # noqa: E402
from runners.common import protocol  # noqa: E402


def runner_folders() -> list[Path]:
    return sorted(p.parent for p in RUNNERS.glob("*/runner.toml"))


def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def modules(folder: Path) -> dict[str, ast.Module]:
    return {p.stem: parse(p) for p in sorted(folder.glob("*.py")) if p.name != "__init__.py"}


def local_name(module: str, names: list[str] | None) -> list[tuple[str, list[str] | None]]:
    """`runners.<pkg>.<mod>` is the runner module `<mod>` (by its package name, as they import each
    other); `from runners.<pkg> import a, b` imports the modules a and b."""
    parts = module.split(".")
    if parts[0] != "runners" or len(parts) < 2:
        return [(module, names)]
    if len(parts) == 2:
        return [(n, None) for n in names or []]
    return [(".".join(parts[2:]), names)]


def imports(tree: ast.AST):
    """(module, [imported names] or None for `import module`, line) of every import, at any depth;
    a runner module by its own name (local_name)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                for module, names in local_name(alias.name, None):
                    yield module, names, node.lineno
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for module, names in local_name(node.module, [a.name for a in node.names]):
                yield module, names, node.lineno


def module_aliases(tree: ast.AST) -> dict[str, str]:
    """local name -> module, for every `import module [as name]` and `from runners.<pkg> import module [as name]`."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                out[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.count(".") == 1 \
                and node.module.startswith("runners."):
            for alias in node.names:
                out[alias.asname or alias.name] = alias.name
    return out


FOLDERS = runner_folders()
IDS = [f.name for f in FOLDERS]


def test_the_runner_folders_are_found():
    assert {"torch", "tensorflow", "jax", "mxnet"} <= set(IDS)


# ------------------------------------------------------------------ imports: private names, cycles


@pytest.mark.parametrize("folder", FOLDERS + [COMMON, FAKE], ids=IDS + ["common", "fake"])
def test_no_module_reaches_another_files_private_names(folder):
    local = {p.stem for p in folder.glob("*.py")} | {p.stem for p in COMMON.glob("*.py")}
    offenders = []
    for name, tree in modules(folder).items():
        for module, names, line in imports(tree):
            if module in local and module != name:
                offenders += [f"{name}.py:{line}: from {module} import {n}" for n in names or [] if n.startswith("_")]
        aliases = {k: v for k, v in module_aliases(tree).items() if v in local and v != name}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and node.attr.startswith("_")):
                offenders.append(f"{name}.py:{node.lineno}: {node.value.id}.{node.attr}")
    assert offenders == []


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(n):
        state[n] = 1
        path.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return path[path.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        path.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def import_graph(folder: Path) -> dict[str, set[str]]:
    mods = modules(folder)
    return {name: {m for m, _, _ in imports(tree) if m in mods and m != name} for name, tree in mods.items()}


@pytest.mark.parametrize("folder", FOLDERS + [COMMON], ids=IDS + ["common"])
def test_a_runners_modules_import_each_other_without_a_cycle(folder):
    assert find_cycle(import_graph(folder)) is None


def test_the_cycle_check_finds_a_lazy_cycle():
    assert find_cycle({"a_runner": {"a_kernels"}, "a_kernels": {"a_runner"}}) == ["a_kernels", "a_runner", "a_kernels"]
    assert find_cycle({"a_runner": {"a_network", "a_kernels"}, "a_kernels": {"a_network"}, "a_network": set()}) is None


def test_runners_common_is_standard_library_at_import():
    """Module-level imports of runners/common are the standard library's or its own (numpy only
    inside the functions that need it: it is in every runner's environment, not in the contract)."""
    own = {p.stem for p in COMMON.glob("*.py")}
    offenders = []
    for name, tree in modules(COMMON).items():
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for module, _, line in imports(node):
                    top = module.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in own and top != "__future__":
                        offenders.append(f"{name}.py:{line}: {module}")
    assert offenders == []


# ------------------------------------------------------------------ the network module and its table


def schema_layer_types() -> set[str]:
    """Every `type: Literal[...]` of a layer class in dlbench's network schema."""
    candidates = [ROOT / "src" / "dlbench" / "definitions" / "schema.py"] + sorted((ROOT / "src").rglob("schema.py"))
    path = next(p for p in candidates if p.exists())
    types = set()
    for node in ast.walk(parse(path)):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "type"
                and isinstance(node.annotation, ast.Subscript) and getattr(node.annotation.value, "id", "") == "Literal"):
            elts = node.annotation.slice.elts if isinstance(node.annotation.slice, ast.Tuple) else [node.annotation.slice]
            types |= {e.value for e in elts if isinstance(e, ast.Constant)}
    return types


def layer_tables(folder: Path) -> dict[str, set[str]]:
    """module -> the layer types of its module-level `LAYERS = LayerTable("<runner>", {...})`."""
    out = {}
    for name, tree in modules(folder).items():
        for node in tree.body:
            if (isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "LAYERS" for t in node.targets)
                    and isinstance(node.value, ast.Call) and getattr(node.value.func, "id", None) == "LayerTable"):
                runner, table = node.value.args
                assert runner.value == folder.name, f"{name}.py: LayerTable({runner.value!r}, ...) in {folder.name}/"
                out[name] = {k.value for k in table.keys if isinstance(k, ast.Constant)}
    return out


def test_the_schema_has_layer_types():
    assert {"dense", "conv2d", "lstm", "residual", "relu", "sigmoid", "tanh"} <= schema_layer_types()


@pytest.mark.parametrize("folder", FOLDERS, ids=IDS)
def test_one_module_builds_the_network_from_a_table_of_every_layer_type(folder):
    tables = layer_tables(folder)
    assert len(tables) == 1, f"{folder.name}: expected one module with a LAYERS table, found {sorted(tables)}"
    (network_module, types), = tables.items()
    missing = schema_layer_types() - types
    assert missing == set(), f"{network_module}.py has no builder for these layer types"


# Every runner's modules, by the same names (docs/extending.md, "Add a framework runner"): a
# reader who knows one runner finds the same thing at the same place in the others.
STANDARD_MODULES = {"worker", "distributed_worker", "distributed", "runner", "kernels", "generate", "convergence",
                    "step", "weights", "attention", "layers", "transformer", "precision", "framework"}


@pytest.mark.parametrize("folder", FOLDERS, ids=IDS)
def test_every_runner_has_the_same_module_names_and_its_table_in_layers(folder):
    assert set(modules(folder)) == STANDARD_MODULES
    assert list(layer_tables(folder)) == ["layers"]
    assert (folder / "__init__.py").is_file()  # a package: imported by name, as the worker does


@pytest.mark.parametrize("folder", FOLDERS, ids=IDS)
def test_the_network_module_imports_without_its_framework_and_refuses_an_unknown_layer_type(folder):
    """In a fresh interpreter without the framework: the table's lookup (`LAYERS.builder`) gives the
    builder of a known type and raises a Skip naming an unknown one; nothing is imported that
    the runner's thread configuration must precede."""
    (network_module,) = layer_tables(folder)
    code = (f"import sys; sys.path[:0] = [{str(ROOT)!r}]; from runners.{folder.name} import {network_module} as m\n"
            "assert callable(m.LAYERS.builder('dense'))\n"
            "from runners.common.protocol import Skip\n"
            "try:\n    m.LAYERS.builder('hexagonal_conv')\nexcept Skip as e:\n    print(e)\n"
            "print(sorted(k for k in sys.modules if k.split('.')[0] in "
            "{'torch', 'tensorflow', 'keras', 'jax', 'flax', 'optax', 'mxnet', 'numpy'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    message, loaded = out.stdout.strip().splitlines()
    assert "no builder for layer type 'hexagonal_conv'" in message and folder.name in message
    assert loaded == "[]"


# ------------------------------------------------------------------ the runner objects against the protocols


def entry_class(folder: Path, entry: str, harness: str) -> tuple[str, str] | None:
    """(module, class) that `entry` hands to `<harness>.main(Class())`."""
    path = folder / entry
    if not path.exists():
        return None
    tree = parse(path)
    origin = {n: m for m, names, _ in imports(tree) for n in names or []}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "main"
                and getattr(node.func.value, "id", None) == harness and node.args
                and isinstance(node.args[0], ast.Call) and isinstance(node.args[0].func, ast.Name)):
            cls = node.args[0].func.id
            return (origin.get(cls) or path.stem), cls
    raise AssertionError(f"{path}: no {harness}.main(<Runner>()) call")


def class_members(folder: Path, module: str, cls: str) -> dict[str, ast.AST | None]:
    """name -> FunctionDef (or None for a data attribute) of a class and its bases in the folder."""
    tree = parse(folder / f"{module}.py")
    origin = {n: m for m, names, _ in imports(tree) for n in names or []}
    node = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls), None)
    assert node is not None, f"{module}.py defines no class {cls}"
    members: dict[str, ast.AST | None] = {}
    for base in node.bases:  # bases first: the class's own members override theirs
        if isinstance(base, ast.Name):
            where = origin.get(base.id, module)
            if (folder / f"{where}.py").exists():
                members.update(class_members(folder, where, base.id))
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            members[item.name] = item
        elif isinstance(item, ast.Assign):
            members.update({t.id: None for t in item.targets if isinstance(t, ast.Name)})
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            members[item.target.id] = None
    return members


def arity(fn) -> tuple[int, int | None]:
    """(required, most) positional arguments after self; most None with *args."""
    args = fn.args
    positional = [*args.posonlyargs, *args.args][1:]
    required = len(positional) - len(args.defaults)
    return required, None if args.vararg else len(positional)


def protocol_arity(protocol_cls, name: str) -> int:
    fn = next(getattr(c, name) for c in protocol_cls.__mro__ if name in vars(c))
    return fn.__code__.co_argcount - 1


def mismatches(folder: Path, module: str, cls: str, protocol_cls, optional=None) -> list[str]:
    """What `cls` lacks of `protocol_cls`, and the members of it and of `optional` (present or not)
    whose arguments do not fit."""
    members = class_members(folder, module, cls)
    out = []
    wanted = [(name, protocol_cls) for name in sorted(contract.members(protocol_cls))]
    wanted += [(name, optional) for name in sorted(contract.members(optional)) if name in members] if optional else []
    for name, protocol_cls in wanted:
        if name not in members:
            out.append(f"{cls} has no {name}")
            continue
        fn = members[name]
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            want = protocol_arity(protocol_cls, name)
            required, most = arity(fn)
            if required > want or (most is not None and most < want):
                out.append(f"{cls}.{name} takes {required}..{most} arguments, the contract passes {want}")
    return out


def runner_classes():
    for folder in FOLDERS + [FAKE]:
        for entry, harness, protocol_cls, optional in (
                ("worker.py", "harness", contract.Runner, None),
                ("distributed_worker.py", "distributed_harness", contract.DistributedRunner, contract.CollectiveLimits)):
            found = entry_class(folder, entry, harness)
            if found:
                yield pytest.param(folder, *found, protocol_cls, optional, id=f"{folder.name}-{found[1]}")


@pytest.mark.parametrize(("folder", "module", "cls", "protocol_cls", "optional"), list(runner_classes()))
def test_the_runner_classes_have_what_the_contract_requires(folder, module, cls, protocol_cls, optional):
    assert mismatches(folder, module, cls, protocol_cls, optional) == []


def test_every_runner_has_both_entry_points():
    for folder in FOLDERS:
        assert entry_class(folder, "worker.py", "harness") is not None
        assert entry_class(folder, "distributed_worker.py", "distributed_harness") is not None


def test_the_check_sees_a_missing_member(tmp_path):
    (tmp_path / "x_runner.py").write_text("class Base:\n    name = 'x'\n    def configure_threads(self, n): ...\n"
                                          "class XRunner(Base):\n    def prepare(self): ...\n")
    found = mismatches(tmp_path, "x_runner", "XRunner", contract.Runner)
    assert "XRunner has no framework_info" in found
    assert "XRunner.prepare takes 0..0 arguments, the contract passes 1" in found
    assert not any("configure_threads" in m or "has no name" in m for m in found)
    (tmp_path / "y_runner.py").write_text("class YRunner:\n    def collective_unavailable(self): ...\n")
    found = mismatches(tmp_path, "y_runner", "YRunner", contract.DistributedRunner, contract.CollectiveLimits)
    assert "YRunner.collective_unavailable takes 0..0 arguments, the contract passes 1" in found
    assert not any("collective_size_unavailable" in m for m in found)


def test_the_protocols_members():
    assert contract.members(contract.Runner) == {"name", "configure_threads", "framework_info", "device_available",
                                                 "prepare", "prepare_kernel", "prepare_generation"}
    assert contract.members(contract.DistributedRunner) == {
        "name", "configure_threads", "framework_info", "device_available", "join", "barrier", "leave",
        "prepare_data_parallel", "collective"}
    assert contract.members(contract.Collective) == {"load", "run", "synchronize", "result"}
    assert contract.members(contract.CollectiveLimits) == {"collective_unavailable", "collective_size_unavailable"}


# ------------------------------------------------------------------ the base classes and the protocol version


def test_prepared_holds_the_runners_callables_and_synchronises_around_weights():
    calls = []
    prepared = contract.Prepared(lambda: calls.append("step"), lambda: calls.append("sync"), 7, [10], {"a": 1},
                                 export_weights=lambda: calls.append("export") or {"w": 1},
                                 load_weights=lambda arrays: calls.append(("load", arrays)),
                                 reset_optimizer=lambda: calls.append("reset"),
                                 forward_loss=lambda: ("logits", 0.5))
    prepared.step()
    assert prepared.export_weights() == {"w": 1}
    prepared.load_weights({"w": 2})
    assert prepared.forward_loss() == ("logits", 0.5)
    assert calls == ["step", "sync", "export", "sync", ("load", {"w": 2}), "reset"]
    assert (prepared.params, prepared.output_shape, prepared.settings) == (7, [10], {"a": 1})
    assert isinstance(prepared, contract.Prepared)


def test_a_prepared_without_the_check_side_says_so():
    prepared = contract.Prepared(lambda: None, lambda: None, 1, [1], {})
    with pytest.raises(NotImplementedError, match="export_weights"):
        prepared.export_weights()


def test_a_layer_table_skips_an_unknown_type_naming_it_and_what_it_builds():
    """A valid description a runner cannot build yet is skipped, not failed: another runner may build it."""
    table = contract.LayerTable("x", {"dense": contract.Layer(len, weights=sorted), "conv2d": contract.Layer(abs)})
    assert table.builder("dense") is len and table.weights("dense") is sorted and table.weights("conv2d") is None
    with pytest.raises(protocol.Skip, match=r"x runner: no builder for layer type 'lstm' \(it builds conv2d, dense\)"):
        table.builder("lstm")


def test_a_layer_table_holds_layers_not_bare_builders():
    """A type's builder and its weights stand in one entry: a bare function is refused, naming the type."""
    with pytest.raises(TypeError, match=r"x runner's layer table: conv2d not a Layer\(build, weights\)"):
        contract.LayerTable("x", {"dense": contract.Layer(len), "conv2d": abs})


def test_kernel_and_data_parallel_keep_the_callables_themselves():
    def step():
        pass

    kernel = contract.Kernel(step, step, None)
    assert kernel.step is step and kernel.settings == {} and kernel.includes_forward is False
    dp = contract.DataParallel(step, None, step, 3, [2], {}, 12)
    assert dp.step is step and dp.step_without_sync is None and dp.grad_bytes == 12


def constant(path: Path, name: str) -> list:
    return [node.value.value for node in parse(path).body
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets)
            and isinstance(node.value, ast.Constant)]


def test_one_protocol_version_everywhere():
    from runners.common import distributed_harness
    from runners.common import harness

    assert harness.PROTOCOL_VERSION == distributed_harness.PROTOCOL_VERSION == protocol.PROTOCOL_VERSION
    controller = {str(p.relative_to(ROOT)): v for p in sorted((ROOT / "src").rglob("*.py"))
                  for v in constant(p, "PROTOCOL_VERSION")}
    assert controller, "the controller defines no PROTOCOL_VERSION"
    assert set(controller.values()) == {protocol.PROTOCOL_VERSION}, controller


def test_the_runners_read_a_pooling_kernels_operation_from_the_controllers_table():
    from dlbench.performance.kernels import POOL_OPS, KernelSpec

    assert contract.POOL_OPS == POOL_OPS
    for index, name in enumerate(POOL_OPS):
        spec = KernelSpec.of("pool2d_fwd", batch=1, channels=1, height=4, width=4, kh=2, kw=2, sh=2, sw=2, ph=0, pw=0,
                             op=index)
        assert contract.pool_op(spec.to_dict()["shape"]) == spec.pool_op == name


def test_protocol_writes_atomically_and_classifies(tmp_path):
    target = tmp_path / "result.json"
    protocol.write_atomically(str(target), {"status": "ok"})
    assert target.read_text() == '{"status": "ok"}' and not (tmp_path / "result.json.partial").exists()
    assert protocol.classify(MemoryError("x")) == "out of memory: MemoryError: x"
    assert protocol.classify(RuntimeError("CUDA out of memory")).startswith("out of memory: ")
    assert protocol.classify(ValueError("bad")) == "ValueError: bad"
    (tmp_path / "request.json").write_text('{"protocol": 999}')
    request, why = protocol.read_request(str(tmp_path / "request.json"))
    assert request is None and "protocol 999 not understood" in why
