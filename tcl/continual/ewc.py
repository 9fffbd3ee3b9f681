"""Elastic weight consolidation of the KB: the Fisher information of the finished platforms.

    state = EWCState.from_model(kb)                       # None before the first platform
    state = absorb(state, kb, estimate_fisher(kb, fs, train_params), fs.platform)
    penalty = state.penalty(kb.net)                       # Σ_i F_i (θ_i − θ*_i)², a scalar tensor
    state.attach(kb); kb.save(path, extra=state.extra())  # kept in the KB's checkpoint
                                                          # (aux tensors + extra.ewc_platforms)

Online EWC (Progress & Compress): one anchor θ* (the KB's weights when its last platform was
finished) and the Fisher information summed over every finished platform, so the state stays the
size of the KB however many platforms it learns. The Fisher of platform t is the empirical
Fisher of the task loss: the mean over the batches of one pass over D_t's training programs
(batches of one task, as training draws them) of the squared gradient of the LambdaRank loss at
the KB's weights. A listwise loss has no per-program likelihood, so a batch is the sample.

The state travels inside the checkpoint (``aux_tensors`` of tcl.models.checkpoint:
``ewc.fisher.<param>``, ``ewc.anchor.<param>``; the platforms in ``extra.ewc_platforms``), so a
registered KB carries it and a later transfer continues from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

FISHER, ANCHOR = "ewc.fisher.", "ewc.anchor."


@dataclass
class EWCState:
    fisher: dict          # param name -> tensor, Σ over finished platforms
    anchor: dict          # param name -> tensor θ*
    platforms: list[str] = field(default_factory=list)  # finished platforms, in order

    def penalty(self, net):
        """Σ_i F_i (θ_i − θ*_i)² over the net's parameters (a scalar tensor with gradient)."""
        total = None
        for name, p in net.named_parameters():
            if name in self.fisher:
                term = (self.fisher[name] * (p - self.anchor[name]) ** 2).sum()
                total = term if total is None else total + term
        if total is None:
            raise ValueError("the EWC state names none of the net's parameters")
        return total

    def attach(self, model) -> None:
        """Put the state into the model's aux tensors (saved with its checkpoint) and the platforms
        into its ``extra`` (what :meth:`extra` gives ``save``)."""
        aux = {k: v for k, v in model.aux_tensors.items() if not k.startswith((FISHER, ANCHOR))}
        aux.update({FISHER + k: v for k, v in self.fisher.items()})
        aux.update({ANCHOR + k: v for k, v in self.anchor.items()})
        model.aux_tensors = aux
        model.extra = {**(model.extra or {}), **self.extra()}

    def extra(self) -> dict:
        return {"ewc_platforms": list(self.platforms)}

    @classmethod
    def from_model(cls, model) -> "EWCState | None":
        """The state a loaded KB carries, or None when it has none (a KB not trained by CKD)."""
        aux = getattr(model, "aux_tensors", {}) or {}
        fisher = {k[len(FISHER):]: v for k, v in aux.items() if k.startswith(FISHER)}
        anchor = {k[len(ANCHOR):]: v for k, v in aux.items() if k.startswith(ANCHOR)}
        if not fisher:
            return None
        if set(fisher) != set(anchor):
            raise ValueError("the checkpoint's EWC state is incomplete (Fisher and anchor name "
                             "different parameters)")
        return cls(fisher, anchor, list((model.extra or {}).get("ewc_platforms") or []))


def estimate_fisher(model, fs, train_params: dict) -> dict:
    """Empirical Fisher (param name -> tensor) of `model`'s task loss on FeatureSet `fs`: the mean
    over one pass of task-grouped batches of the squared batch gradient (see the module docstring)."""
    import torch

    from tcl.losses import get_loss
    from tcl.training import DEFAULT_TRAIN, epoch_batches, epoch_seed

    p = {**DEFAULT_TRAIN, **(train_params or {})}
    loss_name = p["loss"] if p["loss"] != "none" else "lambdarank"
    loss_fn = get_loss(loss_name)
    net = model.net
    x, mask = model.inputs(fs)
    batches = epoch_batches([fs], int(p["batch_size"]), np.random.default_rng(epoch_seed(int(p["seed"]), 0)),
                            by_task=loss_name != "mse")
    params = dict(net.named_parameters())
    grad_flags = {n: q.requires_grad for n, q in params.items()}
    fisher = {n: torch.zeros_like(q) for n, q in params.items()}
    was_training = net.training
    net.eval()  # no dropout: the gradient of the model as it will be anchored
    n = 0
    try:
        for q in params.values():
            q.requires_grad_(True)
        for _, idx in batches:
            idx = np.sort(idx)
            xb = torch.from_numpy(np.ascontiguousarray(x[idx], dtype=np.float32))
            mb = torch.from_numpy(np.ascontiguousarray(mask[idx], dtype=bool))
            yb = torch.from_numpy(np.ascontiguousarray(fs.y[idx], dtype=np.float32))
            tb = torch.from_numpy(np.ascontiguousarray(fs.task[idx], dtype=np.int64))
            loss = loss_fn(net(xb, mb), yb, tb)
            if not torch.isfinite(loss):
                continue
            grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
            for (name, _), g in zip(params.items(), grads):
                if g is not None:
                    fisher[name] += g.detach() ** 2
            n += 1
    finally:
        for name, q in params.items():
            q.requires_grad_(grad_flags[name])
        net.train(was_training)
    if n == 0:
        raise ValueError(f"no finite loss on the training programs of {fs.platform!r}: no Fisher information")
    return {k: v / n for k, v in fisher.items()}


def absorb(state: EWCState | None, model, fisher: dict, platform: str) -> EWCState:
    """The state after finishing `platform`: its Fisher added to the accumulated one, the anchor
    moved to the model's current weights."""
    anchor = {k: v.detach().clone() for k, v in model.net.named_parameters()}
    if state is None:
        return EWCState({k: v.detach().clone() for k, v in fisher.items()}, anchor, [platform])
    if set(state.fisher) != set(fisher):
        raise ValueError("the accumulated Fisher information belongs to a differently shaped KB")
    total = {k: state.fisher[k] + fisher[k] for k in fisher}
    return EWCState(total, anchor, [*state.platforms, platform])
