"""PyTorch reference: torchvision's resnet50 where torchvision imports, else a hand-written model of
the same architecture in torchvision's style; for LSTM-32, torch.nn's own Embedding + LSTM + Linear;
for GPT-2 small, HuggingFace transformers' GPT2LMHeadModel built from a GPT2Config (random
initialisation, nothing downloaded) with attn_implementation="sdpa", trained on its logits with the
suite's loss (cross-entropy at every position against the given labels: not HF's `labels=`, which
shifts them and drops the last position). transformers is not in the runner's environment: fairness.py
installs benchmarks/references/requirements-torch.txt into a folder of its own and puts it on
PYTHONPATH for this process only.

GELU: the gpt2 configuration's own activation, "gelu_new" (NewGELUActivation, the tanh form written
out in five element-wise torch operations); DLBENCH_REFERENCE_GPT2_GELU=gelu_pytorch_tanh runs the same
function as torch's fused F.gelu(approximate="tanh"), which is what dlbench's runner calls.

The llm suite (llama_tiny, smollm2_135m; moe_tiny): transformers' LlamaForCausalLM(LlamaConfig(...))
and MixtralForCausalLM(MixtralConfig(...)) from the configuration fairness.py passes (--llm: the suite's
description), attn_implementation="sdpa", no key/value cache; the MoE's load-balancing loss is
transformers' own (output_router_logits=True: `aux_loss`, times router_aux_loss_coef, added to the
loss as MixtralForCausalLM adds it when given labels). The torch environment has transformers
(runners/torch/requirements-cpu.txt), so these need no reference-only packages.

torchvision cannot be used with the local CPU torch wheel of the development machine (its compiled
operators do not register against that build), so there the hand-written model stands in; the JSON
line says which model ran.
"""

from __future__ import annotations

import torch
from torch import nn

import os

from reference_loop import (CLASSES, EMBEDDING, GPT2, HIDDEN, IMAGE, LLM_NETWORKS, SEQUENCE, VOCABULARY,
                            canonical_inputs, parse_args, sequence, time_steps)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carrying the stride), 1x1 expand ×4, each with batch norm; projection
    shortcut where the shape changes (torchvision's ResNet-50 block)."""

    expansion = 4

    def __init__(self, in_channels: int, width: int, stride: int):
        super().__init__()
        out = width * self.expansion
        self.conv1 = nn.Conv2d(in_channels, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or in_channels != out:
            self.downsample = nn.Sequential(nn.Conv2d(in_channels, out, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(out))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return self.relu(y + identity)


class ResNet50(nn.Module):
    def __init__(self, classes: int = CLASSES):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU(inplace=True), nn.MaxPool2d(3, stride=2, padding=1))
        blocks, channels = [], 64
        for stage, (width, repeat) in enumerate([(64, 3), (128, 4), (256, 6), (512, 3)]):
            for i in range(repeat):
                blocks.append(Bottleneck(channels, width, 2 if (stage > 0 and i == 0) else 1))
                channels = width * Bottleneck.expansion
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.blocks(self.stem(x))), 1))


class LanguageModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCABULARY, EMBEDDING)
        self.lstm = nn.LSTM(EMBEDDING, HIDDEN, num_layers=2, batch_first=True)
        self.out = nn.Linear(HIDDEN, VOCABULARY)

    def forward(self, tokens):
        return self.out(self.lstm(self.embed(tokens))[0])


def resnet50() -> tuple[nn.Module, str]:
    try:
        import torchvision

        return torchvision.models.resnet50(), f"torchvision {torchvision.__version__} models.resnet50"
    except Exception as e:  # noqa: BLE001 - any import or registration failure means "not usable here"
        reason = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        return ResNet50(), f"hand-written torchvision-style ResNet-50 (torchvision unusable: {reason})"


def gpt2_small() -> tuple[nn.Module, str]:
    """HuggingFace's GPT2LMHeadModel from the gpt2 (small) configuration: tied head, dropout 0.1 on the
    embeddings, the attention probabilities and both branches; no key/value cache (a training step)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a configuration only: nothing is fetched
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel

    gelu = os.environ.get("DLBENCH_REFERENCE_GPT2_GELU", "gelu_new")
    config = GPT2Config(vocab_size=GPT2["vocabulary"], n_positions=GPT2["context"], n_embd=GPT2["width"],
                        n_layer=GPT2["layers"], n_head=GPT2["heads"], resid_pdrop=GPT2["dropout"],
                        embd_pdrop=GPT2["dropout"], attn_pdrop=GPT2["dropout"], layer_norm_epsilon=GPT2["eps"],
                        activation_function=gelu, tie_word_embeddings=True, use_cache=False,
                        attn_implementation="sdpa")
    model = GPT2LMHeadModel(config)
    assert model.lm_head.weight is model.transformer.wte.weight, "the head is not tied"
    attention = model.config._attn_implementation
    return model, (f"transformers {transformers.__version__} GPT2LMHeadModel(GPT2Config(gpt2 small, "
                   f"activation_function={gelu!r})), attn_implementation={attention!r}")


def llm(config: dict) -> tuple[nn.Module, str]:
    """transformers' Llama (or, with experts, Mixtral) causal LM from the suite's configuration: no
    biases, RMSNorm, rotary at the network's theta, grouped key/value heads, SwiGLU; Mixtral's sliding
    window off (the suite's attention is causal over the whole sequence)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a configuration only: nothing is fetched
    import transformers

    common = dict(vocab_size=config["vocabulary"], hidden_size=config["width"], intermediate_size=config["hidden"],
                  num_hidden_layers=config["layers"], num_attention_heads=config["heads"],
                  num_key_value_heads=config["kv_heads"], max_position_embeddings=config["context"],
                  rms_norm_eps=config["eps"], rope_theta=config["rope_theta"],
                  tie_word_embeddings=config["tied"], initializer_range=config["init_std"], use_cache=False,
                  attn_implementation="sdpa")
    if config["experts"]:
        cfg = transformers.MixtralConfig(**common, num_local_experts=config["experts"],
                                         num_experts_per_tok=config["top_k"],
                                         router_aux_loss_coef=config["aux_loss_coefficient"],
                                         output_router_logits=True, sliding_window=None)
        model = transformers.MixtralForCausalLM(cfg)
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common, attention_bias=False, mlp_bias=False))
    if config["tied"]:
        assert model.lm_head.weight is model.model.embed_tokens.weight, "the head is not tied"
    experts = getattr(model.config, "experts_implementation", None) or getattr(model.config, "_experts_implementation", None)
    return model, (f"transformers {transformers.__version__} {type(model).__name__}({type(model.config).__name__}"
                   f"(the suite's {config['name']})), attn_implementation={model.config._attn_implementation!r}"
                   + (f", experts_implementation={experts!r}" if config["experts"] else ""))


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    if args.network == "resnet50":
        model, source = resnet50()
        x = torch.randn(args.batch, IMAGE[2], IMAGE[0], IMAGE[1], device=device)
        y = torch.randint(0, CLASSES, (args.batch,), device=device)
    elif args.network == "lstm32":
        model, source = LanguageModel(), "torch.nn Embedding + LSTM(num_layers=2) + Linear"
        x = torch.randint(0, VOCABULARY, (args.batch, SEQUENCE), device=device)
        y = torch.randint(0, VOCABULARY, (args.batch, SEQUENCE), device=device)
    else:
        model, source = llm(args.llm) if args.network in LLM_NETWORKS else gpt2_small()
        vocabulary = args.llm["vocabulary"] if args.llm else GPT2["vocabulary"]
        x = torch.randint(0, vocabulary, (args.batch, sequence(args)), device=device)
        y = torch.randint(0, vocabulary, (args.batch, sequence(args)), device=device)
    given = canonical_inputs(args)
    if given is not None:  # the runner's batch
        x, y = (torch.from_numpy(a).to(device) for a in given)
    model = model.to(device).train()
    if args.device == "cuda":
        torch.backends.cudnn.benchmark = True
    opt = torch.optim.SGD(model.parameters(), lr=args.learning_rate, momentum=args.momentum)
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        out = model(x)
        aux = getattr(out, "aux_loss", None)  # Mixtral's load-balancing loss (output_router_logits=True)
        out = out.logits if args.network == "gpt2_small" or args.llm else out
        loss = loss_fn(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        if aux is not None:
            loss = loss + model.config.router_aux_loss_coef * aux
        loss.backward()
        opt.step()

    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    time_steps(step, sync, args, model=source, params=sum(p.numel() for p in model.parameters()),
               framework=f"torch {torch.__version__}", threads=torch.get_num_threads())


if __name__ == "__main__":
    main()
