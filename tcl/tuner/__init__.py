"""The tuner: TCL's KB (or a peer) as MetaSchedule's cost model in real tuning runs.

traces.py      candidates' traces -> the steps ingest makes of their database lines
cost_model.py  TCLCostModel: a PyCostModel over tcl.serving (no torch of its own, no MLflow)
baselines.py   the peers: MetaSchedule's XGBoost and random models, the offline Tenset-MLP
tune.py        one tuning run over tasks -> a MetaSchedule database and the best-latency curves
"""
