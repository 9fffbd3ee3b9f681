"""Continual knowledge distillation (CKD): each hardware family's knowledge base (KB) learns new
platforms from an active cost model (AC) without forgetting the old ones.

* ``distill.py``  L_distill (LambdaRank on a frozen teacher's scores as soft targets) and Φ_t
* ``ewc.py``      the KB's EWC state: Fisher information accumulated over finished platforms
* ``schedule.py`` the phases (AC start, CL, KD), a family's schedule and `tcl transfer`
* ``study.py``    the studies of issue 13 (`tcl ckd-study`, pipelines/continual): one transfer
                  variant per run (scratch, fine-tuning, multi-task heads, CKD and its ablations)

KB and AC are ordinary cost models (``tcl.models``; params.yaml ``models.mamba.kb`` /
``models.mamba.ac``) trained by ``tcl.training`` with a frozen teacher's term and the EWC penalty
as extra loss terms. Settings: params.yaml ``continual:``. Imports are left to the submodules so
``import tcl.continual`` loads neither torch nor MLflow.
"""
