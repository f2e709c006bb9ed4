"""The stack bench's configurations (C1-C6), population recipes, learning-rate sweep, and
the resumable result store under bench/results/stack/ (see bench/stack.py)."""
from __future__ import annotations

import functools
import hashlib
import json
import shutil
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from common import ROOT, code_commit, command_line, stamp
from edgetrain.atomicfile import atomic_write_bytes
from edgetrain.manifest import sha256_file

EFFECTIVE_BATCH = 32  # windows per optimizer step, every configuration (the seed's C1 peak
# of 9.3 GB implies a larger ResNet-50 batch still; 32 keeps 4 steps per epoch of one user)
HELD_OUT_USERS = (8, 9, 10)  # personalised and tested; never in the population
PATCHES_PER_WINDOW = 49  # 224x224 image, 32x32 patches
DENSITY = 0.1  # DST: kept fraction of Conv/Linear weights (ERK allocation)
PARALLEL_RUNS = 2  # personalisation runs at once (not timed; --threads 1 each)
PROFILE = "watch-app-low"  # the watch-class profile of the scenario metrics (64 MiB)
PERSONALISE = {"epochs": 2}  # plus each network's learning rate, chosen by the sweep below
ARTIFACT_LR = 3e-4  # the default written into artifacts; personalisation passes --lr
LR_CANDIDATES = (3e-5, 1e-4, 3e-4)  # the sweep: each population model x each held-out user
ACCURACY_WINDOWS_PER_MICRO_BATCH = 8  # accuracy runs (sweeps, tests) merge smaller micro-batches
VAL_FRACTION = 0.25  # ...trains on the first 75% of each personalisation-arm recording and
# validates on the last 25% (edgetrain.data.validation_split): the test arm is never read
MASK_UPDATES = {"mask_update": "rigl", "mask_every": 2, "drop_fraction": 0.1, "mask_end": 0.75}
STATE = ROOT / "bench" / "results" / "stack"
ARTIFACTS = ROOT / ".cache" / "stack"


@dataclass(frozen=True)
class NetRecipe:
    """Population training of one network (exporters.models.pretrain.PretrainConfig fields)."""
    model: str
    epochs: int
    batch: int
    lr: float
    dst_epochs: int


RECIPES = {
    # 2 cores set the 224x224 budgets: a ResNet-50 epoch takes ~13 min, MobileNetV1 ~3.5 min.
    "resnet50": NetRecipe("resnet50", epochs=3, batch=16, lr=1e-3, dst_epochs=1),
    "mobilenet_v1": NetRecipe("mobilenet_v1", epochs=5, batch=16, lr=2e-3, dst_epochs=1),
    "patch_mobilenet": NetRecipe("patch_mobilenet", epochs=8, batch=64, lr=3e-3, dst_epochs=2),
    "imu_cnn": NetRecipe("imu_cnn", epochs=8, batch=64, lr=3e-3, dst_epochs=0),
}
UPDATE_DEVICES = {"mcu-2mb": 2 * 1024 * 1024}  # budgets an `auto:<device>` update plan fits
# Configurations whose network has population models for a data set with sessions: besides
# the watch data's other arm (every row's test, so rows compare with C1), their gain is
# measured there, on the later session of every user (a population model per fold of held-out
# users, bench/personalise.py's folds): what a wearer lives through.
CROSS_SESSION = {"C8": ("hapt", "later-session")}


@dataclass(frozen=True)
class StackConfig:
    name: str
    network: str
    sparse: bool
    recompute: str  # exporters.plans.recompute planner
    micro_batch: int  # items (images, or patches for C6) per micro-batch
    summary: str
    # what trains (exporters/plans/updateplans.py), or "auto:<device>": the update search's choice
    # for that device's budget (exporters/plans/updatesearch.py)
    update: str = "all"

    @property
    def items_per_window(self) -> int:
        return PATCHES_PER_WINDOW if self.network == "patch_mobilenet" else 1

    @property
    def accumulation(self) -> int:
        items = EFFECTIVE_BATCH * self.items_per_window
        assert items % self.micro_batch == 0, (self.name, items, self.micro_batch)
        return items // self.micro_batch

    def key(self) -> str:
        config = asdict(self)
        if self.update == "all":  # the rows from before update plans keep their names
            del config["update"]
        blob = json.dumps({"config": config, "recipe": asdict(RECIPES[self.network]),
                           "density": DENSITY, "held_out": HELD_OUT_USERS}, sort_keys=True)
        return f"{self.name}-{hashlib.sha256(blob.encode()).hexdigest()[:10]}"

    def personalise_key(self) -> str:
        """key() plus the personalisation recipe with the chosen learning rate: a new recipe
        never reuses old runs. '-p-lr-pending' until this model's sweep has finished. How a
        step's windows are split into micro-batches is not in it: the update is the same
        (merged_micro_batches), and each run says its split (the accuracy table shows it)."""
        lr = chosen_lr(self)
        if lr is None:
            return f"{self.key()}-p-lr-pending"
        return f"{self.key()}-p{recipe_hash(self, {**PERSONALISE, 'lr': lr})}"

    def sweep_config(self) -> "StackConfig":
        """The configuration whose artifact the learning-rate sweep runs for this population
        model: the first with the same network and sparsity. C2-C4 share C2's sweep, as they
        train the same model with the same mathematics (BatchNorm is frozen on the device, so
        micro-batching and recomputation change memory and time, not the update)."""
        return next(x for x in STACK if (x.network, x.sparse, x.update) ==
                    (self.network, self.sparse, self.update))


def merged_micro_batches(c: StackConfig) -> tuple[int, int] | None:
    """(micro-batch items, accumulation) of `c`'s accuracy runs, the sweep's and the tests',
    where its micro-batch holds fewer than ACCURACY_WINDOWS_PER_MICRO_BATCH windows (C4-C7:
    one window, or one patch); None where it keeps its own. The same update: BatchNorm is
    frozen on the device and the step sums the gradients of the same EFFECTIVE_BATCH windows
    scaled by 1/accumulation (tests/test_micro_batch_split.py), so accuracy is unchanged and
    8x fewer runtime calls run. Memory and time are measured at the configuration's own
    micro-batch (stage measure)."""
    items = ACCURACY_WINDOWS_PER_MICRO_BATCH * c.items_per_window
    if c.micro_batch >= items:
        return None
    return items, EFFECTIVE_BATCH // ACCURACY_WINDOWS_PER_MICRO_BATCH


STACK = [
    StackConfig("C1", "resnet50", False, "none", EFFECTIVE_BATCH, "ResNet-50"),
    StackConfig("C2", "resnet50", True, "none", EFFECTIVE_BATCH, "+ dynamic sparse training"),
    StackConfig("C3", "resnet50", True, "sqrt", EFFECTIVE_BATCH, "+ gradient checkpointing"),
    StackConfig("C4", "resnet50", True, "sqrt", 1, "+ micro-batching"),
    StackConfig("C5", "mobilenet_v1", True, "sqrt", 1, "MobileNetV1 (with C2-C4)"),
    StackConfig("C6", "patch_mobilenet", True, "sqrt", 1, "+ patching (32x32)"),
    StackConfig("C7", "patch_mobilenet", True, "sqrt", 1, "+ sparse update (head only)",
                update="head"),
    StackConfig("C8", "imu_cnn", False, "none", 8, "raw-IMU 1-D CNN, the update plan that "
                "fits mcu-2mb", update="auto:mcu-2mb"),
]


def pretrain_config(network: str, sparse: bool):
    from exporters.models.dst import DstConfig
    from exporters.models.pretrain import PretrainConfig

    r = RECIPES[network]
    dst = DstConfig(density=DENSITY, epochs=r.dst_epochs) if sparse else None
    return PretrainConfig(model=network, width=1.0 if network != "imu_cnn" else None, holdout_user=HELD_OUT_USERS[-1],
                          also_held_out=HELD_OUT_USERS[:-1], epochs=r.epochs, batch=r.batch,
                          lr=r.lr, dst=dst)


def session_pretrain_config(c: "StackConfig", fold: tuple[int, ...]):
    """The population model of `c`'s network for one fold of its cross-session data set: the
    stack's recipe for the network, pretrained on every other user of that data set."""
    from exporters.models.pretrain import PretrainConfig

    assert not c.sparse, "cross-session rows are dense networks"
    r = RECIPES[c.network]
    return PretrainConfig(model=c.network, width=None, holdout_user=fold[0],
                          also_held_out=fold[1:], epochs=r.epochs, batch=r.batch, lr=r.lr,
                          dataset=CROSS_SESSION[c.name][0])


def session_folds(c: "StackConfig") -> tuple[tuple[int, ...], ...]:
    from personalise import folds

    return folds(CROSS_SESSION[c.name][0])


def session_users(c: "StackConfig") -> tuple[int, ...]:
    """Every user of `c`'s cross-session data set (none when `c` has none)."""
    if c.name not in CROSS_SESSION:
        return ()
    return tuple(u for fold in session_folds(c) for u in fold)


def personalise_name(c: "StackConfig", user: int, session: bool = False) -> str:
    """A test run's result name: the watch data's other arm, or (`session`) the later session
    of `c`'s cross-session data set."""
    where = f"-{CROSS_SESSION[c.name][0]}" if session else ""
    return f"personalise-{c.personalise_key()}{where}-user{user}"


def recipe_hash(c: StackConfig, personalise: dict, **extra) -> str:
    """6 hex digits naming a personalisation recipe (and its mask updates on sparse models)."""
    blob = json.dumps({"personalise": personalise,
                       "masks": MASK_UPDATES if c.sparse else None, **extra}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:6]


@functools.lru_cache(maxsize=None)
def population_key(network: str, sparse: bool) -> str:
    """The cache key of the stack's population model of `network` (its recipe and the
    pretraining code's versions). A sweep ranks rates for one model: its result records the
    key, and a new model (its pretraining changed) sweeps again (current)."""
    from exporters.models.pretrain import cache_key

    return cache_key(pretrain_config(network, sparse))[:8]


def sweep_name(rep: StackConfig, lr: float, user: int) -> str:
    v = recipe_hash(rep, PERSONALISE, val_fraction=VAL_FRACTION)
    return f"lrsweep-{rep.key()}-v{v}-lr{lr:g}-user{user}"


def sweep_table(c: StackConfig) -> dict[float, list[float | None]]:
    """Validation accuracy after personalisation, per candidate lr, per held-out user."""
    rep = c.sweep_config()
    return {lr: [(saved(sweep_name(rep, lr, u)) or {}).get("accuracy_after")
                 for u in HELD_OUT_USERS] for lr in LR_CANDIDATES}


def chosen_lr(c: StackConfig) -> float | None:
    """The candidate with the best mean validation accuracy over the held-out users (ties go
    to the smaller rate); None while any sweep run is missing."""
    table = sweep_table(c)
    if any(a is None for accs in table.values() for a in accs):
        return None
    return max(LR_CANDIDATES, key=lambda lr: (round(statistics.mean(table[lr]), 6), -lr))


# ---- resumable results ---------------------------------------------------------------------
def current(name: str, sweep_again: bool = False) -> dict | None:
    """A stage's saved result if it was measured on this code (common.code_commit). The recipe
    is reused whatever the code while its model is the same: the population models (pretrain,
    cached by their recipe and the pretraining code's versions, while the file the record
    hashed is there: else recorded again, so the record is of the model the stages use) and, unless
    `sweep_again`, the learning-rate sweeps that chose each model's rate (they rank rates on
    validation windows; a change of code that keeps the mathematics and the model keeps
    them)."""
    result = saved(name)
    if result is None:
        return None
    if name.startswith("pretrain-"):
        network, kind = name.removeprefix("pretrain-").rsplit("-", 1)
        key = population_key(network, kind == "dst")
        same = Path(result["cache"]).name.startswith(f"{network}-{key}")
        # recorded again where the model's file is gone (a fresh clone: trained again) or is
        # not the file recorded (another bench trained the recipe first: its figures)
        return result if same and model_file_recorded(result) else None
    if name.startswith("lrsweep-") and not sweep_again:
        c = next(c for c in STACK if name.startswith(f"lrsweep-{c.key()}-"))
        return result if result.get("population_model") == population_key(
            c.network, c.sparse) else None
    return result if result.get("commit") == _code() else None


def model_file_present(pretrain: dict) -> bool:
    """Whether a pretraining record's model file is on this machine (.cache travels with no
    clone)."""
    return (ROOT / pretrain["cache"]).is_file()


def model_file_sha256(pretrain: dict) -> str:  # stage_pretrain records it
    return sha256_file(ROOT / pretrain["cache"])


def model_file_recorded(pretrain: dict) -> bool:
    """Whether the record's model file is here and is the one recorded (its hash), not the
    recipe trained anew by another bench or machine, whose loss and time are that training's."""
    return (model_file_present(pretrain)
            and pretrain.get("cache_sha256") == model_file_sha256(pretrain))


@functools.lru_cache(maxsize=1)
def _code() -> str:
    return code_commit()  # once a run: the code does not change under it


def run_folder(name: str) -> Path:
    """The run folder of one personalise run on this code: `--resume` continues a run the
    bench was killed in, never a finished run of other code (its result would be stamped with
    this commit). Other commits' folders of the same run are removed."""
    runs = ARTIFACTS / "runs"
    for old in runs.glob(f"{name}@*"):
        if old.name != f"{name}@{_code()}":
            shutil.rmtree(old)
    if (runs / name).is_dir():  # a folder from before the commit was in the name
        shutil.rmtree(runs / name)
    return runs / f"{name}@{_code()}"


def saved(name: str) -> dict | None:
    path = STATE / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def save(name: str, result: dict) -> dict:
    """Save a stage's result, stamped with where it was measured (common.stamp)."""
    result = {**result, **stamp(), "command": command_line()}
    STATE.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(STATE / f"{name}.json", json.dumps(result, indent=2).encode())
    return result


def cli(*args: str, ok_codes: tuple[int, ...] = (0,)) -> dict:
    p = subprocess.run([sys.executable, "-m", "edgetrain.cli", *args], capture_output=True,
                       text=True, cwd=ROOT)
    if p.returncode not in ok_codes:
        raise SystemExit(f"edgetrain {' '.join(args)} failed (exit {p.returncode}):\n"
                         f"{p.stderr[-3000:]}")
    return json.loads(p.stdout)
