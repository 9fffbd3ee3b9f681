"""Growing the KB into the AC (tcl.models.grow, continual.ac_init grow): the grown AC scores as
the KB does, its new units still learn, and nets that cannot be grown are refused."""

from __future__ import annotations

import pytest
import torch
import yaml

from tcl.models.grow import GrowError, grow_mamba
from tcl.models.nets import MambaNet

from .conftest import REPO

N_FEATURES = 87  # the featurizer's width; any works


def _presets() -> dict:
    """The KB and AC presets of the project's params.yaml: the sizes the main job grows between."""
    return yaml.safe_load((REPO / "params.yaml").read_text())["models"]["mamba"]


def _trained_like(net: MambaNet, seed: int) -> MambaNet:
    """A net whose weights are no longer the initialisation (so a copy cannot pass by chance)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return net.eval()


def _programs(n: int = 24, steps: int = 30):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(n, steps, N_FEATURES, generator=g)
    mask = torch.ones(n, steps, dtype=torch.bool)
    mask[: n // 3, steps // 2:] = False  # shorter programs too
    return x, mask


def _grown(noise: float, seed: int = 1) -> tuple[MambaNet, MambaNet]:
    presets = _presets()
    torch.manual_seed(0)
    kb = _trained_like(MambaNet(N_FEATURES, **presets["kb"]), seed=0)
    torch.manual_seed(seed)
    ac = MambaNet(N_FEATURES, **presets["ac"])
    return kb, grow_mamba(kb, ac, noise).eval()


@pytest.mark.parametrize("noise, tol", [(0.0, 1e-5), (0.01, 1e-3)])
def test_the_grown_ac_scores_as_the_kb_does(noise, tol):
    kb, ac = _grown(noise)
    assert sum(p.numel() for p in ac.parameters()) > 4 * sum(p.numel() for p in kb.parameters())
    x, mask = _programs()
    with torch.no_grad():
        kb_scores, ac_scores = kb(x, mask), ac(x, mask)
    spread = float(kb_scores.std())
    assert float((ac_scores - kb_scores).abs().max()) < tol * max(spread, 1.0)
    assert torch.equal(torch.argsort(kb_scores), torch.argsort(ac_scores))
    # a fresh AC of the same seed does not (the growth, not the seed, makes them agree)
    torch.manual_seed(1)
    fresh = MambaNet(N_FEATURES, **_presets()["ac"]).eval()
    with torch.no_grad():
        assert float((fresh(x, mask) - kb_scores).abs().max()) > 10 * tol * max(spread, 1.0)


def test_the_new_units_learn_with_noise_and_not_without():
    x, mask = _programs()
    grads = {}
    for noise in (0.0, 0.01):
        _, ac = _grown(noise)
        ac.train()
        ac(x, mask).pow(2).sum().backward()
        grads[noise] = {
            "new layer in_proj": ac.blocks[1].in_proj.weight.grad.abs().max(),
            "new residual dims of the first block's input": ac.blocks[0].in_proj.weight.grad[:, 64:].abs().max(),
            "new inner channels' output": ac.blocks[0].out_proj.weight.grad[:, 64:].abs().max(),
        }
    assert all(float(g) > 0 for g in grads[0.01].values()), grads[0.01]
    # without noise nothing reads the new layer's input projection: it cannot learn
    assert float(grads[0.0]["new layer in_proj"]) == 0.0


def test_nets_that_cannot_grow_are_refused():
    presets = _presets()
    kb = MambaNet(N_FEATURES, **presets["kb"])
    ac = MambaNet(N_FEATURES, **presets["ac"])
    with pytest.raises(GrowError, match="d_model 128 > 64"):
        grow_mamba(ac, kb)  # the other way round
    with pytest.raises(GrowError, match="d_conv"):
        grow_mamba(kb, MambaNet(N_FEATURES, **{**presets["ac"], "d_conv": 2}))
    with pytest.raises(GrowError, match="RMSNorm"):
        grow_mamba(kb, MambaNet(N_FEATURES, **presets["ac"], norm="layer"))
    with pytest.raises(GrowError, match="feature widths"):
        grow_mamba(kb, MambaNet(N_FEATURES + 1, **presets["ac"]))
    with pytest.raises(GrowError, match="noise"):
        grow_mamba(kb, ac, noise=-1.0)
