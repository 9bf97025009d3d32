"""PyTorch runner: builds a resolved dlbench network with torch.nn and times its steps.

Runs inside the torch environment only. torch is imported in `framework_info`, after
`configure_threads` has set the OpenMP variables that torch reads at import.
"""

from __future__ import annotations

import contextlib
import os



def _torch():
    import torch

    return torch


def build_module(spec: dict):
    """One resolved layer (see dlbench.definitions.analysis) as a torch module."""
    torch = _torch()
    nn = torch.nn
    t = spec["type"]
    in_shape = spec["in_shape"]
    if t == "dense":
        return nn.Linear(in_shape[-1], spec["units"], bias=spec["bias"])
    if t == "conv2d":
        return nn.Conv2d(in_shape[0], spec["filters"], tuple(spec["kernel"]), tuple(spec["stride"]),
                         tuple(spec["padding"]), bias=spec["bias"])
    if t == "max_pool":
        return nn.MaxPool2d(tuple(spec["size"]), tuple(spec["stride"]), tuple(spec["padding"]))
    if t == "avg_pool":
        return nn.AvgPool2d(tuple(spec["size"]), tuple(spec["stride"]))
    if t == "global_avg_pool":
        return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())
    if t == "batch_norm":
        cls = nn.BatchNorm2d if len(in_shape) == 3 else nn.BatchNorm1d
        return cls(in_shape[0], eps=spec["eps"], momentum=spec["momentum"])
    if t == "relu":
        return nn.ReLU(inplace=True)
    if t == "sigmoid":
        return nn.Sigmoid()
    if t == "tanh":
        return nn.Tanh()
    if t == "flatten":
        return nn.Flatten()
    if t == "dropout":
        return nn.Dropout(spec["rate"])
    if t == "embedding":
        return nn.Embedding(spec["vocabulary"], spec["dim"])
    if t == "lstm":
        return _lstm(in_shape[-1], spec["hidden"], spec["layers"])
    if t == "residual":
        return _residual(spec)
    raise ValueError(f"torch runner: unsupported layer type {t!r}")


def _lstm(features: int, hidden: int, layers: int):
    torch = _torch()

    class SequenceLSTM(torch.nn.Module):
        """nn.LSTM (cuDNN's fused kernel on GPU) returning the output sequence.

        The canonical LSTM has one bias vector per layer; torch has two, so the hidden-to-hidden
        bias is zeroed and frozen, which keeps the trainable parameter count canonical.
        """

        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(features, hidden, layers, batch_first=True)
            for name, p in self.lstm.named_parameters():
                if name.startswith("bias_hh"):
                    torch.nn.init.zeros_(p)
                    p.requires_grad_(False)

        def forward(self, x):
            return self.lstm(x)[0]

    return SequenceLSTM()


def _residual(spec: dict):
    torch = _torch()
    nn = torch.nn
    cin = spec["in_shape"][0]
    cout = spec["out_shape"][0]
    f, s = spec["filters"], spec["stride"]

    def conv_bn(ci, co, k, stride, relu):
        layers = [nn.Conv2d(ci, co, k, stride, k // 2, bias=False), nn.BatchNorm2d(co)]
        return layers + ([nn.ReLU(inplace=True)] if relu else [])

    if spec["block"] == "basic":
        body = conv_bn(cin, f, 3, s, True) + conv_bn(f, f, 3, 1, False)
    else:
        body = conv_bn(cin, f, 1, 1, True) + conv_bn(f, f, 3, s, True) + conv_bn(f, cout, 1, 1, False)

    class OptionA(nn.Module):
        def forward(self, x):
            if s > 1:
                x = x[:, :, ::s, ::s]
            return torch.nn.functional.pad(x, (0, 0, 0, 0, 0, cout - cin))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(*body)
            if spec["shortcut"] == "projection":
                self.shortcut = nn.Sequential(*conv_bn(cin, cout, 1, s, False))
            elif spec["shortcut"] == "option_a":
                self.shortcut = OptionA()
            else:
                self.shortcut = nn.Identity()

        def forward(self, x):
            return torch.relu(self.body(x) + self.shortcut(x))

    return Block()


def build_network(network: dict, deterministic: bool = False):
    nn = _torch().nn
    return nn.Sequential(*(nn.Identity() if deterministic and layer["type"] == "dropout" else build_module(layer)
                           for layer in network["layers"]))


# Canonical weights (see src/dlbench/definitions/weights.py) <-> torch tensors. Each entry maps a
# canonical name to (the tensor, how to turn canonical into torch layout). torch's own layouts are
# the canonical ones (OIHW, out x in, gates i f g o), so only the LSTM's two biases need care.

def _bn_tensors(prefix: str, bn) -> dict:
    return {f"{prefix}.gamma": bn.weight, f"{prefix}.beta": bn.bias,
            f"{prefix}.running_mean": bn.running_mean, f"{prefix}.running_var": bn.running_var}


def canonical_tensors(model, network: dict) -> dict:
    """name -> torch tensor (parameter or buffer) for every canonical weight except LSTM biases."""
    out = {}
    for i, (layer, module) in enumerate(zip(network["layers"], model)):
        p, t = f"{i:03d}", layer["type"]
        if t in ("dense", "conv2d"):
            out[f"{p}.weight"] = module.weight
            if module.bias is not None:
                out[f"{p}.bias"] = module.bias
        elif t == "batch_norm":
            out.update(_bn_tensors(p, module))
        elif t == "embedding":
            out[f"{p}.weight"] = module.weight
        elif t == "lstm":
            for k in range(layer["layers"]):
                out[f"{p}.l{k}.w_ih"] = getattr(module.lstm, f"weight_ih_l{k}")
                out[f"{p}.l{k}.w_hh"] = getattr(module.lstm, f"weight_hh_l{k}")
        elif t == "residual":
            convs = [m for m in module.body if isinstance(m, _torch().nn.Conv2d)]
            bns = [m for m in module.body if isinstance(m, _torch().nn.BatchNorm2d)]
            for j, (c, b) in enumerate(zip(convs, bns), start=1):
                out[f"{p}.conv{j}.weight"] = c.weight
                out.update(_bn_tensors(f"{p}.bn{j}", b))
            if layer["shortcut"] == "projection":
                out[f"{p}.proj.weight"] = module.shortcut[0].weight
                out.update(_bn_tensors(f"{p}.proj_bn", module.shortcut[1]))
    return out


def _lstm_biases(model, network: dict):
    for i, (layer, module) in enumerate(zip(network["layers"], model)):
        if layer["type"] == "lstm":
            for k in range(layer["layers"]):
                yield f"{i:03d}.l{k}.bias", getattr(module.lstm, f"bias_ih_l{k}"), getattr(module.lstm, f"bias_hh_l{k}")


def export_weights(model, network: dict) -> dict:
    out = {n: t.detach().float().cpu().numpy().copy() for n, t in canonical_tensors(model, network).items()}
    for name, b_ih, b_hh in _lstm_biases(model, network):
        out[name] = (b_ih + b_hh).detach().float().cpu().numpy().copy()
    return out


def load_weights(model, network: dict, arrays: dict) -> None:
    torch = _torch()
    tensors = canonical_tensors(model, network)
    biases = {name: (b_ih, b_hh) for name, b_ih, b_hh in _lstm_biases(model, network)}
    expected = set(tensors) | set(biases)
    if set(arrays) != expected:
        raise ValueError(f"weight set mismatch: missing {sorted(expected - set(arrays))[:5]}, "
                         f"unexpected {sorted(set(arrays) - expected)[:5]}")
    with torch.no_grad():
        for name, t in tensors.items():
            src = torch.from_numpy(arrays[name])
            if tuple(src.shape) != tuple(t.shape):
                raise ValueError(f"{name}: shape {tuple(src.shape)}, torch expects {tuple(t.shape)}")
            t.copy_(src)
        for name, (b_ih, b_hh) in biases.items():
            b_ih.copy_(torch.from_numpy(arrays[name]))
            b_hh.zero_()


class Prepared:
    def __init__(self, step, synchronize, params, output_shape, settings, model=None, network=None,
                 forward_loss=None, reset_optimizer=None):
        self.step = step
        self.synchronize = synchronize
        self.params = params
        self.output_shape = output_shape
        self.settings = settings
        self._model, self._network = model, network
        self.forward_loss = forward_loss
        self._reset_optimizer = reset_optimizer

    def export_weights(self) -> dict:
        return export_weights(self._model, self._network)

    def load_weights(self, arrays: dict) -> None:
        load_weights(self._model, self._network, arrays)
        self._reset_optimizer()


class TorchRunner:
    name = "torch"

    def configure_threads(self, threads: int | None) -> dict:
        if threads:
            # torch reads these at import for its OpenMP pool; set_num_threads below is the rule.
            os.environ["OMP_NUM_THREADS"] = str(threads)
            os.environ["MKL_NUM_THREADS"] = str(threads)
        torch = _torch()
        if threads:
            torch.set_num_threads(threads)
        return {"requested": threads, "intra_op": torch.get_num_threads(),
                "inter_op": torch.get_num_interop_threads()}

    def framework_info(self, device: str) -> dict:
        torch = _torch()
        cuda = torch.cuda.is_available()
        devices = [{"type": "cpu"}]
        if cuda:
            for i in range(torch.cuda.device_count()):
                p = torch.cuda.get_device_properties(i)
                devices.append({"type": "cuda", "index": i, "name": p.name,
                                "capability": f"{p.major}.{p.minor}", "memory_bytes": p.total_memory})
        return {
            "name": "torch",
            "version": torch.__version__,
            "build": {
                "git": getattr(torch.version, "git_version", None),
                "cuda": torch.version.cuda,
                "cudnn": torch.backends.cudnn.version() if cuda else None,
                "mkl": torch.backends.mkl.is_available(),
                "mkldnn": torch.backends.mkldnn.is_available(),
                "openmp": torch.backends.openmp.is_available(),
                "debug": torch.version.debug,
            },
            "devices": devices,
        }

    def device_available(self, device: str) -> str | None:
        if device == "cuda" and not _torch().cuda.is_available():
            return "CUDA requested but this torch build or host has no usable GPU"
        return None

    def prepare_kernel(self, spec: dict, device: str):
        from torch_kernels import prepare_kernel  # the kernels suite (runners/torch/torch_kernels.py)

        return prepare_kernel(spec, device)

    def prepare(self, request: dict) -> Prepared:
        torch = _torch()
        network = request["network"]
        device = torch.device(request["device"])
        torch.manual_seed(request.get("seed", 0))
        settings: dict = {}
        cuda = device.type == "cuda"
        if cuda:
            torch.backends.cudnn.benchmark = True  # pick the fastest algorithm per shape, once
            settings["cudnn_benchmark"] = True
        model = build_network(network, deterministic=request.get("deterministic", False)).to(device)
        images = network["input"]["kind"] == "tensor" and len(network["input"]["shape"]) == 3
        memory_format = torch.channels_last if (cuda and images) else torch.contiguous_format
        model = model.to(memory_format=memory_format)
        settings["memory_format"] = "channels_last" if memory_format is torch.channels_last else "contiguous"

        batch = request["batch_size"]
        inp = network["input"]
        if request.get("inputs"):
            import numpy as np

            with np.load(request["inputs"]) as data:
                x = torch.from_numpy(data["x"]).to(device)
                y = torch.from_numpy(data["y"]).to(device)
            if images:
                x = x.contiguous(memory_format=memory_format)
        elif inp["kind"] == "tokens":
            x = torch.randint(0, inp["vocabulary"], (batch, inp["sequence_length"]), device=device)
            y = torch.randint(0, inp["vocabulary"], (batch, inp["sequence_length"]), device=device)
        else:
            x = torch.randn(batch, *inp["shape"], device=device).contiguous(memory_format=memory_format) \
                if images else torch.randn(batch, *inp["shape"], device=device)
            y = torch.randint(0, inp["classes"], (batch,), device=device)

        precision = request.get("precision", "float32")
        amp_dtype = {"amp_fp16": torch.float16, "amp_bf16": torch.bfloat16}.get(precision)
        settings["precision"] = precision

        def autocast():
            if amp_dtype is None:
                return contextlib.nullcontext()
            return torch.autocast(device_type=device.type, dtype=amp_dtype)

        params = sum(p.numel() for p in model.parameters() if p.requires_grad)
        loss_fn = torch.nn.functional.cross_entropy

        def make_optimizer():
            return torch.optim.SGD([p for p in model.parameters() if p.requires_grad],
                                   lr=request["learning_rate"], momentum=request["momentum"])

        def forward_loss():
            grad = torch.enable_grad() if request["mode"] == "train" else torch.inference_mode()
            with grad, autocast():
                out = model(x)
                loss = loss_fn(out.reshape(-1, out.shape[-1]), y.reshape(-1))
            return out.detach().float().cpu().numpy(), float(loss)

        opt = make_optimizer()

        def reset_optimizer():
            nonlocal opt
            opt = make_optimizer()

        if request["mode"] == "train":
            model.train()
            scaler = torch.amp.GradScaler(device.type) if (amp_dtype is torch.float16 and cuda) else None

            def step():
                opt.zero_grad(set_to_none=True)
                with autocast():
                    out = model(x)
                    loss = loss_fn(out.reshape(-1, out.shape[-1]), y.reshape(-1))
                if scaler is None:
                    loss.backward()
                    opt.step()
                else:
                    scaler.scale(loss).backward()
                    scaler.step(opt)
                    scaler.update()
        else:
            model.eval()

            def step():
                with torch.inference_mode(), autocast():
                    model(x)

        with torch.inference_mode():
            model.eval()
            out_shape = list(model(x[:1]).shape[1:])
            if request["mode"] == "train":
                model.train()
        synchronize = torch.cuda.synchronize if cuda else (lambda: None)
        return Prepared(step, synchronize, params, out_shape, settings, model, network, forward_loss,
                        reset_optimizer)
