"""PyTorch runner: builds a resolved dlbench network with torch.nn and times its steps.

Runs inside the torch environment only. torch is imported in `framework_info`, after
`configure_threads` has set the OpenMP variables that torch reads at import. The network, its
weights, data, loss and step are torch_network.py's.
"""

from __future__ import annotations

import os

import torch_network as tn
from contract import Kernel, Prepared
from torch_network import load_torch


class TorchRunner:
    name = "torch"

    def configure_threads(self, threads: int | None) -> dict:
        if threads:
            # torch reads these at import for its OpenMP pool; set_num_threads below is the rule.
            os.environ["OMP_NUM_THREADS"] = str(threads)
            os.environ["MKL_NUM_THREADS"] = str(threads)
        torch = load_torch()
        if threads:
            torch.set_num_threads(threads)
        return {"requested": threads, "intra_op": torch.get_num_threads(),
                "inter_op": torch.get_num_interop_threads()}

    def framework_info(self, device: str) -> dict:
        torch = load_torch()
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
        if device == "cuda" and not load_torch().cuda.is_available():
            return "CUDA requested but this torch build or host has no usable GPU"
        return None

    def prepare_kernel(self, spec: dict, device: str) -> Kernel:
        from torch_kernels import prepare_kernel  # the kernels suite (runners/torch/torch_kernels.py)

        return prepare_kernel(spec, device)

    def prepare(self, request: dict) -> Prepared:
        torch = load_torch()
        network = request["network"]
        device = torch.device(request["device"])
        torch.manual_seed(request.get("seed", 0))
        settings: dict = {}
        model, memory_format = tn.place(tn.build_network(network, deterministic=request.get("deterministic", False)),
                                        network, device, settings)
        if request.get("inputs"):
            x, y = tn.loaded_batch(network, request["inputs"], device, memory_format)
        else:
            x, y = tn.synthetic_batch(network, request["batch_size"], device, memory_format)

        precision = request.get("precision", "float32")
        model, x = tn.in_precision(model, x, precision)
        settings["precision"] = precision
        train = request["mode"] == "train"
        autocast, scaler = tn.mixed_precision(precision, device, train)
        params = sum(p.numel() for p in model.parameters() if p.requires_grad)

        def forward_loss():
            grad = torch.enable_grad() if train else torch.inference_mode()
            with grad, autocast():
                out = model(x)
                loss = tn.loss(out, y)
            return out.detach().to(torch.float64 if out.dtype == torch.float64 else torch.float32).cpu().numpy(), float(loss)

        train_step, reset_optimizer = tn.train_step(model, x, y, lambda: tn.sgd(tn.trainable_params(model), request),
                                                    autocast, scaler)
        if train:
            model.train()
            step = train_step
        else:
            model.eval()

            def step():
                with torch.inference_mode(), autocast():
                    model(x)

        return Prepared(step, tn.synchronizer(device), params, tn.output_shape(model, x, train), settings,
                        export_weights=lambda: tn.export_weights(model, network),
                        load_weights=lambda arrays: tn.load_weights(model, network, arrays),
                        reset_optimizer=reset_optimizer, forward_loss=forward_loss)
