"""A project's own platforms and families: `tcl hardware add|add-family|list` and the merged registry."""

from __future__ import annotations

import json

import pytest

from tcl import hardware

from .conftest import fixture_path, run_tcl

TARGET = {"kind": "llvm", "mcpu": "haswell", "num-cores": 1}


@pytest.fixture
def user_registry(tmp_path, monkeypatch):
    path = tmp_path / "proj" / "hardware.json"
    monkeypatch.setenv(hardware.USER_REGISTRY_ENV, str(path))
    return path


def _add_my_platform(target=TARGET):
    """my-fam and my-cpu through the library (the CLI's own test adds them through `tcl`)."""
    hardware.add_family("my-fam", vendor="Me", architecture="Zen 4 at 1 GHz", isa="x86-64 AVX2")
    return hardware.add_platform("my-cpu", "my-fam", target=target, threads=1, cpu="my box")


def _add_my_platform_with_the_cli(target=TARGET):
    run_tcl("hardware", "add-family", "my-fam", "--vendor", "Me", "--architecture", "Zen 4 at 1 GHz",
            "--isa", "x86-64 AVX2")
    args = ["hardware", "add", "my-cpu", "--family", "my-fam", "--threads", "1", "--cpu", "my box"]
    if target is not None:
        args += ["--target", json.dumps(target)]
    return run_tcl(*args)


def test_add_writes_the_user_registry_and_list_shows_its_source(user_registry):
    proc = _add_my_platform_with_the_cli()
    assert "added platform my-cpu" in proc.stdout and str(user_registry) in proc.stdout
    written = json.loads(user_registry.read_text())
    assert written["families"]["my-fam"] == {"vendor": "Me", "architecture": "Zen 4 at 1 GHz",
                                             "isa": "x86-64 AVX2"}
    assert written["platforms"]["my-cpu"]["target"] == TARGET
    assert written["platforms"]["my-cpu"]["threads"] == 1
    # the packaged file is untouched: the entry lives only in the project
    packaged = json.loads((hardware.resources.files("tcl.data") / "hardware.json").read_text())
    assert "my-cpu" not in packaged["platforms"] and "my-fam" not in packaged["families"]

    listing = json.loads(run_tcl("hardware", "list", "--json").stdout)
    rows = {r["platform"]: r for r in listing["platforms"]}
    assert rows["my-cpu"]["defined_in"] == str(user_registry)
    assert rows["my-cpu"]["family"] == "my-fam" and rows["my-cpu"]["isa"] == "x86-64 AVX2"
    assert rows["t4"]["defined_in"] == hardware.PACKAGED
    assert set(rows) == set(packaged["platforms"]) | {"my-cpu"}
    assert listing["user_registry"] == str(user_registry)
    text = run_tcl("hardware", "list").stdout
    line = next(ln for ln in text.splitlines() if ln.startswith("my-cpu "))
    assert line.split()[-1] == "user" and str(user_registry) in text

    p = hardware.get_platform("my-cpu")
    assert p.measurable and p.target == TARGET and p.threads == 1 and hardware.family_of("my-cpu") == "my-fam"


def test_a_platform_measures_with_its_targets_cores_unless_told(user_registry):
    hardware.add_family("my-fam", vendor="Me", architecture="Zen 4 at 1 GHz", isa="x86-64 AVX2")
    four = hardware.add_platform("four", "my-fam", target={**TARGET, "num-cores": 4})
    told = hardware.add_platform("told", "my-fam", target={**TARGET, "num-cores": 4}, threads=2)
    bare = hardware.add_platform("bare", "my-fam", target={"kind": "llvm"})
    assert (four.threads, told.threads, bare.threads) == (4, 2, None)  # None: measured on 1 thread


def test_a_cpu_target_without_num_cores_is_built_for_its_threads(user_registry, tmp_path):
    """MetaSchedule refuses a CPU target without num-cores (it used to stop `tcl collect` with a
    traceback): `add` and a hand-written entry alike get the platform's threads (else 1)."""
    hardware.add_family("my-fam", vendor="Me", architecture="Zen 4 at 1 GHz", isa="x86-64 AVX2")
    two = hardware.add_platform("two", "my-fam", target={"kind": "llvm", "mcpu": "haswell"}, threads=2)
    bare = hardware.add_platform("bare", "my-fam", target={"kind": "llvm"})
    assert two.target == {"kind": "llvm", "mcpu": "haswell", "num-cores": 2}
    assert bare.target == {"kind": "llvm", "num-cores": 1} and bare.threads is None
    raw = json.loads(user_registry.read_text())
    raw["platforms"]["by-hand"] = {"family": "my-fam", "target": {"kind": "llvm"}, "threads": 3}
    user_registry.write_text(json.dumps(raw))
    assert hardware.get_platform("by-hand").target == {"kind": "llvm", "num-cores": 3}
    assert hardware.with_num_cores({"kind": "cuda", "arch": "sm_80"}, 2) == {"kind": "cuda", "arch": "sm_80"}

    run_tcl("hardware", "add", "cli", "--family", "my-fam", "--target", '{"kind": "llvm"}')
    out = tmp_path / "db"
    run_tcl("collect", "--platform", "cli", "--out", out, "--workload", "dense_64", "--trials", "2")
    assert json.loads((out / "collect.json").read_text())["target"] == {"kind": "llvm", "num-cores": 1}
    assert len((out / "database_tuning_record.json").read_text().splitlines()) == 2


@pytest.mark.parametrize("args,message", [
    (["add", "x1", "--family", "no-such-family"], "unknown family 'no-such-family'"),
    (["add", "x1", "--family", "x86-sse", "--target", '{"kind": "llvm"'], "--target: not valid JSON"),
    (["add", "x1", "--family", "x86-sse", "--target", '["llvm"]'], "must be a JSON object with a 'kind'"),
    (["add", "x1", "--family", "x86-sse", "--target", '{"kind": "no-such-kind"}'], "TVM refuses"),
    (["add", "x1", "--family", "x86-sse", "--threads", "0"], "threads must be a positive integer"),
    (["add", "t4", "--family", "x86-sse"], "platform 't4' already exists (defined in package)"),
    (["add", "bad/name", "--family", "x86-sse"], "invalid platform name 'bad/name'"),
    (["add-family", "x86-sse", "--vendor", "a", "--architecture", "b", "--isa", "c"],
     "family 'x86-sse' already exists"),
])
def test_add_refuses_bad_input_and_leaves_the_registry_as_it_was(user_registry, args, message):
    _add_my_platform()
    before = user_registry.read_bytes()
    proc = run_tcl("hardware", *args, check=False)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert user_registry.read_bytes() == before


def test_a_duplicate_user_platform_is_refused(user_registry):
    _add_my_platform()
    before = user_registry.read_bytes()
    proc = run_tcl("hardware", "add", "my-cpu", "--family", "x86-sse", check=False)
    assert proc.returncode == 2 and f"platform 'my-cpu' already exists (defined in {user_registry})" in proc.stderr
    assert user_registry.read_bytes() == before


def test_a_broken_user_file_is_named_with_its_line(user_registry):
    user_registry.parent.mkdir(parents=True)
    user_registry.write_text('{\n  "platforms": {\n    "a": {"family": "x86-sse",}\n  }\n}\n')
    proc = run_tcl("hardware", "list", check=False)
    assert proc.returncode == 1 and f"{user_registry}: line 3: not valid JSON" in proc.stderr
    # a user entry may not redefine a packaged one: the model of a family must keep its meaning
    user_registry.write_text(json.dumps({"platforms": {"t4": {"family": "x86-sse"}}}))
    proc = run_tcl("hardware", "list", check=False)
    assert proc.returncode == 1 and "platform 't4' is already defined in package" in proc.stderr
    user_registry.write_text(json.dumps({"platforms": {"b": {"family": "nope"}}}))
    with pytest.raises(hardware.HardwareRegistryError, match=r"platform 'b': unknown family 'nope'"):
        hardware.get_platform("b")


def test_the_project_root_holds_the_user_registry(tmp_path, monkeypatch):
    monkeypatch.delenv(hardware.USER_REGISTRY_ENV, raising=False)
    project = tmp_path / "proj"
    (project / "data" / "deep").mkdir(parents=True)
    (project / "params.yaml").write_text("{}\n")
    run_tcl("hardware", "add", "my-t1", "--family", "x86-sse", cwd=project / "data" / "deep")
    assert "my-t1" in json.loads((project / "hardware.json").read_text())["platforms"]
    assert not (project / "data" / "deep" / "hardware.json").exists()
    assert hardware.project_root(project / "data" / "deep") == project.resolve()
    monkeypatch.chdir(project / "data")
    assert hardware.get_platform("my-t1").family == "x86-sse"


def test_ingest_split_and_predict_accept_a_user_platform(user_registry, tmp_path):
    from tcl.export import export_onnx
    from tcl.features import FeatureSet
    from tcl.models.checkpoint import save_checkpoint
    from tcl.models.nets import build_net

    _add_my_platform()
    records, features = tmp_path / "r.parquet", tmp_path / "f.npz"
    run_tcl("ingest", fixture_path("metaschedule/conv2d_small"), "--platform", "my-cpu", "--out", records)
    run_tcl("featurize", records, "--out", features)
    fs = FeatureSet.load(features)
    assert fs.platform == "my-cpu" and len(fs) > 0
    run_tcl("split", features, "--out-dir", tmp_path / "split", "--test-networks", "")
    assert len(FeatureSet.load(tmp_path / "split" / "train.npz")) + \
        len(FeatureSet.load(tmp_path / "split" / "valid.npz")) == len(fs)

    import torch

    torch.manual_seed(0)
    config = {"d_model": 8, "n_layers": 1, "d_state": 4, "expand": 1, "d_conv": 2}
    model = build_net("mamba", fs.x.shape[2], **config)
    save_checkpoint(tmp_path / "kb.pt", model, "mamba", config, dict(fs.meta))
    ours = export_onnx(tmp_path / "kb.pt", tmp_path / "mine.onnx", "my-fam")
    other = export_onnx(tmp_path / "kb.pt", tmp_path / "other.onnx", "x86-sse")
    # predict finds the family of the features' platform in the user registry
    out = json.loads(run_tcl("predict", features, "--model", ours, "--json").stdout)
    assert out["family"] == "my-fam" and out["n"] == len(fs)
    proc = run_tcl("predict", features, "--model", other, check=False)
    assert proc.returncode == 2 and "platform my-cpu is family 'my-fam'" in proc.stderr


def test_collect_accepts_a_user_platform(user_registry, tmp_path):
    _add_my_platform(target=None)
    proc = run_tcl("collect", "--platform", "my-cpu", "--out", tmp_path / "db", "--workload", "dense_64",
                   "--trials", "1", check=False)
    assert proc.returncode != 0 and "'my-cpu' has no TVM target" in proc.stderr
    assert "hardware.json" in proc.stderr and "--target" in proc.stderr  # where and how to fix it
    run_tcl("hardware", "add", "my-cpu-llvm", "--family", "my-fam", "--target", json.dumps(TARGET))
    # a tracker nobody listens on: collect resolves the user platform and its target, then stops
    # before measuring anything
    proc = run_tcl("collect", "--platform", "my-cpu-llvm", "--out", tmp_path / "db", "--workload", "dense_64",
                   "--trials", "1", "--rpc-tracker", "127.0.0.1:9", "--rpc-key", "k", check=False)
    assert proc.returncode == 2 and "RPC tracker 127.0.0.1:9 is unreachable" in proc.stderr
    settings = tmp_path / "db" / "collect.json"
    assert not settings.exists() or json.loads(settings.read_text())["target"] == TARGET


def test_measuring_a_platform_on_another_cpu_warns_and_the_database_records_the_host(user_registry, tmp_path):
    local = hardware.local_cpu_model()
    # the bundled platforms name the CPU the bundle was measured on
    bundled = hardware.get_platform("znver4-avx512-t2")
    assert bundled.host_cpu == "AMD EPYC" and bundled.host_cpuid == "AuthenticAMD family 25 model 17"
    zen4 = "AuthenticAMD family 25 model 17"
    assert hardware.host_mismatch(bundled, "AMD EPYC 9R14 96-Core Processor", zen4) is None
    why = hardware.host_mismatch(bundled, "Intel(R) Xeon(R) Processor @ 2.60GHz", "GenuineIntel family 6 model 106")
    assert "'AMD EPYC'" in why and "Intel(R) Xeon(R) Processor @ 2.60GHz" in why
    # a Zen 3 KVM guest reports the same model name: its CPUID tells it apart
    why = hardware.host_mismatch(bundled, "AMD EPYC", "AuthenticAMD family 25 model 1")
    assert f"'{zen4}'" in why and "'AuthenticAMD family 25 model 1'" in why
    assert hardware.host_mismatch(bundled, "AMD EPYC", "") is None  # no CPUID to read: the name decides
    assert hardware.local_cpu_id() == "" or hardware.local_cpu_id().count(" family ") == 1
    # a platform without host_cpu is any host's; `--host-cpu here` names this one
    _add_my_platform()
    assert hardware.host_mismatch(hardware.get_platform("my-cpu")) is None
    run_tcl("hardware", "add", "my-here", "--family", "my-fam", "--target", json.dumps(TARGET),
            "--threads", "1", "--host-cpu", "here")
    run_tcl("hardware", "add", "my-elsewhere", "--family", "my-fam", "--target", json.dumps(TARGET),
            "--threads", "1", "--host-cpu", "No Such CPU 9000")
    here = json.loads(user_registry.read_text())["platforms"]["my-here"]
    assert here["host_cpu"] == local and here.get("host_cpuid", "") == hardware.local_cpu_id()
    assert hardware.host_mismatch(hardware.get_platform("my-here")) is None
    why = hardware.host_mismatch(hardware.get_platform("my-elsewhere"))
    assert "'No Such CPU 9000'" in why and repr(local) in why

    # a real measurement here: the warning on stderr, the host and the mismatch in collect.json
    db = tmp_path / "db"
    proc = run_tcl("collect", "--platform", "my-elsewhere", "--out", db, "--workload", "dense_64",
                   "--trials", "1", "--min-repeat-ms", "1", "--json")
    assert json.loads(proc.stdout.splitlines()[-1])["measured"] == 1
    assert f"warning: {why}" in proc.stderr
    settings = json.loads((db / "collect.json").read_text())
    assert settings["host_cpu"] == local and settings["host_mismatch"] == why
    # over RPC the latencies are the device's: nothing to warn about
    from tcl.cli.data import warn_if_other_host
    from tcl.collect.measure import RpcSettings

    elsewhere = hardware.get_platform("my-elsewhere")
    assert warn_if_other_host(elsewhere, RpcSettings.from_options("127.0.0.1:9", "k")) == []
    assert warn_if_other_host(elsewhere, None) == [why]


# The vector ISA flags /proc/cpuinfo reports on two CPUs the project has run on: an AMD EPYC Zen 3
# KVM guest (no AVX-512) and an Intel Xeon Ice Lake server (AVX-512 without BF16)
ZEN3_FLAGS = {"sse", "sse2", "pni", "ssse3", "fma", "sse4_1", "sse4_2", "avx", "f16c", "sse4a", "avx2"}
ICELAKE_FLAGS = {"sse", "sse2", "pni", "ssse3", "fma", "sse4_1", "sse4_2", "avx", "f16c", "avx2", "avx512f",
                 "avx512dq", "avx512ifma", "avx512cd", "avx512bw", "avx512vl", "avx512vbmi", "avx512_vbmi2",
                 "avx512_vnni", "avx512_bitalg", "avx512_vpopcntdq"}


def test_a_target_this_cpu_cannot_run_is_refused_before_anything_is_measured(user_registry, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from tcl.cli import main

    znver4 = hardware.get_platform("znver4-avx512-t2")
    # what code built for each bundled target may use, against what each CPU reports
    assert {"avx512f", "avx512bw", "avx512vl"} <= set(hardware.missing_isa(znver4.target, ZEN3_FLAGS))
    assert hardware.missing_isa(hardware.get_platform("x86-avx2-t2").target, ZEN3_FLAGS) == []
    assert hardware.missing_isa(hardware.get_platform("x86-sse-t2").target, {"sse", "sse2"}) == []
    assert hardware.missing_isa(znver4.target, ICELAKE_FLAGS) == ["avx512bf16", "sse4a"]
    assert hardware.missing_isa({"kind": "llvm", "mattr": ["+avx512f"]}, ZEN3_FLAGS) == ["avx512f"]
    assert hardware.missing_isa({"kind": "llvm", "mtriple": "aarch64-linux-gnu"}, ZEN3_FLAGS) == []
    assert hardware.missing_isa(znver4.target, set()) == []  # flags unknown (another OS): no verdict

    # as seen from a Zen 3 host: every command that measures here refuses, before any output
    monkeypatch.setattr(hardware, "_host_cpu_flags", lambda: ZEN3_FLAGS)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/m.db")  # a tuning run's store, if one opened
    commands = {
        "collect": ["collect", "--platform", znver4.name, "--workload", "dense_64", "--trials", "1"],
        "collect --sample": ["collect", "--platform", znver4.name, "--workload", "dense_64", "--sample", "rdu",
                             "--budget", "1"],
        "tune": ["tune", "--platform", znver4.name, "--workload", "dense_64", "--trials", "1",
                 "--cost-model", "random", "--no-progress"],
    }
    for what, args in commands.items():
        out = tmp_path / what.replace(" ", "")
        res = CliRunner().invoke(main, [*args, "--out", str(out)])
        assert res.exit_code == 2, (what, res.output)
        assert "avx512f" in res.output and "lacks them" in res.output and "--rpc-tracker" in res.output, what
        assert not out.exists(), what
    params = tmp_path / "params.yaml"
    params.write_text(f"platforms: [x86-sse-t2, {znver4.name}]\n"
                      f"dataset: {{tasks: [dense_128_768_768], programs_per_task: 2, out: {tmp_path / 'ds'}}}\n")
    res = CliRunner().invoke(main, ["dataset", "collect", "--params", str(params)])
    assert res.exit_code == 1 and "avx512f" in res.output and not (tmp_path / "ds").exists()
    # over RPC the code runs on the device: no refusal (the unreachable tracker is what stops it)
    res = CliRunner().invoke(main, [*commands["tune"], "--out", str(tmp_path / "rpc"),
                                    "--rpc-tracker", "127.0.0.1:9", "--rpc-key", "k"])
    assert res.exit_code != 0 and "avx512f" not in res.output and "127.0.0.1:9" in res.output
    # a platform for this CPU, as the refusal suggests, is accepted
    hardware.add_platform("my-zen3", znver4.family, target={"kind": "llvm", "mcpu": "znver3"}, threads=1)
    hardware.require_measurable(hardware.get_platform("my-zen3"), here=True)

    # as seen from an Ice Lake host: measured, with a warning naming what it lacks
    monkeypatch.setattr(hardware, "_host_cpu_flags", lambda: ICELAKE_FLAGS)
    hardware.require_measurable(znver4, here=True)
    assert "avx512bf16" in hardware.isa_warning(znver4)
    assert hardware.isa_warning(hardware.get_platform("x86-avx2-t2")) is None
