"""Operator inventories of the networks: counts checked against the published architectures."""

from tcl.collect.networks import network_tasks


def test_vit_tiny_has_the_vit_ti16_operators_with_their_occurrences():
    # ViT-Ti/16 (Dosovitskiy et al. 2021; Touvron et al. 2021): 224x224 image, 16x16 patches ->
    # 196 tokens + [CLS] = 197, hidden 192, 3 heads of 64, MLP 768, 12 pre-norm layers.
    w = {name: t.weights["vit_tiny"] for name, t in network_tasks(["vit_tiny"]).items()}
    assert w == {
        "dense_196_768_192": 1,            # patch embedding (16*16*3 = 768 -> 192)
        "layer_norm_197_192": 2 * 12 + 1,  # two per layer + the final norm
        "dense_197_192_192": 4 * 12,       # Q, K, V, attention output
        "batch_matmul_3_197_64_197": 12,   # Q·Kᵀ
        "softmax_591_197": 12,             # 3 heads x 197 rows
        "batch_matmul_3_197_197_64": 12,   # P·V
        "dense_197_192_768": 12,
        "dense_197_768_192": 12,
        "dense_1_192_1000": 1,             # head on [CLS]
        "softmax_1_1000": 1,
    }


def test_a_task_shared_by_two_networks_counts_its_occurrences_in_each():
    tasks = network_tasks(["resnet50", "resnet18", "vit_tiny"])
    # the 7x7 stem: once in each ResNet; softmax over 1000 classes: once in each network
    assert tasks["conv2d_224_3_64_7_2"].weights == {"resnet18": 1, "resnet50": 1}
    assert tasks["softmax_1_1000"].weights == {"resnet18": 1, "resnet50": 1, "vit_tiny": 1}
    # resnet50: the 3x3 conv of the 56x56 stage runs in each of its 3 bottleneck blocks
    assert tasks["conv2d_56_64_64_3_1"].weights["resnet50"] == 3
