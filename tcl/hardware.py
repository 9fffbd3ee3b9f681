"""Hardware registry: platform -> hardware family, from the packaged data file and the project's own.

Transfer helps within a family and can hurt across families (paper Table 5), so every model,
registry entry and source-selection decision is keyed by the family a platform belongs to.

Two files make the registry. The packaged one (tcl/data/hardware.json) lists the platforms TCL
ships data or models for. A project adds its own platforms and families without editing the
package, in a user registry with the same layout (`tcl hardware add`, `tcl hardware add-family`):
the file named by ``$TCL_HARDWARE``, else ``hardware.json`` at the project root. The project root
is the nearest directory, from the working directory upwards, holding ``params.yaml``,
``dvc.yaml`` or ``.git``; the working directory itself when there is none. User entries add to
the packaged ones and never replace them: a name defined twice is an error, so a model trained
for a packaged platform's family keeps meaning the same hardware.

This module is the one place that reads either file.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

REGISTRY_FILE = "hardware.json"
USER_REGISTRY_ENV = "TCL_HARDWARE"
PACKAGED = "package"  # `defined_in` of the packaged entries; user entries carry their file's path
PROJECT_MARKERS = ("params.yaml", "dvc.yaml", ".git")
# platform names become folder names and family names registered-model names (tcl-kb-<family>)
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class HardwareRegistryError(ValueError):
    """A registry file or a new entry that cannot be used; the message names the file and entry."""


@dataclass(frozen=True)
class Family:
    name: str
    vendor: str
    architecture: str
    isa: str
    defined_in: str = PACKAGED


TARGET_EXAMPLE = '{"kind": "llvm", "mcpu": "znver4", "num-cores": 2}'


@dataclass(frozen=True)
class Platform:
    name: str
    family: str
    vendor: str
    architecture: str
    isa: str
    cpu: str
    cores: int | None = None
    compute_capability: str | None = None
    source: str = ""
    target: dict | None = None  # TVM target JSON, for platforms `tcl collect` can measure
    threads: int | None = None  # TVM_NUM_THREADS used when measuring
    restricted: str = ""
    # what the local CPU's model name must contain (case-insensitive) for a measurement taken on
    # this host, without RPC, to be this platform's; empty: any host (see host_mismatch)
    host_cpu: str = ""
    # and, where set, the CPUID /proc/cpuinfo gives that host (`local_cpu_id`): KVM guests of two CPU
    # generations can report one model name (the bundle's Zen 4 and a Zen 3 are both "AMD EPYC")
    host_cpuid: str = ""
    extra: dict = field(default_factory=dict)
    defined_in: str = PACKAGED

    @property
    def measurable(self) -> bool:
        return self.target is not None


@dataclass(frozen=True)
class Registry:
    version: int
    families: dict[str, Family]
    platforms: dict[str, Platform]
    user_path: Path  # where the user registry is read from and written to (may not exist)


def project_root(start: str | os.PathLike | None = None) -> Path:
    """The nearest directory from `start` (default: the working directory) upwards holding a
    project marker (params.yaml, dvc.yaml, .git); `start` itself when none does."""
    here = Path(start or os.getcwd()).resolve()
    for d in (here, *here.parents):
        if any((d / m).exists() for m in PROJECT_MARKERS):
            return d
    return here


def user_registry_path() -> Path:
    env = os.environ.get(USER_REGISTRY_ENV)
    return Path(env).expanduser().resolve() if env else project_root() / REGISTRY_FILE


def _read_json(text: str, where: str) -> dict:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HardwareRegistryError(f"{where}: line {exc.lineno}: not valid JSON ({exc.msg})") from None
    if not isinstance(raw, dict):
        raise HardwareRegistryError(f"{where}: expected a JSON object with 'families' and 'platforms'")
    for key in ("families", "platforms"):
        if not isinstance(raw.setdefault(key, {}), dict):
            raise HardwareRegistryError(f"{where}: '{key}' must be a JSON object")
    return raw


def check_target(target, where: str = "target") -> dict:
    """A TVM target as the registry stores it: a JSON object with a string 'kind'."""
    if isinstance(target, str):
        try:
            target = json.loads(target)
        except json.JSONDecodeError as exc:
            raise HardwareRegistryError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno}); "
                                        f"give an object such as '{TARGET_EXAMPLE}'") from None
    if not isinstance(target, dict) or not isinstance(target.get("kind"), str) or not target["kind"]:
        raise HardwareRegistryError(f"{where}: a TVM target must be a JSON object with a 'kind' "
                                    f"(e.g. {{\"kind\": \"llvm\"}}), got {target!r}")
    return target


def with_num_cores(target: dict, threads: int | None) -> dict:
    """A CPU (llvm) target with its ``num-cores``: MetaSchedule refuses to tune or sample for one
    without it. A target that lacks it is built for the threads it is measured with (else 1, the
    threads it is then measured with)."""
    if target.get("kind") != "llvm" or "num-cores" in target:
        return target
    return {**target, "num-cores": threads or 1}


def _check_name(name, what: str, where: str) -> None:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise HardwareRegistryError(f"{where}: invalid {what} name {name!r} "
                                    "(letters, digits, '-', '_', '.'; starting with a letter or digit)")


def _positive_int(value, what: str, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise HardwareRegistryError(f"{where}: {what} must be a positive integer, got {value!r}")
    return value


def _entries(section: dict, kind: str, where: str, known: dict):
    """(name, entry, where-text) of a section's entries of `kind` ("family" or "platform"), each
    checked for a valid, new name and an object body."""
    for name, entry in section.items():
        at = f"{where}: {kind} {name!r}"
        _check_name(name, kind, where)
        if name in known:
            raise HardwareRegistryError(f"{at} is already defined in {known[name].defined_in}")
        if not isinstance(entry, dict):
            raise HardwareRegistryError(f"{at}: expected a JSON object")
        yield name, entry, at


def _families(raw: dict, where: str, defined_in: str, known: dict[str, Family]) -> dict[str, Family]:
    out = {}
    for name, f, at in _entries(raw["families"], "family", where, known):
        missing = [k for k in ("vendor", "architecture", "isa") if not isinstance(f.get(k), str) or not f[k]]
        if missing:
            raise HardwareRegistryError(f"{at}: missing {', '.join(missing)}")
        out[name] = Family(name, f["vendor"], f["architecture"], f["isa"], defined_in)
    return out


def _platforms(raw: dict, where: str, defined_in: str, families: dict[str, Family],
               known: dict[str, Platform]) -> dict[str, Platform]:
    out = {}
    for name, p, at in _entries(raw["platforms"], "platform", where, known):
        fam = families.get(p.get("family"))
        if fam is None:
            raise HardwareRegistryError(f"{at}: unknown family {p.get('family')!r} "
                                        f"(known: {', '.join(sorted(families))})")
        target = p.get("target")
        threads = _positive_int(p.get("threads"), "threads", at)
        out[name] = Platform(
            name=name,
            family=fam.name,
            vendor=fam.vendor,
            architecture=fam.architecture,
            isa=fam.isa,
            cpu=str(p.get("cpu", "")),
            cores=_positive_int(p.get("cores"), "cores", at),
            compute_capability=p.get("compute_capability"),
            source=str(p.get("source", "")),
            target=None if target is None else with_num_cores(check_target(target, f"{at}: target"), threads),
            threads=threads,
            restricted=str(p.get("restricted", "")),
            host_cpu=str(p.get("host_cpu", "")),
            host_cpuid=str(p.get("host_cpuid", "")),
            defined_in=defined_in,
        )
    return out


def _merge(packaged: dict, user: dict | None, user_path: Path) -> Registry:
    families = _families(packaged, f"tcl/data/{REGISTRY_FILE}", PACKAGED, {})
    platforms = _platforms(packaged, f"tcl/data/{REGISTRY_FILE}", PACKAGED, families, {})
    if user is not None:
        families.update(_families(user, str(user_path), str(user_path), families))
        platforms.update(_platforms(user, str(user_path), str(user_path), families, platforms))
    return Registry(int(packaged["version"]), families, platforms, user_path)


def _read_packaged() -> dict:
    return _read_json(resources.files("tcl.data").joinpath(REGISTRY_FILE).read_text(),
                      f"tcl/data/{REGISTRY_FILE}")


def _read_user(path: Path) -> dict | None:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise HardwareRegistryError(f"{path}: cannot read the hardware registry ({exc.strerror})") from None
    return _read_json(text, str(path))


_cache: dict[tuple, Registry] = {}


def load_registry() -> Registry:
    """The packaged registry merged with the user's; re-read when the user file changes."""
    path = user_registry_path()
    try:
        st = path.stat()
        key = (str(path), st.st_mtime_ns, st.st_size)
    except OSError:
        key = (str(path), None, None)
    if key not in _cache:
        _cache.clear()
        _cache[key] = _merge(_read_packaged(), _read_user(path), path)
    return _cache[key]


def platforms() -> dict[str, Platform]:
    return load_registry().platforms


def get_platform(name: str) -> Platform:
    reg = load_registry()
    try:
        return reg.platforms[name]
    except KeyError:
        raise KeyError(
            f"unknown platform {name!r}; known platforms: {', '.join(sorted(reg.platforms))} "
            f"(add one with `tcl hardware add {name} --family FAMILY --target '{TARGET_EXAMPLE}'`; "
            f"--target makes it measurable by collect/tune; kept in {reg.user_path})"
        ) from None


def require_measurable(platform: Platform, here: bool = False) -> None:
    """ValueError, saying how to fix it, unless `platform` has a TVM target to measure with and,
    measured `here` (on this host, not over RPC), this host's CPU can run the code it builds."""
    if not platform.measurable:
        edit = ("" if platform.defined_in == PACKAGED else
                f"add a \"target\" (e.g. {TARGET_EXAMPLE}) to its entry in {platform.defined_in}, or ")
        raise ValueError(
            f"platform {platform.name!r} has no TVM target in the hardware registry: {edit}register "
            f"it under a new name with `tcl hardware add NAME --family {platform.family} "
            f"--target '{TARGET_EXAMPLE}'`")
    if here:
        require_runnable_here(platform.name, platform.target)


def require_runnable_here(name: str, target: dict) -> None:
    """ValueError, saying what to do instead, when this host's CPU lacks a baseline ISA extension
    (SSE to AVX-512's first generation) that code built for platform `name`'s `target` uses."""
    missing = [f for f in missing_isa(target) if _BASELINE_ISA.match(f)]
    if missing:
        raise ValueError(
            f"{_lacking(name, target, missing, 'uses')}, so the programs measured here would die on their "
            f"first such instruction: measure over --rpc-tracker on the platform's hardware, or "
            f"`tcl hardware add` a platform for this CPU (e.g. --target '{{\"kind\": \"llvm\", \"mcpu\": "
            f"\"{_host_llvm_cpu()}\"}}')")


def isa_warning(platform: Platform) -> str | None:
    """What measuring `platform` here risks when this host lacks some of its target's later ISA
    extensions (e.g. avx512bf16 on an AVX-512 CPU without it; `require_measurable` refuses the
    baseline ones): a program that uses one dies, recorded as a failed run. None when nothing lacks."""
    if not platform.measurable:
        return None
    missing = missing_isa(platform.target)
    if not missing or any(_BASELINE_ISA.match(f) for f in missing):  # none, or refused anyway
        return None
    return f"{_lacking(platform.name, platform.target, missing, 'may use')}: a program that uses one fails its run here"


def _lacking(name: str, target: dict, missing: list[str], uses: str) -> str:
    """"platform N builds code for T, which <uses> X, Y; this host's CPU (C) lacks them"."""
    return (f"platform {name!r} builds code for {_describe_target(target)}, which {uses} {', '.join(missing)}; "
            f"this host's CPU ({local_cpu_model()}) lacks {'it' if len(missing) == 1 else 'them'}")


# The x86 ISA extensions a target's generated code may use, by LLVM's feature names; the rest of
# LLVM's feature set is tuning hints (fast-*, slow-*, prefer-*) that no CPU reports.
_X86_ISA = re.compile(r"^(sse[234]?(\.[12])?|ssse3|sse4a|avx(2|512[a-z0-9]+|vnni)?|fma4?|f16c|amx-[a-z0-9]+)$")
# Those that ordinary vectorized float code is built from (up to AVX-512's first generation): a
# host without one cannot run the target's programs at all. The later ones (bf16, vnni, ifma,
# vbmi, fp16, amx, ...) appear only in code that asks for them, so their lack is a warning.
_BASELINE_ISA = re.compile(r"^(sse[234]?(\.[12])?|ssse3|avx2?|fma|f16c|avx512(f|bw|cd|dq|vl))$")
# LLVM's name -> /proc/cpuinfo's, where they differ (avx512 extensions are handled in _host_has)
_CPUINFO_NAME = {"sse3": "pni", "sse4.1": "sse4_1", "sse4.2": "sse4_2", "avxvnni": "avx_vnni"}


def missing_isa(target: dict, host_flags: set[str] | None = None) -> list[str]:
    """The x86 ISA extensions (LLVM's names) that code built for the llvm `target` may use and this
    host's CPU does not report (`host_flags`: /proc/cpuinfo's ``flags``, read when None). Empty for
    a non-CPU target, a target of another architecture, and a host whose flags cannot be read."""
    if target.get("kind") != "llvm":
        return []
    flags = _host_cpu_flags() if host_flags is None else host_flags
    if not flags:
        return []
    from tvm.target import Target
    from tvm.target.codegen import llvm_get_cpu_features

    features = {str(f) for f in llvm_get_cpu_features(Target(target))}
    return sorted(f for f in features if _X86_ISA.match(f) and not _host_has(f, flags))


def _host_has(feature: str, flags: set[str]) -> bool:
    names = {feature, _CPUINFO_NAME.get(feature, feature), feature.replace("-", "_")}
    if feature.startswith("avx512"):  # cpuinfo: avx512f, avx512bw, ... but avx512_vnni, avx512_bf16, ...
        names.add("avx512_" + feature[len("avx512"):])
    return bool(names & flags)


def _host_cpu_flags() -> set[str]:
    """This host's x86 CPU flags (/proc/cpuinfo); empty when unknown (another OS or architecture)."""
    return set(_cpuinfo().get("flags", "").split())


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo ({} where there is none to read)."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if not key.strip():
                break  # the next processor's block: the same CPU
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def _host_llvm_cpu() -> str:
    from tvm.target.codegen import llvm_get_system_cpu

    return str(llvm_get_system_cpu())


def _describe_target(target: dict) -> str:
    parts = [f"{k} {target[k]}" for k in ("mtriple", "mcpu", "mattr") if target.get(k)]
    return "an llvm target with " + ", ".join(parts) if parts else "a generic llvm target"


def family_of(platform: str) -> str:
    return get_platform(platform).family


def _write_user(update) -> Registry:
    """Apply `update(raw)` to the user file's JSON, check the result loads, and replace the file."""
    from .io import atomic_write_json

    reg = load_registry()
    path = reg.user_path
    raw = _read_user(path) or {"version": 1, "families": {}, "platforms": {}}
    update(raw)
    merged = _merge(_read_packaged(), raw, path)  # refuses anything a later load would refuse
    atomic_write_json(path, raw)
    return merged


def add_family(name: str, vendor: str, architecture: str, isa: str) -> Family:
    """Add a hardware family to the user registry; refuses a name that exists."""
    reg = load_registry()
    _check_name(name, "family", "new family")
    if name in reg.families:
        raise HardwareRegistryError(f"family {name!r} already exists (defined in {reg.families[name].defined_in})")

    def update(raw):
        raw["families"][name] = {"vendor": vendor, "architecture": architecture, "isa": isa}

    return _write_user(update).families[name]


def add_platform(name: str, family: str, target: dict | str | None = None, threads: int | None = None,
                 cpu: str = "", cores: int | None = None, restricted: str = "",
                 source: str = "user", host_cpu: str = "", host_cpuid: str = "") -> Platform:
    """Add a platform of an existing family to the user registry; refuses a name that exists."""
    reg = load_registry()
    _check_name(name, "platform", "new platform")
    if name in reg.platforms:
        raise HardwareRegistryError(f"platform {name!r} already exists (defined in "
                                    f"{reg.platforms[name].defined_in})")
    if family not in reg.families:
        raise HardwareRegistryError(f"unknown family {family!r} (known: {', '.join(sorted(reg.families))}); "
                                    f"add it first with `tcl hardware add-family {family} --vendor ... "
                                    "--architecture ... --isa ...`")
    entry = {"family": family, "cpu": cpu, "source": source}
    if target is not None:
        entry["target"] = check_target(target, "--target")
        if threads is None and "num-cores" in entry["target"]:
            threads = entry["target"]["num-cores"]  # measure with the threads the programs are built for
    for key, value in (("threads", threads), ("cores", cores)):
        if value is not None:
            entry[key] = _positive_int(value, key, f"platform {name!r}")
    if restricted:
        entry["restricted"] = restricted
    if host_cpu:
        entry["host_cpu"] = host_cpu
    if host_cpuid:
        entry["host_cpuid"] = host_cpuid

    def update(raw):
        raw["platforms"][name] = entry

    return _write_user(update).platforms[name]


def local_cpu_model() -> str:
    """This host's CPU model name (/proc/cpuinfo's first ``model name``), else what Python knows."""
    import platform as pyplatform

    return _cpuinfo().get("model name") or pyplatform.processor() or pyplatform.machine() or "unknown"


def local_cpu_id() -> str:
    """This host's CPU as /proc/cpuinfo identifies it, "<vendor_id> family <cpu family> model
    <model>" (e.g. "AuthenticAMD family 25 model 17", a Zen 4); "" where it does not say."""
    fields = _cpuinfo()
    if not all(fields.get(k) for k in ("vendor_id", "cpu family", "model")):
        return ""
    return f"{fields['vendor_id']} family {fields['cpu family']} model {fields['model']}"


def host_mismatch(platform: Platform, local_cpu: str | None = None, local_id: str | None = None) -> str | None:
    """Why a measurement taken here (no RPC) would not be `platform`'s, or None when it would.

    The bundled platforms were measured on one AMD EPYC: the same target on another CPU runs, but
    its latencies (and a model's ranking of them) belong to that CPU, not to the platform whose
    data and KB carry the name. A platform with ``host_cpu`` is checked on the model name
    (`local_cpu`, this host's when None), one with ``host_cpuid`` on the CPUID (`local_id`).
    """
    fix = (f"its latencies are this CPU's, not {platform.name}'s (measure over --rpc-tracker on the "
           f"platform's hardware, or `tcl hardware add` a platform for this CPU)")
    local = local_cpu if local_cpu is not None else local_cpu_model()
    if platform.host_cpu and platform.host_cpu.lower() not in local.lower():
        return (f"platform {platform.name!r} is measured on a CPU whose model name contains "
                f"{platform.host_cpu!r} (hardware registry, defined in {platform.defined_in}); this host is "
                f"{local!r}: {fix}")
    here = local_id if local_id is not None else local_cpu_id()
    if platform.host_cpuid and here and here != platform.host_cpuid:
        return (f"platform {platform.name!r} is measured on the CPU /proc/cpuinfo identifies as "
                f"{platform.host_cpuid!r} (hardware registry, defined in {platform.defined_in}); this host's "
                f"is {here!r} ({local}): {fix}")
    return None
