"""Gradient communication of synchronous data-parallel training: the α–β cost of ring all-reduce and
when each layer's gradient is sent (Shi, Wang, Chu, DataCom 2018; Shi, Chu, Li, "MG-WFBP",
INFOCOM 2019; the working forms are in /work/shared/notes/performance-model.md).

Cost of one message of p bytes: t_c(p) = α + β·p. Ring all-reduce of M bytes among n workers sends
2(n−1) messages of M/n bytes one after the other, so as a whole it costs 2(n−1)·α + 2(n−1)/n·β·M:
again a line in M, whose intercept and slope are what a regression of measured all-reduce times
gives for that n (`AllReduceCost.from_fit`), and from which the point-to-point α and β follow.

Layers l = 0 … L−1 in network order; backward runs from L−1 down to 0. t_b[l] is layer l's backward
time and p[l] its gradient's bytes. Backward of l starts at τ_b[l] (τ_b[L−1] = 0, τ_b[l] =
τ_b[l+1] + t_b[l+1]). Wait-free backpropagation (WFBP) sends l's gradient as soon as it is ready
and the link is free: τ_c[L−1] = τ_b[L−1] + t_b[L−1], τ_c[l] = max(τ_c[l+1] + t_c[l+1], τ_b[l] + t_b[l]).
What the backward does not hide is t_c^no = τ_c[0] + t_c[0] − (τ_b[0] + t_b[0]).

Merged-gradient WFBP (MG-WFBP) walks l = L−1 … 1; with e = τ_b[l−1] + t_b[l−1] (when l−1's gradient
is ready) and e < τ_c[l] + t_c[l] (l's message would still be on the link), it merges l's gradient
into l−1's message when l's message has not started yet (τ_c[l] > e: merging costs nothing) or
when the wait for l−1 is shorter than the start-up it saves (e − τ_c[l] < α, α being one
message's start-up, the all-reduce's intercept). A merge sets p[l−1] += p[l], t_c[l] = 0,
t_c[l−1] = t_c(p[l−1]) and recomputes τ_c.

Without overlap (`none`), all gradients go in one all-reduce after the backward.

All-to-all (expert parallelism's dispatch and combine): every rank holds B bytes in n blocks and
sends block j to rank j. Pairwise exchange sends the n−1 foreign blocks, one message of B/n bytes
to each peer, so one all-to-all costs (n−1)·α + (n−1)/n·β·B: a line in B as well
(`AllToAllCost`), fitted from the comm suite's all-to-all records the same way, whose (α, β)
follow by `link`. The per-byte term is nccl-tests' bus bandwidth for all-to-all (algorithm
bandwidth × (n−1)/n): 1/β is the bus bandwidth the line predicts for large buffers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..axes import CompressionMethod, topk_count

SCHEDULES = ("none", "wfbp", "mgwfbp")


@dataclass(frozen=True)
class CollectiveCost:
    """Time of one collective of `nbytes` among `workers`: startup_s + per_byte_s * nbytes (α-β)."""

    workers: int
    startup_s: float
    per_byte_s: float

    def time(self, nbytes: float) -> float:
        return self.startup_s + self.per_byte_s * nbytes


@dataclass(frozen=True)
class AllReduceCost(CollectiveCost):
    """One all-reduce of `nbytes` among `workers`."""

    @classmethod
    def ring(cls, alpha_s: float, beta_s_per_byte: float, workers: int) -> AllReduceCost:
        """Ring all-reduce built from a link's α (start-up per message) and β (seconds per byte)."""
        if workers < 2:
            return cls(workers, 0.0, 0.0)
        steps = 2 * (workers - 1)
        return cls(workers, steps * alpha_s, steps / workers * beta_s_per_byte)

    def link(self) -> tuple[float, float]:
        """(α, β) of the link, the inverse of `ring`: what a fitted all-reduce line implies."""
        steps = 2 * (self.workers - 1)
        return self.startup_s / steps, self.per_byte_s * self.workers / steps


@dataclass(frozen=True)
class AllToAllCost(CollectiveCost):
    """One all-to-all of `nbytes` (each rank's send buffer) among `workers`."""

    @classmethod
    def pairwise(cls, alpha_s: float, beta_s_per_byte: float, workers: int) -> AllToAllCost:
        """n−1 messages of nbytes/n, one to each peer, from a link's α and β."""
        if workers < 2:
            return cls(workers, 0.0, 0.0)
        messages = workers - 1
        return cls(workers, messages * alpha_s, messages / workers * beta_s_per_byte)

    def link(self) -> tuple[float, float]:
        """(α, β) of the link, the inverse of `pairwise`: what a fitted all-to-all line implies."""
        messages = self.workers - 1
        return self.startup_s / messages, self.per_byte_s * self.workers / messages


# the α–β cost model of each collective the comm suite's records are fitted for
COSTS = {"all_reduce": AllReduceCost, "all_to_all": AllToAllCost}


@dataclass
class Schedule:
    """When each layer's backward and each message ran (seconds from the start of the backward)."""

    kind: str
    tau_b: list[float]
    t_b: list[float]
    t_c: list[float]  # per layer; 0 for a layer whose gradient went with a lower layer's message
    tau_c: list[float]
    groups: list[list[int]] = field(default_factory=list)  # layers per message, in sending order

    @property
    def backward_end(self) -> float:
        return self.tau_b[0] + self.t_b[0] if self.t_b else 0.0

    @property
    def communication(self) -> float:
        """Time the link is busy: every message's duration."""
        return sum(self.t_c)

    @property
    def exposed(self) -> float:
        """t_c^no: communication that the backward does not hide."""
        if not self.t_b:
            return 0.0
        return max(0.0, self.tau_c[0] + self.t_c[0] - self.backward_end)


def backward_starts(t_b: list[float]) -> list[float]:
    n = len(t_b)
    tau_b = [0.0] * n
    for l in range(n - 2, -1, -1):
        tau_b[l] = tau_b[l + 1] + t_b[l + 1]
    return tau_b


def communication_starts(t_b: list[float], t_c: list[float], tau_b: list[float]) -> list[float]:
    n = len(t_b)
    tau_c = [0.0] * n
    if n == 0:
        return tau_c
    tau_c[n - 1] = tau_b[n - 1] + t_b[n - 1]
    for l in range(n - 2, -1, -1):
        tau_c[l] = max(tau_c[l + 1] + t_c[l + 1], tau_b[l] + t_b[l])
    return tau_c


def _groups(merged_into_lower: list[bool]) -> list[list[int]]:
    """Messages in sending order (from the last layer down): a layer merged into l−1 travels with it."""
    groups, current = [], []
    for l in range(len(merged_into_lower) - 1, -1, -1):
        current.append(l)
        if not merged_into_lower[l]:
            groups.append(current)
            current = []
    return groups


def wfbp(t_b: list[float], p: list[float], cost: AllReduceCost) -> Schedule:
    t_c = [cost.time(x) for x in p]
    tau_b = backward_starts(t_b)
    tau_c = communication_starts(t_b, t_c, tau_b)
    return Schedule("wfbp", tau_b, list(t_b), t_c, tau_c, [[l] for l in range(len(t_b) - 1, -1, -1)])


def mgwfbp(t_b: list[float], p: list[float], cost: AllReduceCost) -> Schedule:
    p = list(p)
    t_c = [cost.time(x) for x in p]
    tau_b = backward_starts(t_b)
    tau_c = communication_starts(t_b, t_c, tau_b)
    merged = [False] * len(t_b)
    for l in range(len(t_b) - 1, 0, -1):
        ready = tau_b[l - 1] + t_b[l - 1]
        if ready >= tau_c[l] + t_c[l]:
            continue  # l's message is done before l−1's gradient exists: nothing to gain
        if tau_c[l] > ready or ready - tau_c[l] < cost.startup_s:
            p[l - 1] += p[l]
            p[l] = 0.0
            t_c[l] = 0.0
            t_c[l - 1] = cost.time(p[l - 1])
            tau_c = communication_starts(t_b, t_c, tau_b)
            merged[l] = True
    return Schedule("mgwfbp", tau_b, list(t_b), t_c, tau_c, _groups(merged))


def without_overlap(t_b: list[float], p: list[float], cost: AllReduceCost) -> Schedule:
    """One all-reduce of every gradient once the backward is over."""
    n = len(t_b)
    tau_b = backward_starts(t_b)
    t_c = [0.0] * n
    tau_c = [tau_b[0] + t_b[0] if n else 0.0] * n
    if n:
        t_c[0] = cost.time(sum(p))
    return Schedule("none", tau_b, list(t_b), t_c, tau_c, [list(range(n - 1, -1, -1))] if n else [])


def schedule(kind: str, t_b: list[float], p: list[float], cost: AllReduceCost) -> Schedule:
    if kind == "wfbp":
        return wfbp(t_b, p, cost)
    if kind == "mgwfbp":
        return mgwfbp(t_b, p, cost)
    if kind == "none":
        return without_overlap(t_b, p, cost)
    raise ValueError(f"unknown schedule {kind!r}; expected one of {', '.join(SCHEDULES)}")


# ------------------------------------------------------------------ bytes of a compressed exchange

FLOAT32_BYTES = 4
HALF_BYTES = 2  # float16, bfloat16
PAIR_BYTES = 8  # a float32 value and its int32 index
TWO_BIT_VALUES_PER_WORD = 16  # MXNet's 2-bit codes: 16 values in one float32 word


@dataclass(frozen=True)
class ExchangeBytes:
    """What one iteration's gradient exchange sends, analytically (each rank's payload as the
    method makes it, then the collective's traffic): `per_rank` the mean bytes a rank sends,
    `total` every rank's together (what the wire carries), `payload` one rank's message (the
    all-reduced buffer, or the (value, index) pairs), `rounds` the messages one after the other
    on the longest path (ring steps, gTop-k's tree rounds), `formula` how it was counted."""

    method: str
    workers: int
    payload: int
    per_rank: float
    total: float
    rounds: int
    formula: str


def powersgd_compressed(shape: tuple[int, ...], rank: int) -> bool:
    """Whether PowerSGD sends this gradient as factors: a matrix (2+ dimensions, viewed as
    (shape[0], the rest)) whose factors are smaller than it, n m > (n + m) r (torch's
    min_compression_rate 1; jax's runner views (size / last, last), the same n + m)."""
    if len(shape) < 2:
        return False
    n = shape[0]
    m = _product(shape) // n
    return n * m > (n + m) * rank


def _product(shape) -> int:
    out = 1
    for d in shape:
        out *= int(d)
    return out


def exchange_bytes(compression, shapes: list[tuple[int, ...]], workers: int, servers: bool = False) -> ExchangeBytes:
    """The analytical bytes of one iteration's exchange of gradients of these `shapes` (float32,
    one per trainable tensor) among `workers` ranks by `compression` (axes.Compression);
    `servers`: the runner exchanges through parameter servers, one per worker's host (MXNet's
    kvstore, launch style ps-lite), which changes how top-k's all-gather is made (below):
      none            ring all-reduce of B = 4 Σ size: each rank sends 2(n-1)/n · B;
      fp16, bf16      the same of B = 2 Σ size;
      powersgd:r      ring all-reduce of P (n_i x r) and then Q (m_i x r) of each compressed matrix
                      and of every other gradient as it is: B = 4 (Σ (n_i + m_i) r + Σ size_j);
      topk:d          ring all-gather of each rank's K = Σ ceil(d size_i) pairs (8 bytes each):
                      each rank sends (n-1) · 8K; through servers, each rank pushes its 8K to the
                      server holding the key (its row of it) and pulls the other n-1 ranks' 8K:
                      wherever the servers are, n(n-1) · 8K cross between hosts in all, (n-1) · 8K
                      a host on average, in 2 rounds (push, pull);
      gtopk:d         8K-byte messages up a binomial tree (n-1 of them) and back down (n-1):
                      2(n-1) · 8K in all, over 2 ceil(log2 n) rounds;
      2bit:t          MXNet's parameter servers, one per worker's host, each key's values split
                      evenly among them (ps-lite's big-array split): a worker pushes its 2-bit
                      codes, C = 4 Σ ceil(size / 16) bytes, (n-1)/n of them to other hosts'
                      servers, and each server sends its 1/n of the float32 sum, B = 4 Σ size, to
                      the n-1 other workers: (n-1)/n · (C + B) leaves each host, in 2 rounds
                      (push, pull). (Dense push and pull through such servers is (n-1)/n · 2B a
                      host: the ring all-reduce's count.)"""
    method = compression.method
    sizes = [_product(s) for s in shapes]
    n = workers
    if method in (CompressionMethod.NONE, CompressionMethod.FP16, CompressionMethod.BF16,
                  CompressionMethod.POWERSGD):
        if method is CompressionMethod.NONE:
            payload, what = FLOAT32_BYTES * sum(sizes), "4 Σ size"
        elif method is CompressionMethod.POWERSGD:
            r = compression.rank
            elements = sum((s[0] + size // s[0]) * r if powersgd_compressed(s, r) else size
                           for s, size in zip(shapes, sizes))
            payload, what = FLOAT32_BYTES * elements, f"4 (Σ (n_i + m_i) {r} over compressed matrices + Σ size of the rest)"
        else:
            payload, what = HALF_BYTES * sum(sizes), "2 Σ size"
        per_rank = 2 * (n - 1) / n * payload if n > 1 else 0.0
        return ExchangeBytes(str(compression), n, payload, per_rank, per_rank * n, 2 * (n - 1),
                             f"ring all-reduce: 2(n-1)/n · B per rank, B = {what}")
    if method is CompressionMethod.TWO_BIT:
        codes = FLOAT32_BYTES * sum(-(-size // TWO_BIT_VALUES_PER_WORD) for size in sizes)
        dense = FLOAT32_BYTES * sum(sizes)
        per_rank = (n - 1) / n * (codes + dense) if n > 1 else 0.0
        return ExchangeBytes(str(compression), n, codes, per_rank, per_rank * n, 2 if n > 1 else 0,
                             f"parameter servers: push of C = 4 Σ ceil(size / 16) = {codes} bytes of 2-bit codes, "
                             f"pull of the float32 sum B = 4 Σ size = {dense}: (n-1)/n · (C + B) per host")
    k = sum(topk_count(size, compression.density) for size in sizes)
    payload = PAIR_BYTES * k
    if method is CompressionMethod.TOPK:  # the same bytes either way; the rounds and the route differ
        per_rank = (n - 1) * payload
        pairs = f"K = Σ ceil({compression.density:g} size) = {k} pairs"
        if servers:  # one push, then one pull of the others' pairs
            rounds = 2 if n > 1 else 0
            formula = (f"all-gather through the parameter servers of {pairs}: each rank pushes its 8K, pulls the "
                       "other ranks' (n-1) · 8K; (n-1) · 8K per host on average")
        else:
            rounds, formula = n - 1, f"ring all-gather of {pairs}: (n-1) · 8K per rank"
        return ExchangeBytes(str(compression), n, payload, float(per_rank), float(per_rank * n), rounds, formula)
    if method is CompressionMethod.GTOPK:
        total = 2 * (n - 1) * payload
        depth = (n - 1).bit_length()  # ceil(log2 n)
        return ExchangeBytes(str(compression), n, payload, total / n, float(total), 2 * depth,
                             f"binomial tree of K = {k} pairs: n-1 messages of 8K up, n-1 down")
    raise ValueError(f"no byte count for compression {compression}")


@dataclass(frozen=True)
class ExchangeTime:
    """The α–β time of one iteration's exchange on the longest path: `messages` start-ups (α each)
    and `bytes` sent one after the other (β each)."""

    messages: int
    bytes: float

    def time(self, alpha_s: float, beta_s_per_byte: float) -> float:
        return self.messages * alpha_s + self.bytes * beta_s_per_byte


def exchange_time(counted: ExchangeBytes) -> ExchangeTime:
    """The longest path of `exchange_bytes`' collective: a ring all-reduce (none, fp16, bf16,
    powersgd) is 2(n-1) steps of B/n (PowerSGD's two all-reduces, of P and of Q, are counted as
    one of their summed size: their start-ups are the few its matrices add), a ring all-gather
    (topk) n-1 steps of 8K (through servers: the push and the pull, (n-1) · 8K a host), gTop-k's
    tree 2 ceil(log2 n) rounds of 8K each, 2-bit's push and pull through the servers (each host's
    link carries its (n-1)/n · (C + B) one way)."""
    n = counted.workers
    if n < 2:
        return ExchangeTime(0, 0.0)
    method = counted.method.partition(":")[0]
    if method == CompressionMethod.TOPK.value:  # rounds: the ring's n-1 steps, or the servers' push and pull
        return ExchangeTime(counted.rounds, float((n - 1) * counted.payload))
    if method == CompressionMethod.GTOPK.value:
        return ExchangeTime(counted.rounds, float(counted.rounds * counted.payload))
    if method == CompressionMethod.TWO_BIT.value:
        return ExchangeTime(counted.rounds, counted.per_rank)
    return ExchangeTime(2 * (n - 1), 2 * (n - 1) / n * counted.payload)


def crossover_bandwidth(method: ExchangeBytes, dense: ExchangeBytes, alpha_s: float, extra_s: float) -> float | None:
    """The link bandwidth (bytes/s) below which `method` makes an iteration shorter than the dense
    exchange, both unhidden behind the backward: the method costs `extra_s` more compute per
    iteration (compressing, selecting, decompressing) and its exchange_time; the link has start-up
    `alpha_s`. Solves extra + m_m α + b_m β = m_d α + b_d β for β: None where no bandwidth makes
    the method faster (it sends at least as many bytes on the longest path, or its extra cost is
    never paid back), math.inf where it is faster at any bandwidth."""
    m, d = exchange_time(method), exchange_time(dense)
    saved_bytes = d.bytes - m.bytes
    fixed = extra_s + (m.messages - d.messages) * alpha_s  # what the method costs beyond the bytes
    if saved_bytes <= 0:
        return None if fixed >= 0 else float("inf")
    if fixed <= 0:
        return float("inf")
    return saved_bytes / fixed  # β* = fixed / saved_bytes; below 1/β* the method wins
