"""Hardware registry: platform -> hardware family, read from a versioned data file.

Transfer helps within a family and can hurt across families (paper Table 5), so every model,
registry entry and source-selection decision is keyed by the family a platform belongs to.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources

REGISTRY_FILE = "hardware.json"


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
    extra: dict = field(default_factory=dict)

    @property
    def measurable(self) -> bool:
        return self.target is not None


def _load() -> tuple[int, dict[str, Platform]]:
    raw = json.loads(resources.files("tcl.data").joinpath(REGISTRY_FILE).read_text())
    families = raw["families"]
    platforms = {}
    for name, p in raw["platforms"].items():
        fam = families[p["family"]]
        platforms[name] = Platform(
            name=name,
            family=p["family"],
            vendor=fam["vendor"],
            architecture=fam["architecture"],
            isa=fam["isa"],
            cpu=p["cpu"],
            cores=p.get("cores"),
            compute_capability=p.get("compute_capability"),
            source=p.get("source", ""),
            target=p.get("target"),
            threads=p.get("threads"),
            restricted=p.get("restricted", ""),
        )
    return raw["version"], platforms


REGISTRY_VERSION, PLATFORMS = _load()


def get_platform(name: str) -> Platform:
    try:
        return PLATFORMS[name]
    except KeyError:
        raise KeyError(
            f"unknown platform {name!r}; known platforms: {', '.join(sorted(PLATFORMS))} "
            f"(add it to tcl/data/{REGISTRY_FILE})"
        ) from None


def family_of(platform: str) -> str:
    return get_platform(platform).family
