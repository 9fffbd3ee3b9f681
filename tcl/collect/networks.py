"""Operator inventories of real networks, and the tasks (unique operators) they contain.

Each network is written out from its published architecture (batch 1, float32, NHWC) as the
list of anchor operators it executes. A *task* is one unique operator; its weight in a network
is how many times the network runs it — the `w` of Tenset's top-k score. Nothing here needs
TVM: the TE definitions live in `workloads.py`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True)
class Op:
    """One anchor operator with its shapes; `key` names it uniquely (the task name)."""

    kind: str  # conv2d | depthwise_conv2d | dense | batch_matmul | softmax | layer_norm
    shape: tuple  # kind-specific, see workloads.build_workload

    @property
    def key(self) -> str:
        return f"{self.kind}_" + "_".join(str(s) for s in self.shape)


def conv(h: int, cin: int, cout: int, k: int, stride: int) -> Op:
    """NHWC conv2d on an h×h input, 'same' padding k//2."""
    return Op("conv2d", (h, cin, cout, k, stride))


def dwconv(h: int, c: int, k: int, stride: int) -> Op:
    return Op("depthwise_conv2d", (h, c, k, stride))


def dense(m: int, k: int, n: int) -> Op:
    return Op("dense", (m, k, n))


def resnet50() -> list[Op]:
    ops = [conv(224, 3, 64, 7, 2)]
    cin, h = 64, 56
    for width, blocks, stride in [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]:
        for b in range(blocks):
            s = stride if b == 0 else 1
            ops.append(conv(h, cin, width, 1, 1))
            ops.append(conv(h, width, width, 3, s))  # torchvision ResNet v1.5: stride on the 3x3
            h_out = h // s
            ops.append(conv(h_out, width, width * 4, 1, 1))
            if b == 0:
                ops.append(conv(h, cin, width * 4, 1, s))  # projection shortcut
            cin, h = width * 4, h_out
    ops.append(dense(1, 2048, 1000))
    ops.append(Op("softmax", (1, 1000)))
    return ops


def resnet18() -> list[Op]:
    ops = [conv(224, 3, 64, 7, 2)]
    cin, h = 64, 56
    for width, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
        for b in range(2):
            s = stride if b == 0 else 1
            ops.append(conv(h, cin, width, 3, s))
            ops.append(conv(h // s, width, width, 3, 1))
            if b == 0 and (s != 1 or cin != width):
                ops.append(conv(h, cin, width, 1, s))
            cin, h = width, h // s
    ops.append(dense(1, 512, 1000))
    ops.append(Op("softmax", (1, 1000)))
    return ops


def mobilenet_v2() -> list[Op]:
    ops = [conv(224, 3, 32, 3, 2)]
    cin, h = 32, 112
    # (expansion t, channels c, repeats n, stride s) from the MobileNetV2 paper, Table 2
    for t, c, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                       (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]:
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = cin * t
            if t != 1:
                ops.append(conv(h, cin, hidden, 1, 1))
            ops.append(dwconv(h, hidden, 3, stride))
            h //= stride
            ops.append(conv(h, hidden, c, 1, 1))
            cin = c
    ops.append(conv(h, cin, 1280, 1, 1))
    ops.append(dense(1, 1280, 1000))
    ops.append(Op("softmax", (1, 1000)))
    return ops


def self_attention(seq: int, hidden: int, heads: int) -> list[Op]:
    """Multi-head self-attention over `seq` tokens, its output projection included."""
    head_dim = hidden // heads
    return [dense(seq, hidden, hidden)] * 3 + [  # Q, K, V
        Op("batch_matmul", (heads, seq, head_dim, seq)),  # Q·Kᵀ
        Op("softmax", (heads * seq, seq)),
        Op("batch_matmul", (heads, seq, seq, head_dim)),  # P·V
        dense(seq, hidden, hidden),  # attention output
    ]


def bert(layers: int, hidden: int, heads: int, seq: int = 128) -> list[Op]:
    """BERT encoder (post-norm): attention, norm, feed-forward, norm per layer."""
    ops = [Op("layer_norm", (seq, hidden))]  # embedding layer norm
    for _ in range(layers):
        ops += self_attention(seq, hidden, heads)
        ops.append(Op("layer_norm", (seq, hidden)))
        ops += [dense(seq, hidden, hidden * 4), dense(seq, hidden * 4, hidden)]
        ops.append(Op("layer_norm", (seq, hidden)))
    return ops


def vit(layers: int, hidden: int, heads: int, mlp: int, image: int = 224, patch: int = 16) -> list[Op]:
    """Vision transformer (Dosovitskiy et al.): pre-norm encoder blocks over patch tokens + [CLS]."""
    patches = (image // patch) ** 2
    seq = patches + 1
    # The patch embedding is a k=s=16 convolution without padding, i.e. exactly a dense layer over
    # the flattened non-overlapping patches (im2col is a reshape here).
    ops = [dense(patches, patch * patch * 3, hidden)]
    for _ in range(layers):
        ops.append(Op("layer_norm", (seq, hidden)))
        ops += self_attention(seq, hidden, heads)
        ops.append(Op("layer_norm", (seq, hidden)))
        ops += [dense(seq, hidden, mlp), dense(seq, mlp, hidden)]
    ops.append(Op("layer_norm", (seq, hidden)))
    ops.append(dense(1, hidden, 1000))  # classification head on the [CLS] token
    ops.append(Op("softmax", (1, 1000)))
    return ops


NETWORKS = {
    "resnet50": resnet50,
    "resnet18": resnet18,
    "mobilenet_v2": mobilenet_v2,
    "bert_base": lambda: bert(12, 768, 12),
    "bert_tiny": lambda: bert(2, 128, 2),
    "vit_tiny": lambda: vit(12, 192, 3, 768),  # ViT-Ti/16
}


@dataclass(frozen=True)
class Task:
    name: str
    op: Op | None  # None for a workload read from a database (`mod` holds it)
    weights: dict  # network -> occurrences
    mod: object = None  # the TIR IRModule of a database's workload (workloads.task_module)
    desc: str = ""      # its description, from the database's tasks.json

    @property
    def networks(self) -> list[str]:
        return sorted(self.weights)

    @property
    def weight(self) -> int:
        return sum(self.weights.values())


def network_tasks(names: list[str] | None = None) -> dict[str, Task]:
    """All unique operators of the named networks, with per-network occurrence counts."""
    by_key: dict[str, Op] = {}
    weights: dict[str, Counter] = {}
    for net in names or list(NETWORKS):
        if net not in NETWORKS:
            raise KeyError(f"unknown network {net!r}; known: {', '.join(NETWORKS)}")
        for op, count in Counter(NETWORKS[net]()).items():
            by_key[op.key] = op
            weights.setdefault(op.key, Counter())[net] += count
    return {k: Task(k, by_key[k], dict(weights[k])) for k in sorted(by_key)}
