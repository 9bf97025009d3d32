"""The torch runner's step: the network built from layers.LAYERS (an nn.Sequential of one module per
resolved layer), placed on the device, its synthetic or loaded data, the loss, the optimiser and the
training step; and the dtype probe, one real forward pass layer by layer under the step's autocast.
runner.py, distributed.py, generate.py and convergence.py all build from here.
"""

from __future__ import annotations

from runners.torch.framework import load_torch
from runners.torch.layers import LAYERS, TAKES_EARLIER, TAKES_INPUT
from runners.torch.precision import AMP_DTYPES

# ------------------------------------------------------------------ the network from the table


def build_module(spec: dict, built: list | tuple = (), inp: dict | None = None):
    """One resolved layer (see dlbench.definitions.network) as a torch module; `built`: the modules of
    the layers before it (what a TAKES_EARLIER builder is handed); `inp`: the network's resolved
    input (a TAKES_INPUT builder's)."""
    builder = LAYERS.builder(spec["type"])
    extra = {}
    if spec["type"] in TAKES_EARLIER:
        extra["built"] = list(built)
    if spec["type"] in TAKES_INPUT:
        extra["inp"] = inp
    return builder(spec, **extra)


def build_network(network: dict, deterministic: bool = False):
    """The resolved network as an nn.Sequential of one module per layer. `deterministic`: dropout
    layers become the identity, and the dropout of attention and transformer blocks (on the
    probabilities and the branches) is built at rate 0."""
    nn = load_torch().nn
    built: list = []
    for layer in network["layers"]:
        if deterministic and layer["type"] == "dropout":
            built.append(nn.Identity())
            continue
        if deterministic and layer.get("dropout"):  # attention, transformer_block: their own dropout rate
            layer = {**layer, "dropout": 0.0}
        built.append(build_module(layer, built, network["input"]))
    return nn.Sequential(*built)


def is_images(network: dict) -> bool:
    inp = network["input"]
    return inp["kind"] == "tensor" and len(inp["shape"]) == 3


def place(model, network: dict, device, settings: dict):
    """(model on the device in its memory format, that format): channels-last for images on CUDA,
    where cuDNN is fastest in it; with cuDNN's autotuner on. Says both in `settings`."""
    torch = load_torch()
    cuda = device.type == "cuda"
    if cuda:
        torch.backends.cudnn.benchmark = True  # pick the fastest algorithm per shape, once
        settings["cudnn_benchmark"] = True
    model = model.to(device)
    memory_format = torch.channels_last if (cuda and is_images(network)) else torch.contiguous_format
    model = model.to(memory_format=memory_format)
    settings["memory_format"] = "channels_last" if memory_format is torch.channels_last else "contiguous"
    return model, memory_format


def trainable_params(model) -> list:
    return [p for p in model.parameters() if p.requires_grad]


# ------------------------------------------------------------------ data, loss, optimiser, step


def synthetic_batch(network: dict, batch: int, device, memory_format, generator=None):
    """(x, y) drawn by torch: on the device from torch's global generator, or, with `generator`, on
    the host from that generator and then moved to the device."""
    torch = load_torch()
    where = {"device": device} if generator is None else {"generator": generator}
    inp = network["input"]
    if inp["kind"] == "tokens":
        x = torch.randint(0, inp["vocabulary"], (batch, inp["sequence_length"]), **where)
        y = torch.randint(0, inp["vocabulary"], (batch, inp["sequence_length"]), **where)
    elif inp["kind"] == "masked_tokens":  # y: the M masked positions' tokens, then the next-sentence label
        x = torch.randint(0, inp["vocabulary"], (batch, inp["sequence_length"]), **where)
        y = torch.cat([torch.randint(0, inp["vocabulary"], (batch, len(inp["masked_positions"])), **where),
                       torch.randint(0, 2, (batch, 1), **where)], dim=1)
    else:
        x = torch.randn(batch, *inp["shape"], **where)
        y = torch.randint(0, inp["classes"], (batch,), **where)
    x, y = x.to(device), y.to(device)
    if is_images(network):
        x = x.contiguous(memory_format=memory_format)
    return x, y


def loaded_batch(network: dict, path: str, device, memory_format):
    """(x, y) from an .npz in the canonical layout (`inputs` of the request), on the device."""
    import numpy as np

    torch = load_torch()
    with np.load(path) as data:
        x = torch.from_numpy(data["x"]).to(device)
        y = torch.from_numpy(data["y"]).to(device)
    if is_images(network):
        x = x.contiguous(memory_format=memory_format)
    return x, y


def logits_of(out):
    """The logits of a model's output: pretraining heads return (masked-LM logits, next-sentence
    logits), whose logits are the masked-LM ones; every other network its logits alone."""
    return out[0] if isinstance(out, tuple) else out


def loss(out, y):
    """Mean cross-entropy over the batch (and the steps of a language model); for pretraining heads'
    (masked-LM (B, M, V), next-sentence (B, 2)) output, masked_lm_and_next_sentence: the mean over
    the B*M masked positions against y[:, :M] plus the mean over the batch against y[:, M]."""
    F = load_torch().nn.functional
    if isinstance(out, tuple):
        masked_lm, next_sentence = out
        m = masked_lm.shape[1]
        return (F.cross_entropy(masked_lm.reshape(-1, masked_lm.shape[-1]), y[:, :m].reshape(-1))
                + F.cross_entropy(next_sentence, y[:, m]))
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def sgd(params, request: dict):
    return load_torch().optim.SGD(params, lr=request["learning_rate"], momentum=request["momentum"])


def train_step(model, x, y, make_optimizer, autocast, scaler, on_loss=None):
    """(step, reset_optimizer): one training iteration (zero_grad, forward, loss, backward, update,
    through the GradScaler where there is one) and a fresh optimiser (zero momentum) for it.
    `on_loss`: called with each step's loss tensor (detached), where the caller reads it."""
    opt = make_optimizer()

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast():
            out = model(x)
            value = loss(out, y)
        if on_loss is not None:
            on_loss(value.detach())
        if scaler is None:
            value.backward()
            opt.step()
        else:
            scaler.scale(value).backward()
            scaler.step(opt)
            scaler.update()

    def reset_optimizer():
        nonlocal opt
        opt = make_optimizer()

    return step, reset_optimizer


def output_shape(model, x, train: bool) -> list[int]:
    """Per-sample output shape, from one sample in eval mode (the model is left in the step's mode)."""
    torch = load_torch()
    with torch.inference_mode():
        model.eval()
        shape = list(logits_of(model(x[:1])).shape[1:])
        if train:
            model.train()
    return shape


# ------------------------------------------------------------------ which dtypes the step computes in


class ReducedPrecisionUnsupported(Exception):
    """A layer that torch cannot run in the request's reduced precision on this device."""


def probe_dtypes(model, x, autocast, precision: str, network: dict, train: bool = False) -> dict:
    """One real forward pass of one sample (two in training), layer by layer, in the step's mode under its
    autocast: the first layer's output dtype and the logits' dtype. Under AMP a layer that torch
    cannot run in that dtype on the device, but can in float32, raises ReducedPrecisionUnsupported
    naming the layer and torch's reason. `train`: training mode with autograd, as the step runs it
    (oneDNN's training primitives are not its inference ones: on an AVX-512 CPU a float16 LSTM runs
    for inference and is refused for training); torch's random state and the buffers (batch norm's
    running statistics) are left as they were."""
    torch = load_torch()
    was_training = model.training
    model.train(train)
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()} if train else {}
    devices = [x.device] if x.device.type == "cuda" else []
    seen = {}
    try:
        with torch.random.fork_rng(devices=devices), (torch.enable_grad() if train else torch.no_grad()):
            h = x[:2] if train else x[:1]  # training batch norm on a flat input needs two samples
            for i, layer in enumerate(model):
                try:
                    with autocast():
                        out = layer(h)
                except RuntimeError as e:
                    if precision not in AMP_DTYPES or isinstance(e, torch.OutOfMemoryError):
                        raise
                    layer(h.float() if h.is_floating_point() else h)  # float32 runs it: the dtype is why
                    reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                    raise ReducedPrecisionUnsupported(
                        f"{precision}: torch {torch.__version__} cannot run layer {i} ({network['layers'][i]['type']}, "
                        f"{type(layer).__name__}) under torch.autocast(dtype=torch.{AMP_DTYPES[precision]}) on the "
                        f"{x.device.type.upper()} (it runs in float32): {reason}") from e
                h = out
                if i == 0:
                    seen["first_layer_output_dtype"] = str(h.dtype).removeprefix("torch.")
            seen["logits_dtype"] = str(logits_of(h).dtype).removeprefix("torch.")
    finally:
        model.train(was_training)
        with torch.no_grad():
            for name, b in model.named_buffers():
                if name in buffers:
                    b.copy_(buffers[name])
    seen["dtype_probe"] = (f"{'two samples' if train else 'one sample'} through the eager module layer by layer, "
                           f"{'training mode with autograd' if train else 'eval mode, no autograd'}, "
                           "under the step's autocast (before any torch.compile)")
    return seen
