"""`tcl dataset noise` re-measures stored programs with the recorded settings (real TVM measurement)."""

import json
import os

import pytest

from tcl.collect.noise import read_programs, replay
from tcl.collect.pack import pack

from .conftest import LOCAL_PLATFORM, run_tcl

pytestmark = pytest.mark.slow
PLATFORM = LOCAL_PLATFORM  # re-measured on this host


def test_noise_remeasures_programs_of_a_packed_database(tmp_path):
    work = tmp_path / "work"
    run_tcl("collect", "--platform", PLATFORM, "--out", work / PLATFORM, "--workload", "dense_64",
            "--trials", "3", "--min-repeat-ms", "1")
    pack(str(work), [PLATFORM], str(tmp_path / "raw"))  # gzip, as the bundled dataset ships
    db = tmp_path / "raw" / PLATFORM
    assert (db / "database_tuning_record.json.gz").exists()
    workloads, stored = read_programs(db)
    assert len(stored) == 3 and all(p["old_s"] for p in stored)
    # replaying a stored record gives the program that was measured: the collector's sampling is
    # deterministic (seed 0, first task), so draw the same 3 programs again and compare the TIR.
    # The one change the database round trip makes: a boolean block annotation comes back as 1.
    from tcl.collect.measure import sample_programs
    from tcl.collect.workloads import SMALL_WORKLOADS, build_workload
    from tcl.hardware import get_platform

    def script(mod):
        return mod.script().replace('"meta_schedule.layout_rewrite_preproc": True',
                                    '"meta_schedule.layout_rewrite_preproc": 1')

    sampled = sample_programs(build_workload(SMALL_WORKLOADS["dense_64"]), get_platform(PLATFORM).target, 3, seed=0)
    assert sorted(script(m) for m in replay(workloads, stored)) == sorted(script(s.mod) for s, _, _ in sampled)

    out = tmp_path / "noise.json"
    proc = run_tcl("dataset", "noise", "--platform", PLATFORM, "--raw", tmp_path / "raw", "--programs", "5",
                   "--out", out, "--no-progress")
    assert "re-measured" in proc.stdout
    report = json.loads(out.read_text())
    # all 3 stored programs (fewer than asked for), measured again with the recorded settings
    assert report["programs"] == 3 and report["measured"] == 3 and report["failed_now"] == 0
    assert report["settings"]["min_repeat_ms"] == 1 and report["threads"] == 2
    assert report["target"] == get_platform(PLATFORM).target
    assert {d["program_id"] for d in report["detail"]} == {p["program_id"] for p in stored}
    old = {p["program_id"]: p["old_s"] for p in stored}
    for d in report["detail"]:
        assert d["old_s"] == pytest.approx(old[d["program_id"]], rel=1e-5)
        assert d["new_s"] > 0 and d["rel_diff"] == pytest.approx(abs(d["new_s"] - d["old_s"]) / d["old_s"], rel=1e-3, abs=2e-5)  # 6 significant digits each
    assert report["median_rel_diff"] == pytest.approx(sorted(d["rel_diff"] for d in report["detail"])[1], rel=1e-3)
    assert report["machine"]["logical_cpus"] == os.cpu_count()
    # the CPU it ran on, and on a CPU other than the platform's, the warning and the reason kept
    from tcl.hardware import host_mismatch, local_cpu_model

    why = host_mismatch(get_platform(PLATFORM))
    assert report["host_cpu"] == local_cpu_model() and report["host_mismatch"] == why
    assert (f"warning: platform '{PLATFORM}'" in proc.stderr) == (why is not None)
    assert 0 <= report["other_processes_cores"] <= os.cpu_count() * 1.05 and 0 <= report["off_by_1_5x"] <= 1


def test_noise_refuses_a_database_of_another_platform(tmp_path):
    db = tmp_path / "raw" / PLATFORM
    db.mkdir(parents=True)
    (db / "collect.json").write_text(json.dumps({"platform": "x86-sse-t1", "target": {"kind": "llvm"},
                                                 "threads": 1, "settings": {}}))
    proc = run_tcl("dataset", "noise", "--platform", PLATFORM, "--raw", tmp_path / "raw", check=False)
    assert proc.returncode == 1 and "measured for platform 'x86-sse-t1'" in proc.stderr
    proc = run_tcl("dataset", "noise", "--platform", "x86-sse-t1", "--raw", tmp_path / "raw", check=False)
    assert proc.returncode == 1 and "collect.json: missing" in proc.stderr
