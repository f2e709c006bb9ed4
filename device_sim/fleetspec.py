"""A fleet: which users, on which devices, personalised how. Read from a JSON file (docs/fleet.md):

    {"artifact": "artifacts/imu_cnn",
     "users": {"real": [10], "synthetic": 1000, "seed": 0, "sources": [10]},
     "devices": {"watch-app-low": 2, "watchos-extension": 1, "mcu-2mb": 1},
     "every_device": false,
     "micro_batch": {"watch-app-low": "auto", "*": 8},
     "personalise": {"epochs": 3, "lr_grid": [0.0003, 0.001]},
     "threads": 1, "max_retries": 3}

users.real: subjects of the built-in data set (none may be in the artifact's pretraining
population); users.synthetic: how many synthetic users (device_sim/synthusers.py), made from
users.sources (default: users.real). devices: the mix, device profile -> weight; each user
owns one device drawn by weight (seeded), or every device with "every_device": true.
micro_batch: per device ("*" for the rest): a number, "auto" (the planner's confirmed fastest
plan for that device's budget, device_sim/planner.py) or "artifact" (the artifact's plan,
the default). personalise: TrainConfig's settings (edgetrain/personalise.py) plus
"select" and "val_fraction". faults (tests and drills): {"<user>@<device>": "<point>:<n>"}
SIGKILLs that task's first attempt there (device_sim/faults.py), "worker:<point>:<n>" kills
the Ray worker that started it instead.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from device_sim.faults import kill_at
from device_sim.profiles import PROFILES
from device_sim.synthusers import SYNTHETIC_BASE
from edgetrain.jsonfile import read_json

WORKER_DRILL = "worker:"  # a fault that kills the run's Ray worker, not the run's process
PERSONALISE_KEYS = ("epochs", "lr", "lr_grid", "seed", "checkpoint_every", "patience",
                    "guard_margin", "adapt", "labels_per_class", "select", "val_fraction",
                    "accumulation_steps")


MAX_SPEC_BYTES = 1 << 20  # a fleet spec is a few hundred bytes of JSON
MAX_SYNTHETIC_USERS = 100_000
# personalise settings: (JSON kinds, what a value must be); TrainConfig checks the ranges
_KINDS = {"epochs": (int,), "lr": (int, float), "seed": (int,), "checkpoint_every": (int,),
          "patience": (int,), "guard_margin": (int,), "adapt": (str,),
          "labels_per_class": (int,), "select": (bool,), "val_fraction": (int, float),
          "accumulation_steps": (int,), "lr_grid": (list,)}


class SpecError(ValueError):
    """The fleet spec is malformed: the message says what, the value, and the fix."""


@dataclass(frozen=True)
class FleetSpec:
    artifact: str
    real_users: tuple[int, ...]
    synthetic_users: int
    seed: int
    sources: tuple[int, ...]
    devices: dict  # device profile -> weight
    every_device: bool = False
    micro_batch: dict = field(default_factory=dict)  # device or "*" -> int | "auto" | "artifact"
    personalise: dict = field(default_factory=dict)
    threads: int = 1
    max_retries: int = 3
    faults: dict = field(default_factory=dict)

    def users(self) -> list[int]:
        return [*self.real_users, *range(SYNTHETIC_BASE, SYNTHETIC_BASE + self.synthetic_users)]

    def devices_of(self, user: int) -> list[str]:
        """The devices `user` personalises on: one drawn from the mix by weight, or all."""
        names = sorted(self.devices)
        if self.every_device:
            return names
        w = np.array([self.devices[n] for n in names], dtype=float)
        rng = np.random.default_rng((self.seed, user, 1))
        return [names[int(rng.choice(len(names), p=w / w.sum()))]]

    def pairs(self) -> list[tuple[int, str]]:
        return [(u, d) for u in self.users() for d in self.devices_of(u)]

    def micro_batch_for(self, device: str):
        return self.micro_batch.get(device, self.micro_batch.get("*", "artifact"))

    def to_dict(self) -> dict:
        return asdict(self)

    def fingerprint(self) -> str:
        """What a re-run must share with the run whose results it keeps (faults excluded)."""
        d = {k: v for k, v in self.to_dict().items() if k != "faults"}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def _ints(v, what: str) -> tuple[int, ...]:
    if not isinstance(v, list) or not all(isinstance(i, int) and not isinstance(i, bool)
                                          for i in v):
        raise SpecError(f"{what} must be a list of subject numbers, got {v!r}; e.g. [8, 9, 10]")
    return tuple(v)


def parse_spec(doc: dict, base: Path = Path(".")) -> FleetSpec:
    """A FleetSpec from the JSON document; a relative artifact path is taken from `base` (the
    current folder, as for every path given to the CLI)."""
    if not isinstance(doc, dict):
        raise SpecError(f"a fleet spec is a JSON object, got {type(doc).__name__}")
    unknown = set(doc) - {"artifact", "users", "devices", "every_device", "micro_batch",
                          "personalise", "threads", "max_retries", "faults"}
    if unknown:
        raise SpecError(f"unknown fleet spec keys {sorted(unknown)}; see docs/fleet.md")
    if not isinstance(doc.get("artifact"), str):
        raise SpecError("the fleet spec needs \"artifact\": the exported artifact's folder")
    art = Path(doc["artifact"])
    art = (art if art.is_absolute() else base / art).resolve()
    users = doc.get("users", {})
    if not isinstance(users, dict):
        raise SpecError(f"\"users\" must be an object, got {users!r}; e.g. "
                        "{\"real\": [10], \"synthetic\": 100}")
    real = _ints(users.get("real", []), "users.real")
    synthetic = users.get("synthetic", 0)
    if not isinstance(synthetic, int) or isinstance(synthetic, bool) or not (
            0 <= synthetic <= MAX_SYNTHETIC_USERS):
        raise SpecError(f"users.synthetic must be a whole number from 0 to "
                        f"{MAX_SYNTHETIC_USERS:,}, got {synthetic!r}")
    seed = users.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise SpecError(f"users.seed must be a whole number, got {seed!r}")
    every = doc.get("every_device", False)
    if not isinstance(every, bool):
        raise SpecError(f"every_device must be true or false, got {every!r}")
    sources = _ints(users.get("sources", list(real)), "users.sources")
    if synthetic and not sources:
        raise SpecError("synthetic users are made from real subjects: give users.sources "
                        "(or users.real), e.g. [10]")
    if not real and not synthetic:
        raise SpecError("the fleet has no users: give users.real and/or users.synthetic")
    devices = doc.get("devices")
    if not isinstance(devices, dict) or not devices:
        raise SpecError(f"\"devices\" must map device profiles to weights, got {devices!r}; "
                        f"e.g. {{\"watch-app-low\": 1}}; profiles: {sorted(PROFILES)}")
    for name, w in devices.items():
        if name not in PROFILES:
            raise SpecError(f"unknown device {name!r}; choose from {sorted(PROFILES)} "
                            "(edgetrain devices)")
        if not isinstance(w, (int, float)) or isinstance(w, bool) or not w > 0:
            raise SpecError(f"device {name!r} has weight {w!r}; weights are numbers above 0")
    mb = doc.get("micro_batch", {})
    mb = {"*": mb} if not isinstance(mb, dict) else mb
    for k, v in mb.items():
        if v not in ("auto", "artifact") and not (isinstance(v, int) and not isinstance(
                v, bool) and v > 0):
            raise SpecError(f"micro_batch for {k!r} is {v!r}; use a positive number, \"auto\" "
                            "(the planner's choice) or \"artifact\" (its plan)")
    pers = doc.get("personalise", {})
    bad = set(pers) - set(PERSONALISE_KEYS) if isinstance(pers, dict) else {"<not an object>"}
    if bad:
        raise SpecError(f"unknown personalise settings {sorted(bad)}; known: "
                        f"{list(PERSONALISE_KEYS)}")
    check_personalise(pers)
    threads, retries = doc.get("threads", 1), doc.get("max_retries", 3)
    for what, v, lo in (("threads", threads, 1), ("max_retries", retries, 0)):
        if not isinstance(v, int) or isinstance(v, bool) or v < lo:
            raise SpecError(f"{what} must be a whole number >= {lo}, got {v!r}")
    faults = doc.get("faults", {})
    if not isinstance(faults, dict):
        raise SpecError(f"\"faults\" must map \"<user>@<device>\" to a fault, got {faults!r}")
    for k, v in faults.items():
        try:
            kill_at(str(v).removeprefix(WORKER_DRILL))
        except ValueError as e:
            raise SpecError(f"fault {k!r}: {e}") from None
    return FleetSpec(artifact=str(art), real_users=real, synthetic_users=synthetic,
                     seed=seed, sources=sources, devices=dict(devices),
                     every_device=every, micro_batch=dict(mb),
                     personalise=dict(pers), threads=threads, max_retries=retries,
                     faults=dict(faults))


def check_personalise(pers: dict) -> None:
    """Each personalise setting of the correct JSON kind, and together a valid TrainConfig
    (ranges: edgetrain/personalise.py), so that a bad one fails before any run starts."""
    from edgetrain.personalise import TrainConfig

    for k, v in pers.items():
        kinds = _KINDS[k]
        if isinstance(v, bool) and bool not in kinds or not isinstance(v, kinds) or (
                k == "lr_grid" and not all(isinstance(x, (int, float)) and not isinstance(
                    x, bool) for x in v)):
            want = {int: "a whole number", float: "a number", bool: "true or false",
                    str: "a string", list: "a list of numbers"}[kinds[-1]]
            raise SpecError(f"personalise.{k} is {v!r}, not {want}; see docs/fleet.md")
    val = pers.get("val_fraction", 0.25)
    if not 0 < val < 1:
        raise SpecError(f"personalise.val_fraction is {val!r}; it must lie between 0 and 1")
    try:
        TrainConfig(**{k: v for k, v in pers.items() if k not in ("select", "val_fraction",
                                                                  "lr_grid")},
                    lrs=tuple(pers["lr_grid"]) if pers.get("lr_grid") else None)
    except ValueError as e:
        raise SpecError(f"personalise settings: {e}") from None


def load_spec(path: str | os.PathLike) -> FleetSpec:
    """The spec at `path`: a regular file of at most MAX_SPEC_BYTES of JSON, checked."""
    p = Path(path)
    if not os.path.lexists(p):
        raise SpecError(f"fleet spec {p} does not exist; write one (docs/fleet.md)")
    try:
        doc = read_json(p, MAX_SPEC_BYTES, "fleet spec", "Give the path of a .json spec "
                        "(docs/fleet.md)", SpecError)
    except OSError as e:
        raise SpecError(f"cannot read fleet spec {p}: {e}") from None
    return parse_spec(doc)
