"""TensorFlow as a multi-worker runner: tf.distribute.MultiWorkerMirroredStrategy and TF's
collective ops. The contract is in runners/common/distributed_harness.py.

dlbench starts every rank itself (runner.toml: launch = "ranks"); TensorFlow has no launcher of its
own. A rank builds TF_CONFIG from DLBENCH_WORKER_ADDRESSES (a free port per rank, chosen by the
controller) and its RANK, then creates the strategy, which starts this task's gRPC server and joins
the cluster (the coordination service led by worker 0, the collective leader worker 0).

Communication: the strategy's CommunicationOptions, recorded as the job's backend. RING (TF's
ring all-reduce and all-gather between the workers' gRPC servers) on CPU, NCCL on GPU (one GPU per
local rank); a collective that waits longer than COLLECTIVE_TIMEOUT_S fails instead of hanging.

Data-parallel step (the custom training loop TF documents for this strategy): inside
`strategy.run`, forward, the loss averaged over the global batch, the gradients, and the Keras SGD
`apply_gradients`, which all-reduces them (sum) through the strategy's cross-device ops
(CollectiveAllReduce: with bytes_per_pack 0, TF's default, every gradient is concatenated into one
pack and reduced by one collective) before the update. Batch-norm running statistics stay local to
each worker (the strategy does not synchronise them).

Gradient compression (the request's `compression`): TF's CommunicationOptions offer none, so the
optimizer's `_all_reduce_sum_gradients` runs the runner's GradientExchange instead of its dense
all-reduce (fp16/bf16 casts all-reduced, PowerSGD's two all-reduces, an all-gather of top-k pairs,
each with its error feedback in this worker's own variables); gTop-k is skipped (GTOPK_UNAVAILABLE).

Expert parallelism (the request's `parallelism` expert, `prepare_expert_parallel`): the experts of
every Mixture-of-Experts block sharded over the workers as plain variables of each rank's, the
tokens dispatched and combined by CollectiveAllToAllV2 in tf.custom_gradient (backward: the inverse
all-to-all), every other weight mirrored as here; its section below says how.

Exposed communication: `step_without_sync` is the same compiled step with the exchange left out
(Keras' `_all_reduce_sum_gradients`, the one place its TF optimizer all-reduces, returns the local
gradients; the traced graphs are checked to hold one gradient collective per step and none
respectively). With one pack the all-reduce starts after the whole backward pass, so under TF's
defaults the exchange is not hidden at all; the difference of the two medians shows it.

Collectives (suite comm): TF's collective ops themselves (CollectiveReduceV2, CollectiveGatherV2,
CollectiveBcastSendV2/RecvV2, CollectiveReduceScatterV2, CollectiveAllToAllV2), the kernels the
strategy's cross-device ops call, in the strategy's collective group with its implementation,
timeout and a fresh instance key per call (as the strategy's own launcher does). Reduce-scatter has
an NCCL implementation only: on CPU it is reported as not offered. All-to-all: the strategy has no
method for it (its cross-device ops reduce, gather and broadcast), but TF 2.21's
CollectiveAllToAllV2 runs in the strategy's group on CPU (TF's own all-to-all over the workers'
gRPC servers) and GPU (NCCL); the buffer goes in as n rows, row j to rank j.
"""

from __future__ import annotations

import json
import os
import sys

from runners.common import contract
from runners.common.protocol import Skip
from runners.tensorflow.framework import load_keras, load_tf, thread_settings
from runners.tensorflow.precision import float32_math, request_precision
from runners.tensorflow.layers import set_batch_norm_floor
from runners.tensorflow.step import (build_network, count_params, describe_flatten, input_kind, loss_function,
                                     lstm_setting, masked_count, output_shape, sample_shape)
from runners.tensorflow.runner import TensorFlowRunner, compile_choice
from runners.tensorflow.transformer import expert_output, transformer_classes

COLLECTIVE_TIMEOUT_S = 300  # as torch's process-group timeout: the rank's own error, not the job's timeout
LEAVE_BARRIER_TIMEOUT_S = 20  # within the 30 s the controller gives a job's processes to exit after their results
# the collective ops a step's gradient exchange may hold (dense and cast: a reduce; PowerSGD: two
# reduces; top-k: a gather)
GRADIENT_COLLECTIVES = ("CollectiveReduceV2", "CollectiveGatherV2")


class DataParallel(contract.DataParallel):
    def __init__(self, step, step_without_sync, synchronize, params, output_shape, settings, grad_bytes,
                 trainable=(), loss=None, all_to_all=None):
        super().__init__(step, step_without_sync, synchronize, params, output_shape, settings, grad_bytes,
                         loss=loss, all_to_all=all_to_all)
        self._trainable = list(trainable)

    def weights(self) -> list:
        """This worker's copy of every trainable tensor (numpy), for tests of the replicas' agreement."""
        return [v.numpy() for v in self._trainable]


class Collective:
    """One collective op of TF's over a fixed send tensor; each run() gives a fresh receive tensor."""

    def __init__(self, runner: "TensorFlowDistributedRunner", op: str, send_count: int, recv_count: int):
        self.runner, self.op = runner, op
        self.send_count, self.recv_count = send_count, recv_count
        self.send = None
        self.out = None
        self._fn = runner._collective_function(op, recv_count)

    def load(self, array) -> None:
        tf = load_tf()
        with tf.device(self.runner.device):
            self.send = tf.identity(tf.constant(array))

    def run(self) -> None:
        self.out = self._fn(self.send, self.runner._instance_key())

    def synchronize(self) -> None:
        self.runner._synchronize()

    def result(self):
        return self.out.numpy()


def _optimizer_class():
    """Keras SGD whose gradient exchange can be left out when a step is traced (step_without_sync).

    Keras 3's TensorFlow optimizer all-reduces in `_all_reduce_sum_gradients` (called from
    `_backend_update_step` under a replica context); None when this Keras has no such method,
    in which case the exposed communication is not measured."""
    keras = load_keras()
    base = keras.optimizers.SGD
    if not callable(getattr(base, "_all_reduce_sum_gradients", None)):
        return None

    class SGDWithOptionalExchange(base):
        exchange = True  # read while a step is traced, so each traced step keeps its choice
        compressed = None  # a GradientExchange: the request's compression in place of the dense all-reduce

        def _all_reduce_sum_gradients(self, grads_and_vars):
            if not self.exchange:
                return list(grads_and_vars)
            if self.compressed is None:
                return super()._all_reduce_sum_gradients(grads_and_vars)
            grads_and_vars = list(grads_and_vars)
            missing = [v.name for g, v in grads_and_vars if g is None]
            if missing:  # every trainable tensor of a benchmark network has a gradient
                raise RuntimeError(f"no gradient for {', '.join(missing)}: the compressed exchange sends every one")
            summed = self.compressed.exchange([g for g, _ in grads_and_vars])
            return list(zip(summed, [v for _, v in grads_and_vars]))

    return SGDWithOptionalExchange


LOSS_SETTING = {
    "masked": "masked_lm_and_next_sentence (the masked-LM and next-sentence means of the worker's batch) / workers",
    "tokens_or_classes": "sparse_softmax_cross_entropy_with_logits, the worker's mean / workers (the global batch's "
                         "mean once the gradients are summed)",
}


# the `compile` setting's framework of both training steps (data and expert parallelism)
STEP_FRAMEWORK = "tf.function(jit_compile=False) around strategy.run (no XLA)"


def gradient_bytes(variables) -> int:
    """The bytes of these variables' gradients (one gradient per variable, of its dtype)."""
    import numpy as np

    return int(sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in variables))


def _worker_loss(masked_loss, y, outputs):
    """The network's loss on this worker's batch: its mean (the masked-LM and next-sentence means
    summed for a masked_tokens network)."""
    tf = load_tf()
    if masked_loss is not None:
        return masked_loss(y, outputs)
    per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.reshape(y, [-1]), logits=tf.reshape(outputs, [-1, outputs.shape[-1]]))
    return tf.reduce_sum(per_example) / tf.cast(tf.size(per_example), tf.float32)


def tf_config(cluster) -> dict:
    """TF_CONFIG of this rank: every worker's host:port (rank order) and this rank's task."""
    if len(cluster.worker_addresses) != cluster.world_size:
        raise RuntimeError(f"DLBENCH_WORKER_ADDRESSES names {len(cluster.worker_addresses)} workers, "
                           f"WORLD_SIZE is {cluster.world_size}: TF_CONFIG needs every worker's address")
    return {"cluster": {"worker": list(cluster.worker_addresses)}, "task": {"type": "worker", "index": cluster.rank}}


def _count_collectives(concrete_function) -> dict[str, int]:
    """The gradient-exchange collectives of a traced step, by op type (those it holds)."""
    counts = {op: _count_ops(concrete_function, op) for op in GRADIENT_COLLECTIVES}
    return {op: c for op, c in counts.items() if c}


def _describe_ops(counts: dict[str, int]) -> str:
    return ", ".join(f"{c} {op}" for op, c in counts.items())


def _count_ops(concrete_function, op_type: str) -> int:
    """Ops of a type in a traced function, its nested function bodies included."""
    graph = concrete_function.graph
    count = sum(1 for op in graph.get_operations() if op.type == op_type)
    library = graph.as_graph_def().library
    count += sum(1 for fn in library.function for node in fn.node_def if node.op == op_type)
    return count


class TensorFlowDistributedRunner(TensorFlowRunner):
    def __init__(self):
        self.strategy = None
        self.device = None  # this worker's device, "/job:worker/replica:0/task:R/device:CPU:0"
        self.cluster = None
        self.implementation = None
        self._barrier_fn = None

    # ------------------------------------------------------------------ the job

    def join(self, cluster) -> dict:
        tf = load_tf()
        self.cluster = cluster
        os.environ["TF_CONFIG"] = json.dumps(tf_config(cluster))  # read by the strategy's cluster resolver
        implementations = tf.distribute.experimental.CommunicationImplementation
        if cluster.device == "cuda":
            gpus = tf.config.list_physical_devices("GPU")
            # one GPU per local rank; the strategy then has one local replica on it
            tf.config.set_visible_devices(gpus[cluster.local_rank % len(gpus)], "GPU")
            self.implementation = implementations.NCCL
        else:
            self.implementation = implementations.RING
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=self.implementation, timeout_seconds=COLLECTIVE_TIMEOUT_S)
        self.strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
        extended = self.strategy.extended
        (self.device,) = extended.worker_devices
        self._group_key = extended._collective_keys.get_group_key([self.device])
        return {"backend": self.backend(), "rank": cluster.rank, "world_size": self.strategy.num_replicas_in_sync,
                "strategy": type(self.strategy).__name__,
                "cross_device_ops": type(extended._cross_device_ops).__name__,
                "communication_implementation": self.implementation.name,
                "rpc_layer": "grpc", "collective_timeout_s": COLLECTIVE_TIMEOUT_S, "device": self.device,
                "tf_config_workers": list(cluster.worker_addresses)}

    def backend(self) -> str:
        return "nccl" if self.implementation.name == "NCCL" else "ring (gRPC)"

    def barrier(self) -> None:
        """An all-reduce of one float between every worker, waited for (how the strategy itself
        waits for the cluster before it checks the workers' health)."""
        tf = load_tf()
        if self._barrier_fn is None:
            ctx = tf.distribute.get_replica_context
            with tf.device(self.device):
                one = tf.identity(tf.ones([1]))

            @tf.function
            def barrier():
                return self.strategy.run(lambda: ctx().all_reduce(tf.distribute.ReduceOp.SUM, tf.identity(one)))

            self._barrier_fn = barrier
        got = self._barrier_fn().numpy()
        if int(got[0]) != self.cluster.world_size:  # every worker took part
            raise RuntimeError(f"barrier all-reduce gave {got[0]}, expected {self.cluster.world_size}")

    def leave(self) -> None:
        """Wait at the coordination service's barrier, then let the process exit.

        The strategy has no shutdown: each worker's gRPC server lives as long as its process, and
        a ring collective's receiver pulls its data from the sender's server, so a worker that left
        right after the job's last all-reduce could break a peer still pulling from it (worker 0
        also hosts the coordination service). Every worker arrives here only after that all-reduce,
        and after writing its result: a failure here is logged and changes nothing measured."""
        from tensorflow.python.eager import context

        ctx = context.context()
        if ctx.coordination_service is not None:
            try:
                ctx.wait_at_barrier("dlbench-leave", LEAVE_BARRIER_TIMEOUT_S * 1000)
            except Exception as e:  # noqa: BLE001 - the result is written; say why the exit was untidy
                print(f"leaving: the coordination barrier failed after this rank's result was written: "
                      f"{type(e).__name__}: {e}", file=sys.stderr)
        self.strategy = None

    def _synchronize(self) -> None:
        # GPU work is asynchronous: wait for this worker's GPU (tf.test.experimental.sync_devices
        # would visit every worker's devices, which a worker cannot run ops on); on CPU a call
        # returns finished tensors
        if ":GPU:" in self.device.upper():
            tf = load_tf()
            with tf.device(self.device):
                tf.raw_ops.SyncDevice()

    # ------------------------------------------------------------------ data-parallel training

    def prepare_data_parallel(self, request: dict, cluster) -> DataParallel:
        if request.get("parallelism") == contract.Parallelism.EXPERT:  # its own step: "expert parallelism" below
            return prepare_expert_parallel(self, request, cluster)

        tf, keras = load_tf(), load_keras()
        network = request["network"]
        cuda = cluster.device == "cuda"
        asked = request.get("precision", "fp32")
        if asked in contract.PRECISIONS and asked != "fp32":
            raise Skip(f"tensorflow multi-worker runner: precision {asked!r} is not implemented in its "
                       "MultiWorkerMirroredStrategy step (fp32 only)")
        precision = request_precision(request, ("fp32",))  # float64 (the check's) or any other: a ValueError
        compile_mode, _ = compile_choice(request)  # an unknown mode: a ValueError
        if compile_mode != "eager":
            raise Skip(f"tensorflow multi-worker runner: compile {compile_mode!r} is not implemented in its "
                       "MultiWorkerMirroredStrategy step (eager only: a tf.function graph without XLA)")
        math_flags = float32_math(precision)  # TF32 pinned off, read back, as in one process
        strategy = self.strategy
        workers = strategy.num_replicas_in_sync
        keras.utils.set_random_seed(request.get("seed", 0))  # the strategy broadcasts worker 0's initial values anyway
        _, images, has_lstm = input_kind(network)
        bn_floor = set_batch_norm_floor(cuda)
        optimizer_class = _optimizer_class()
        compression = request.get("compression") or contract.Compression(contract.CompressionMethod.NONE)
        if compression.method is contract.CompressionMethod.GTOPK:
            raise Skip(f"tensorflow multi-worker runner: compression {compression}: {GTOPK_UNAVAILABLE}")
        if compression.method is contract.CompressionMethod.TWO_BIT:
            raise Skip(f"tensorflow multi-worker runner: compression {compression}: the strategy exchanges gradients "
                       "by collectives between the workers, and MXNet's 2-bit is a parameter-server exchange")
        if not compression.dense and optimizer_class is None:
            raise Skip(f"tensorflow multi-worker runner: compression {compression}: this Keras optimizer has no "
                       "_all_reduce_sum_gradients, where the runner puts its compressed exchange")
        with strategy.scope():
            model, per_layer, flatten_modes, permuted = build_network(network)
            trainable = model.trainable_variables
            optimizer = (optimizer_class or keras.optimizers.SGD)(
                learning_rate=request["learning_rate"], momentum=request["momentum"])
            optimizer.build(trainable)
        exchange = None
        if not compression.dense and workers > 1:  # one worker exchanges nothing: its baseline is dense
            # outside the scope: each worker's own residuals and factors, not mirrored variables
            exchange = GradientExchange(compression, self, trainable, request.get("seed", 0) + 2)
            optimizer.compressed = exchange
        params = count_params(trainable)
        grad_bytes = gradient_bytes(trainable)

        masked = masked_count(network)
        x, y = self._worker_batch(request, cluster)
        masked_loss, _ = loss_function(network) if masked is not None else (None, None)

        def replica_step():
            with tf.GradientTape() as tape:
                outputs = model(x, training=True)
                # the worker's loss, its mean over its batch (masked: the masked-LM and next-sentence
                # means); divided by the workers, its gradient summed by the all-reduce is the global mean's
                worker_loss = _worker_loss(masked_loss, y, outputs)
                loss = worker_loss / workers
            grads = tape.gradient(loss, trainable)
            optimizer.apply_gradients(zip(grads, trainable))
            return worker_loss

        def traced(exchange: bool):
            """The step as one concrete function, traced with or without the gradient exchange
            (called as such, it is never traced again with the other choice); it returns this
            worker's loss."""
            @tf.function
            def step():
                return strategy.experimental_local_results(strategy.run(replica_step))[0]

            if optimizer_class is not None:
                optimizer.exchange = exchange
            try:
                return step.get_concrete_function()
            finally:
                if optimizer_class is not None:
                    optimizer.exchange = True

        synced = traced(exchange=True)
        collectives = _count_collectives(synced)
        if workers > 1 and not collectives:
            raise RuntimeError(f"the traced data-parallel step holds none of {', '.join(GRADIENT_COLLECTIVES)}: "
                               "gradients would not be exchanged")
        step_without_sync = None
        exposed = "not measured: this Keras optimizer has no _all_reduce_sum_gradients to leave out"
        if optimizer_class is not None:
            local = traced(exchange=False)
            left = _count_collectives(local)
            if left:
                raise RuntimeError(f"the step without the exchange still holds {_describe_ops(left)}")
            step_without_sync = lambda: local()  # noqa: E731
            exposed = ("median step time minus median step time of the same tf.function step traced with Keras' "
                       "gradient all-reduce left out")

        settings = {
            "precision": precision,
            "precision_effective": math_flags,
            "compile": {"mode": "eager", "requested": request.get("compile"), "framework": STEP_FRAMEWORK},
            "data_format": "channels_last" if images else None,
            **self._strategy_settings(),
            "gradient_exchange": ((exchange.describe() if exchange is not None else
                                   "Keras SGD apply_gradients in the replica context: replica_context.all_reduce(SUM) "
                                   "of every gradient")
                                  + f"; the traced step holds {_describe_ops(collectives) or 'no collective'}"
                                  + (" (one worker: the strategy reduces nothing)" if workers == 1 else "")),
            "compression": exchange.settings() if exchange is not None else {"method": str(compression)},
            "exposed_communication": exposed,
            "loss": LOSS_SETTING["masked" if masked is not None else "tokens_or_classes"],
            "optimizer": "keras.optimizers.SGD(momentum)",
            "step": "tf.function around strategy.run",
            "input_transpose": "synthetic inputs made in NHWC" if images else None,
            "flatten": describe_flatten(network["layers"], flatten_modes, permuted),
            "batch_norm_statistics": "local to each worker (not synchronised)",
            "batch_norm_epsilon_floor": bn_floor,
            "lstm": lstm_setting(has_lstm, cuda),
            **thread_settings(),
        }
        logits_shape = output_shape(model)
        seen: dict = {}

        def step():
            seen["loss"] = synced()

        return DataParallel(step, step_without_sync, self._synchronize, params, logits_shape, settings,
                            grad_bytes, trainable, loss=lambda: float(seen["loss"]))

    def _strategy_settings(self) -> dict:
        """The strategy and its communication options, as both training steps' settings record them."""
        options = self.strategy.extended._communication_options
        return {"strategy": "tf.distribute.MultiWorkerMirroredStrategy (TF_CONFIG from DLBENCH_WORKER_ADDRESSES)",
                "communication": {"implementation": self.implementation.name,
                                  "bytes_per_pack": options.bytes_per_pack,
                                  "timeout_seconds": options.timeout_seconds,
                                  "cross_device_ops": type(self.strategy.extended._cross_device_ops).__name__}}

    def _worker_batch(self, request: dict, cluster):
        """This worker's own synthetic batch (as a sharded data set would give it), on its device:
        the same draws for data and expert parallelism."""
        import numpy as np

        tf = load_tf()
        network, batch = request["network"], request["batch_size"]
        inp = network["input"]
        tokens, _, _ = input_kind(network)
        rng = np.random.default_rng(request.get("seed", 0) * 1000 + cluster.rank + 1)
        masked = masked_count(network)
        if masked is not None:  # y: the M masked positions' tokens, then the next-sentence label
            x_np = rng.integers(0, inp["vocabulary"], (batch, inp["sequence_length"]), dtype=np.int64)
            y_np = rng.integers(0, inp["vocabulary"], (batch, masked + 1), dtype=np.int64)
            y_np[:, masked] = rng.integers(0, 2, batch)
        elif tokens:
            shape = (batch, inp["sequence_length"])
            x_np = rng.integers(0, inp["vocabulary"], shape, dtype=np.int64)
            y_np = rng.integers(0, inp["vocabulary"], shape, dtype=np.int64)
        else:
            x_np = rng.standard_normal(sample_shape(network, batch), dtype=np.float32)
            y_np = rng.integers(0, inp["classes"], (batch,), dtype=np.int64)
        with tf.device(self.device):
            return tf.identity(tf.constant(x_np)), tf.identity(tf.constant(y_np))

    # ------------------------------------------------------------------ collectives

    def _collective_options(self) -> dict:
        """The attributes every collective op of the strategy's group takes."""
        return {"group_size": self.cluster.world_size, "group_key": self._group_key,
                "communication_hint": self.implementation.value, "timeout_seconds": float(COLLECTIVE_TIMEOUT_S)}

    def all_to_all(self, rows, instance_key, ordering_token=()):
        """TF's collective all-to-all (CollectiveAllToAllV2) in the strategy's group, on this
        worker's device: rows[j] (the first axis: one entry per worker) goes to rank j, and row j of
        the result came from rank j."""
        tf = load_tf()
        with tf.device(self.device):
            return tf.raw_ops.CollectiveAllToAllV2(input=rows, instance_key=instance_key,
                                                   ordering_token=list(ordering_token), **self._collective_options())

    def collective_unavailable(self, op: str) -> str | None:
        if op == "reduce_scatter" and self.implementation.name != "NCCL":
            return ("TensorFlow offers reduce-scatter (CollectiveReduceScatterV2) with an NCCL implementation only; "
                    f"the {self.implementation.name} implementation used on {self.cluster.device} has none")
        return None

    def _instance_key(self):
        tf = load_tf()
        key = self.strategy.extended._collective_keys.get_instance_key(self._group_key, self.device)
        with tf.device("CPU:0"):
            return tf.constant(key, dtype=tf.int32)

    def _collective_function(self, op: str, recv_count: int):
        tf = load_tf()
        raw = tf.raw_ops
        n, device = self.cluster.world_size, self.device
        common = self._collective_options()
        root = self.cluster.rank == 0

        @tf.function
        def run(send, instance_key):
            with tf.device(device):
                if op == "all_reduce":
                    return raw.CollectiveReduceV2(input=send, instance_key=instance_key, ordering_token=[],
                                                  merge_op="Add", final_op="Id", **common)
                if op == "all_gather":
                    return raw.CollectiveGatherV2(input=send, instance_key=instance_key, ordering_token=[], **common)
                if op == "reduce_scatter":
                    return raw.CollectiveReduceScatterV2(input=send, instance_key=instance_key, ordering_token=[],
                                                         merge_op="Add", final_op="Id", **common)
                if op == "all_to_all":  # t[j] to rank j: the buffer as n rows of count/n
                    return tf.reshape(self.all_to_all(tf.reshape(send, [n, -1]), instance_key), [-1])
                if op == "broadcast":
                    if root:
                        return raw.CollectiveBcastSendV2(input=send, instance_key=instance_key, **common)
                    return raw.CollectiveBcastRecvV2(instance_key=instance_key, shape=[recv_count], T=tf.float32,
                                                     **common)
                raise ValueError(f"unknown collective {op!r}")

        return run

    def collective(self, op: str, send_count: int, recv_count: int) -> Collective:
        return Collective(self, op, send_count, recv_count)


# ------------------------------------------------------------------ gradient compression

# runner.toml's compression_refused says the same; prepare_data_parallel guards a hand-made request
GTOPK_UNAVAILABLE = (
    "TensorFlow's collectives have no point-to-point send, so gTop-k's tree edges would be broadcasts "
    "(CollectiveBcastSendV2/RecvV2) in groups of an edge's two workers; one up the tree and one back down in "
    "the same step timed out here (TF 2.21, RING on CPU: the receiver of the second never got its data, "
    "while either broadcast alone completed), so the runner does not run it")


def _matrix_view(shape) -> tuple[int, int] | None:
    """A kernel as PowerSGD's matrix: (size / last dim, last dim) (a Dense kernel (in, out) as it
    is, a Conv2D kernel (h, w, in, out) as (h w in, out): the same n + m as the canonical
    (out, in, ...) view of performance/communication.py); None for a vector."""
    if len(shape) < 2:
        return None
    m = int(shape[-1])
    return _size(shape) // m, m


def _size(shape) -> int:
    out = 1
    for d in shape:
        out *= int(d)
    return out


class GradientExchange:
    """The request's compression as the data-parallel step's own collectives: what the Keras
    optimizer's `_all_reduce_sum_gradients` does instead of its dense all-reduce (every function
    here runs inside `strategy.run`, one replica per worker, and returns the gradients summed over
    the workers, as the optimizer's all-reduce does). What a method keeps between steps is a
    plain tf.Variable of this worker's (made outside the strategy's scope: not mirrored):
      none          replica_context.all_reduce(SUM) of every gradient (Keras' own call);
      fp16, bf16    the gradients cast, replica_context.all_reduce(SUM) of the casts, cast back;
      powersgd      per kernel viewed as (size / last dim, last dim) whose factors are smaller
                    (n m > (n + m) r): M = gradient + error, P = M Q, all-reduced with every
                    other gradient (vectors and kernels sent whole) in one call, orthonormalised
                    (tf.linalg.qr), Q = M^T P all-reduced, the gradient P Q^T, error
                    M - P Q^T / workers, Q / workers kept for the next step (warm start);
      topk          per gradient, k = ceil(density size) largest |gradient + residual| as (value,
                    index) pairs, every worker's pairs in one replica_context.all_gather (the int32
                    indices bitcast to float32 words), summed into zeros; the residual keeps
                    what this worker did not send.
    gTop-k is not among them (GTOPK_UNAVAILABLE says why)."""

    def __init__(self, compression: contract.Compression, runner: "TensorFlowDistributedRunner", trainable,
                 seed: int):
        import numpy as np

        tf = load_tf()
        self.compression, self.method = compression, compression.method
        self.runner, self.workers, self.rank = runner, runner.cluster.world_size, runner.cluster.rank
        self.shapes = [tuple(int(d) for d in v.shape) for v in trainable]
        method = contract.CompressionMethod
        self.residuals, self.errors, self.qs = [], [], []
        rng = np.random.default_rng(seed)
        with tf.device(runner.device):
            if self.method is method.TOPK:
                self.residuals = [tf.Variable(tf.zeros(s), trainable=False, name=f"residual_{i}")
                                  for i, s in enumerate(self.shapes)]
            elif self.method is method.POWERSGD:
                r = compression.rank
                for i, s in enumerate(self.shapes):
                    view = self._factored(s)
                    if view is None:
                        self.errors.append(None)
                        self.qs.append(None)
                        continue
                    self.errors.append(tf.Variable(tf.zeros(view), trainable=False, name=f"powersgd_error_{i}"))
                    # every worker the same initial Q (the same seed), as torch's hook and the jax runner
                    self.qs.append(tf.Variable(rng.standard_normal((view[1], r)).astype(np.float32),
                                               trainable=False, name=f"powersgd_q_{i}"))
        self.sizes = [_size(s) for s in self.shapes]
        self.offsets = [sum(self.sizes[:i]) for i in range(len(self.sizes))]
        if self.method is method.TOPK:
            self.ks = [contract.topk_count(size, compression.density) for size in self.sizes]

    def _factored(self, shape) -> tuple[int, int] | None:
        view = _matrix_view(shape)
        if view is None:
            return None
        n, m = view
        return view if n * m > (n + m) * self.compression.rank else None

    def describe(self) -> str:
        method = contract.CompressionMethod
        return {
            method.NONE: "Keras SGD apply_gradients in the replica context: replica_context.all_reduce(SUM) of every "
                         "gradient",
            method.FP16: "replica_context.all_reduce(SUM) of the float16 casts of the gradients, cast back to float32",
            method.BF16: "replica_context.all_reduce(SUM) of the bfloat16 casts of the gradients, cast back to float32",
            method.POWERSGD: "PowerSGD: replica_context.all_reduce(SUM) of the P factors with the uncompressed "
                             "gradients, then of the Q factors",
            method.TOPK: "one replica_context.all_gather of every worker's (value, index) pairs, summed",
        }[self.method]

    def settings(self) -> dict:
        method = contract.CompressionMethod
        out: dict = {"method": str(self.compression), "exchange": self.describe()}
        if self.method is method.POWERSGD:
            factored = [s for s in self.shapes if self._factored(s)]
            out.update(rank=self.compression.rank, error_feedback=True, warm_start=True,
                       compressed_when="n m > (n + m) rank, the kernel viewed as (size / last dim, last dim)",
                       compressed_tensors=len(factored), orthogonalisation="tf.linalg.qr")
        elif self.method is method.TOPK:
            out.update(density=self.compression.density, error_feedback=True, selection="per gradient tensor",
                       pairs=sum(self.ks), selection_op="tf.math.top_k")
        return out

    # -- the exchange, traced inside strategy.run

    def exchange(self, grads: list) -> list:
        tf = load_tf()
        method = contract.CompressionMethod
        ctx = tf.distribute.get_replica_context()
        if self.method in (method.FP16, method.BF16):
            dtype = tf.float16 if self.method is method.FP16 else tf.bfloat16
            summed = ctx.all_reduce(tf.distribute.ReduceOp.SUM, [tf.cast(g, dtype) for g in grads])
            return [tf.cast(s, g.dtype) for s, g in zip(summed, grads)]
        if self.method is method.POWERSGD:
            return self._powersgd(ctx, grads)
        if self.method is method.TOPK:
            return self._topk(ctx, grads)
        raise ValueError(f"compression {self.compression} has no exchange in this runner")

    def _powersgd(self, ctx, grads: list) -> list:
        tf = load_tf()
        n = float(self.workers)
        factored = [i for i, q in enumerate(self.qs) if q is not None]
        whole = [i for i, q in enumerate(self.qs) if q is None]
        m = {i: tf.reshape(grads[i], self.errors[i].shape) + self.errors[i] for i in factored}
        # P of every factored kernel and every other gradient as it is: one all-reduce call
        reduced = ctx.all_reduce(tf.distribute.ReduceOp.SUM,
                                 [tf.matmul(m[i], self.qs[i]) for i in factored] + [grads[i] for i in whole])
        out = list(grads)
        for i, g in zip(whole, reduced[len(factored):]):
            out[i] = g
        if not factored:
            return out
        ps = [tf.linalg.qr(p)[0] for p in reduced[:len(factored)]]
        qs = ctx.all_reduce(tf.distribute.ReduceOp.SUM, [tf.matmul(m[i], p, transpose_a=True)
                                                          for i, p in zip(factored, ps)])
        updates = []
        for i, p, q in zip(factored, ps, qs):
            approx = tf.matmul(p, q, transpose_b=True)  # the sum over the workers of their M's projection
            updates.append(self.errors[i].assign(m[i] - approx / n))
            updates.append(self.qs[i].assign(q / n))
            out[i] = tf.reshape(approx, self.shapes[i])
        with tf.control_dependencies(updates):
            return [tf.identity(g) for g in out]

    def _select(self, vector):
        """Each gradient's k largest magnitudes of the flat `vector`: (values, flat int32 indices)."""
        tf = load_tf()
        picked = [tf.math.top_k(tf.abs(vector[o:o + s]), k=k, sorted=False).indices + o
                  for o, s, k in zip(self.offsets, self.sizes, self.ks)]
        indices = tf.concat(picked, 0)
        return tf.gather(vector, indices), indices

    @staticmethod
    def _pack(values, indices):
        tf = load_tf()
        return tf.concat([values, tf.bitcast(indices, tf.float32)], 0)

    def _unpack(self, packet):
        """(values, indices) of packets of K = Σ k pairs each (a gather's result has no static shape)."""
        tf = load_tf()
        k = sum(self.ks)
        return packet[..., :k], tf.bitcast(packet[..., k:2 * k], tf.int32)

    def _scatter(self, values, indices):
        tf = load_tf()
        return tf.math.unsorted_segment_sum(values, indices, sum(self.sizes))

    def _topk(self, ctx, grads: list) -> list:
        tf = load_tf()
        flat = tf.concat([tf.reshape(g + r, [-1]) for g, r in zip(grads, self.residuals)], 0)
        values, indices = self._select(flat)
        gathered = ctx.all_gather(self._pack(values, indices)[None], axis=0)  # (workers, 2K)
        all_values, all_indices = self._unpack(gathered)
        summed = self._scatter(tf.reshape(all_values, [-1]), tf.reshape(all_indices, [-1]))
        residual = tf.tensor_scatter_nd_update(flat, indices[:, None], tf.zeros_like(values))  # what was not sent
        updates = [r.assign(tf.reshape(residual[o:o + s], sh))
                   for r, o, s, sh in zip(self.residuals, self.offsets, self.sizes, self.shapes)]
        with tf.control_dependencies(updates):
            return [tf.reshape(summed[o:o + s], sh) for o, s, sh in zip(self.offsets, self.sizes, self.shapes)]


# ------------------------------------------------------------------ expert parallelism
# TensorFlow expert parallelism (runners/common/contract.py Parallelism.EXPERT): a custom training
# loop around MultiWorkerMirroredStrategy in which the experts of every Mixture-of-Experts block are
# sharded over the workers and every other weight is mirrored, its gradients all-reduced as data
# parallelism's are.
#
# Every rank builds the whole network in the strategy's scope from the same seed, as data parallelism
# does (so the two start from the same weights), then keeps experts rank*E/W ... (rank+1)*E/W - 1 of
# each block as plain tf.Variables of its own, made outside the scope (not mirrored: the strategy
# neither copies nor reduces them), and drops the block's mirrored (E, ...) expert variables from the
# model. A block's forward on a rank's own tokens (transformer.py's MixtureOfExperts routes them, as
# in one process, then calls ExpertShard):
#
# 1. the (token, choice) pairs, each written into the slot of a send buffer of W blocks, block j
#    for rank j (the rank holding the chosen expert), each block C = N x min(k, E/W) rows: the most
#    one rank's N tokens can send another (a token's k choices are distinct experts, at most E/W of
#    them on one rank), so the dispatch is dropless with static shapes, padded to that worst case;
# 2. dispatch: CollectiveAllToAllV2 sends block j to rank j, and an int32 one beside it the local
#    expert id of every row (-1 marking padding);
# 3. every local expert runs on the rows sent to it from every rank (tf.where, tf.gather_nd), its
#    outputs written back to their rows;
# 4. combine: the reverse all-to-all (the same op: block j goes back to rank j), each pair's output
#    weighted and added to its token (tf.tensor_scatter_nd_add), as the single-process block adds it.
#
# The all-to-all of the rows has no gradient registered in TensorFlow, so it is wrapped in
# tf.custom_gradient whose backward is the inverse all-to-all (again block j to rank j): an
# expert's gradient so sums every rank's tokens. Each rank's loss is its batch's mean divided by the
# workers (data parallelism's), so that sum is already data parallelism's average: the experts'
# gradients are applied as the backward gives them, by a Keras SGD of the rank's own (built outside
# the scope, applied after strategy.run on the rank's local results), while the mirrored weights'
# go through the strategy's Keras SGD and its all-reduce. The auxiliary load-balancing loss is each
# rank's own, as under data parallelism.
#
# Every all-to-all takes the strategy's own collective launcher's instance key (a fresh one per
# call, fed when the function runs) and ordering token, so the step's all-to-alls and its gradient
# all-reduce are issued in one order on every worker. What the record can say: the all-to-alls run
# inside one tf.function graph, so the host clock cannot time them apart; the rank reports the bytes
# it sends the others per step from the buffers' static shapes (counted as the step is traced) and
# the all-to-alls the traced step holds. `step_without_sync` leaves out the all-reduce of the
# mirrored weights' gradients only (as torch's): the all-to-alls are part of the computation.

EXPERT_DISPATCH = ("dropless, padded: each rank sends every other rank a block of N x min(k, E/W) rows (its worst "
                   "case) by CollectiveAllToAllV2, the unused rows zero, with each row's local expert id beside "
                   "them (an int32 all-to-all)")
ALL_TO_ALL_OP = "CollectiveAllToAllV2"


class AllToAllTrace:
    """The all-to-alls a step is traced with: each call's bytes sent to the other ranks."""

    def __init__(self):
        self.sent: list[int] = []

    def count(self, buffer, world: int) -> None:
        # a buffer of W equal blocks keeps its own block on the rank
        size = 1
        for d in buffer.shape:
            size *= int(d)
        self.sent.append(size * buffer.dtype.size * (world - 1) // world)


class ExpertShard:
    """One MixtureOfExperts block's experts [first, first + local) on this rank, and the dispatch
    and combine of its routed tokens (the section's comment says how)."""

    def __init__(self, runner: "TensorFlowDistributedRunner", moe, trace: AllToAllTrace):
        tf = load_tf()
        world, rank = runner.cluster.world_size, runner.cluster.rank
        self.experts = moe.routing["experts"]
        self.local = self.experts // world
        self.first = rank * self.local
        self.world, self.runner, self.trace = world, runner, trace
        self.launcher = runner.strategy.extended._cross_device_ops._launchers[0]
        held = slice(self.first, self.first + self.local)
        with tf.device(runner.device):  # outside the strategy's scope: this rank's own variables
            self.gate, self.up, self.down = (
                tf.Variable(v.numpy()[held], name=f"{moe.name}_{what}_shard")
                for v, what in ((moe.gate, "gate"), (moe.up, "up"), (moe.down, "down")))
        self.variables = [self.gate, self.up, self.down]

        @tf.custom_gradient
        def exchange(buffer):
            """The all-to-all of float rows; backward, the inverse all-to-all of their gradients."""
            def grad(g):
                return self._all_to_all(g)

            return self._all_to_all(buffer), grad

        self.exchange = exchange

    def _all_to_all(self, buffer):
        self.trace.count(buffer, self.world)
        return self.runner.all_to_all(buffer, self.launcher._next_instance_key(),
                                      [self.launcher._get_ordering_token()])

    def __call__(self, tokens, chosen, weights):
        tf = load_tf()
        n, d = tokens.shape
        k = chosen.shape[1]
        world, local = self.world, self.local
        slots = n * min(k, local)  # C: rows per block
        expert = tf.reshape(chosen, [-1])  # pair i: token i // k, its choice i % k
        token = tf.range(n * k, dtype=expert.dtype) // k
        rank = expert // local
        onehot = tf.one_hot(rank, world, dtype=tf.int32)
        slot = tf.reduce_sum(tf.cumsum(onehot, axis=0) * onehot, axis=-1) - 1  # the pair's place in its block
        row = (rank * slots + slot)[:, None]  # (N k, 1) in the send buffer of W C rows
        send = tf.scatter_nd(row, tf.gather(tokens, token), [world * slots, d])
        send_ids = tf.scatter_nd(row, tf.cast(expert % local + 1, tf.int32), [world * slots])  # 0: padding
        ids = tf.reshape(self._all_to_all(tf.reshape(send_ids, [world, slots])), [-1]) - 1
        rows = tf.reshape(self.exchange(tf.reshape(send, [world, slots, d])), [world * slots, d])
        gate, up, down = (tf.convert_to_tensor(v) for v in self.variables)
        out = tf.zeros_like(rows)
        for j in range(local):
            at = tf.where(tf.equal(ids, j))  # (n_j, 1): the rows for expert first + j
            h = tf.gather_nd(rows, at)
            out = tf.tensor_scatter_nd_add(out, at, expert_output(h, gate[j], up[j], down[j]))
        back = tf.reshape(self.exchange(tf.reshape(out, [world, slots, d])), [world * slots, d])
        pair = tf.gather_nd(back, row)
        pair = pair * tf.cast(tf.reshape(weights, [-1]), pair.dtype)[:, None]
        return tf.tensor_scatter_nd_add(tf.zeros_like(tokens), token[:, None], pair)


def shard_experts(runner: "TensorFlowDistributedRunner", model, trace: AllToAllTrace) -> list[ExpertShard]:
    """Every MixtureOfExperts block of the model given its shard on this rank, its mirrored expert
    variables dropped from the model; the shards."""
    moe_type = transformer_classes().MixtureOfExperts
    shards = []
    for layer in model._flatten_layers(include_self=False, recursive=True):
        if type(layer) is not moe_type:
            continue
        shard = ExpertShard(runner, layer, trace)
        whole = {id(v) for v in (layer.gate, layer.up, layer.down)}
        layer._trainable_variables[:] = [v for v in layer._trainable_variables if id(v) not in whole]
        layer.gate = layer.up = layer.down = None
        layer.expert_parallel = shard
        shards.append(shard)
    return shards


def prepare_expert_parallel(runner: "TensorFlowDistributedRunner", request: dict, cluster) -> DataParallel:
    """The rank's expert-parallel training step (the section's comment says how)."""
    tf, keras = load_tf(), load_keras()
    network = request["network"]
    strategy, world, rank = runner.strategy, cluster.world_size, cluster.rank
    asked = request.get("precision", "fp32")
    if asked in contract.PRECISIONS and asked != "fp32":
        raise Skip(f"precision {asked}: the tensorflow expert-parallel step trains in fp32 only (its all-to-alls "
                   "move float32 rows; mixed precision is not written for it)")
    precision = request_precision(request, ("fp32",))  # float64 (the check's) or any other: a ValueError
    compile_mode, _ = compile_choice(request)
    if compile_mode != "eager":
        raise Skip(f"compile {compile_mode!r}: the tensorflow expert-parallel step is a tf.function graph without XLA "
                   "(eager only)")
    compression = request.get("compression")
    if compression is not None and str(compression) != "none":
        raise Skip(f"compression {compression}: the tensorflow expert-parallel step all-reduces dense float32 "
                   "gradients")
    optimizer_class = _optimizer_class()
    if optimizer_class is None:
        raise Skip("this Keras SGD has no _all_reduce_sum_gradients: the expert-parallel step cannot leave the "
                   "mirrored weights' all-reduce out of its step without it")
    math_flags = float32_math(precision)
    keras.utils.set_random_seed(request.get("seed", 0))  # the weights data parallelism starts from
    set_batch_norm_floor(cluster.device == "cuda")
    with strategy.scope():
        model, _, _, _ = build_network(network)
    params = count_params(model.trainable_variables)  # the whole network's, before the experts are sharded
    trace = AllToAllTrace()
    shards = shard_experts(runner, model, trace)
    if not shards:
        raise ValueError(f"{network['name']} has no Mixture-of-Experts block to shard over the workers")
    dense = model.trainable_variables
    experts = [v for s in shards for v in s.variables]
    with strategy.scope():
        optimizer = optimizer_class(learning_rate=request["learning_rate"], momentum=request["momentum"])
        optimizer.build(dense)
    # outside the scope: the experts' own optimizer, its momenta this rank's variables
    expert_optimizer = keras.optimizers.SGD(learning_rate=request["learning_rate"], momentum=request["momentum"])
    expert_optimizer.build(experts)
    grad_bytes = gradient_bytes(dense)
    x, y = runner._worker_batch(request, cluster)
    masked_loss, _ = loss_function(network) if masked_count(network) is not None else (None, None)

    def replica_step():
        with tf.GradientTape() as tape:
            worker_loss = _worker_loss(masked_loss, y, model(x, training=True))
            loss = worker_loss / world
        grads = tape.gradient(loss, dense + experts)
        optimizer.apply_gradients(zip(grads[:len(dense)], dense))
        return worker_loss, grads[len(dense):]

    def traced(exchange: bool):
        @tf.function
        def step():
            worker_loss, expert_grads = strategy.run(replica_step)
            local = strategy.experimental_local_results
            expert_optimizer.apply_gradients(zip([local(g)[0] for g in expert_grads], experts))
            return local(worker_loss)[0]

        optimizer.exchange = exchange
        trace.sent.clear()
        try:
            return step.get_concrete_function(), list(trace.sent)
        finally:
            optimizer.exchange = True

    synced, sent = traced(exchange=True)
    unsynced, _ = traced(exchange=False)
    in_step = _count_ops(synced, ALL_TO_ALL_OP)
    if in_step != len(sent) or not in_step or not _count_collectives(synced) or _count_collectives(unsynced):
        raise RuntimeError(f"the traced expert-parallel step holds {in_step} {ALL_TO_ALL_OP} ({len(sent)} traced) and "
                           f"{_describe_ops(_count_collectives(synced)) or 'no gradient collective'}, without the "
                           f"exchange {_describe_ops(_count_collectives(unsynced)) or 'none'}: expected all-to-alls "
                           "and an all-reduce, then no all-reduce")
    held = [s.local for s in shards]
    settings = {
        "precision": precision, "precision_effective": math_flags,
        "compile": {"mode": "eager", "requested": request.get("compile"), "framework": STEP_FRAMEWORK},
        **runner._strategy_settings(),
        "parallelism": "expert",
        "expert_parallel": {
            "dispatch": EXPERT_DISPATCH, "experts_per_worker": held,
            "experts_held": [[rank * h, (rank + 1) * h - 1] for h in held],
            "expert_variables": "tf.Variable made outside the strategy's scope (not mirrored), trained by a Keras SGD "
                                "of the rank's own after strategy.run",
            "backward": "tf.custom_gradient around each float all-to-all: the inverse all-to-all of the gradients",
            "all_to_alls_in_step": in_step,
            "gradients": "the experts' as the backward gives them (each rank's loss is its mean / workers, so their "
                         "sum over every rank's tokens is data parallelism's average); every other weight's "
                         "all-reduced (sum) by the strategy's Keras SGD: data parallelism's",
            "all_to_all_timing": "not timed apart (inside one tf.function graph): the exposed communication is the "
                                 "mirrored weights' all-reduce only"},
        "gradient_exchange": ("Keras SGD apply_gradients in the replica context: replica_context.all_reduce(SUM) of "
                              f"the mirrored weights' gradients; the traced step holds "
                              f"{_describe_ops(_count_collectives(synced))} and {in_step} {ALL_TO_ALL_OP}"),
        "exposed_communication": "median step time minus median step time of the same tf.function step traced with "
                                 "Keras' gradient all-reduce left out (the all-to-alls kept)",
        "loss": LOSS_SETTING["masked" if masked_loss is not None else "tokens_or_classes"],
        "optimizer": "keras.optimizers.SGD(momentum): one in the strategy's scope for the mirrored weights, one of "
                     "the rank's own for its experts",
        "step": "tf.function around strategy.run, then the experts' update",
        **thread_settings(),
    }
    per_step = {"bytes": sum(sent), "calls": len(sent)}
    totals = {"steps": 0}
    seen: dict = {}

    def step():
        seen["loss"] = synced()
        totals["steps"] += 1

    return DataParallel(step, lambda: unsynced(), runner._synchronize, params, output_shape(model), settings,
                        grad_bytes, dense + experts, loss=lambda: float(seen["loss"]),
                        all_to_all=lambda: {"seconds": None, "bytes": per_step["bytes"] * totals["steps"],
                                            "calls": per_step["calls"] * totals["steps"]})
