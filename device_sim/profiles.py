"""Device profiles: how many bytes a training working set may take on each class of wearable.

`ram_budget_bytes` is the share of the device's RAM we allow the training working set
(parameters, gradients, optimizer state, activations, runtime scratch), not the chip's total.
Sources and reasoning for each figure are in docs/devices.md; keep the two in step.
"""
from __future__ import annotations

from dataclasses import dataclass

MiB = 1024 * 1024


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    ram_budget_bytes: int
    total_ram_bytes: int
    description: str
    source: str
    # Latency model inputs: peak fp32 throughput and memory bandwidth, derived from the
    # vendor's core count, clock and SIMD width (docs/devices.md shows the arithmetic).
    compute_flops_per_s: float
    memory_bandwidth_bytes_per_s: float

    @property
    def target(self) -> str:
        """What its ONNX Runtime can run (edgetrain/targets.py): the microcontroller tiers a
        portable build of the CPU kernels, the watches arm64; neither has NCHWc kernels."""
        return "portable" if self.name.startswith("mcu-") else "arm64"


PROFILES: dict[str, DeviceProfile] = {p.name: p for p in [
    DeviceProfile(
        name="mcu-256kb", ram_budget_bytes=192 * 1024, total_ram_bytes=256 * 1024,
        description="Small wearable microcontroller (STM32F4/nRF52840-class: 256 KB SRAM); "
                    "192 KiB for training after 64 KiB of firmware, RTOS and sensor buffers",
        source="Nordic nRF52840 product specification: 256 KB RAM, Cortex-M4F at 64 MHz "
               "(the class of MCUNetV3's 256 KB on-device training target)",
        compute_flops_per_s=64e6 * 2, memory_bandwidth_bytes_per_s=64e6 * 4),
    DeviceProfile(
        name="mcu-1mb", ram_budget_bytes=1 * MiB, total_ram_bytes=1400 * 1024,
        description="Wearable microcontroller (STM32H7A3-class: 1.4 MB SRAM); 1 MiB for "
                    "training after firmware and sensor buffers",
        source="ST STM32H7A3 datasheet: up to 2 MB flash, 1.4 MB RAM, Cortex-M7 at 280 MHz",
        compute_flops_per_s=280e6 * 2, memory_bandwidth_bytes_per_s=280e6 * 4),
    DeviceProfile(
        name="mcu-2mb", ram_budget_bytes=2 * MiB, total_ram_bytes=2 * MiB + 768 * 1024,
        description="Wearable microcontroller band (Ambiq Apollo4-class: 2.75 MB SRAM); "
                    "about 2 MB left for training after firmware and sensor buffers",
        source="Ambiq Apollo4 Plus datasheet: 2 MB MRAM, 2.75 MB SRAM",
        compute_flops_per_s=192e6 * 2, memory_bandwidth_bytes_per_s=192e6 * 4),
    DeviceProfile(
        name="mcu-8mb", ram_budget_bytes=8 * MiB, total_ram_bytes=16 * MiB,
        description="Fitness-watch SoC with external PSRAM (16 MB); half for training",
        source="Typical RTOS smartwatch SoCs pair an MCU with 8-16 MB PSRAM "
               "(e.g. Espressif ESP32-S3 modules with 8/16 MB PSRAM)",
        compute_flops_per_s=2 * 240e6 * 2, memory_bandwidth_bytes_per_s=80e6 * 2 * 1),
    DeviceProfile(
        name="watchos-extension", ram_budget_bytes=15 * MiB, total_ram_bytes=1024 * MiB,
        description="A watchOS app extension / background task: the OS kills extensions "
                    "that grow past roughly 15 MB",
        source="Apple Developer Forums reports of watchOS extension memory limits (~15 MB); "
               "the limit is not published by Apple and varies by model and OS version",
        compute_flops_per_s=1.8e9 * 16, memory_bandwidth_bytes_per_s=17e9),
    DeviceProfile(
        name="watch-app-low", ram_budget_bytes=64 * MiB, total_ram_bytes=1024 * MiB,
        description="Foreground app on a 1 GB Wear OS / watchOS watch, sharing RAM with the OS "
                    "and other apps; 64 MB for training",
        source="Apple Watch Series 6-8 and most Wear OS 3 watches ship 1 GB RAM "
               "(vendor spec sheets); Android low-RAM guidance keeps per-app use well under "
               "10% of RAM",
        compute_flops_per_s=4 * 1.7e9 * 4, memory_bandwidth_bytes_per_s=8.5e9),
    DeviceProfile(
        name="watch-app-high", ram_budget_bytes=256 * MiB, total_ram_bytes=2048 * MiB,
        description="Foreground app on a 2 GB watch (Pixel Watch 2/3, Galaxy Watch 5 Pro); "
                    "256 MB for training",
        source="Google Pixel Watch 2 and Samsung Galaxy Watch5 Pro spec sheets: 2 GB RAM",
        compute_flops_per_s=4 * 1.7e9 * 4, memory_bandwidth_bytes_per_s=8.5e9),
]}


@dataclass(frozen=True)
class TierPlan:
    """What the product ships to a device tier for raw IMU windows: the network, its width,
    what trains and the micro-batch. Each is measured there by bench/personalise.py (its
    peak under the tier's budget and its personalisation gain, docs/devices.md)."""
    device: str
    model: str = "imu_cnn"
    width: float | None = None  # None: the network's default
    update: str = "all"
    micro_batch: int = 8
    batchnorm_adapt: str = "batch"  # Plan.batchnorm_adapt: how BatchNorm statistics adapt
    accumulation: int = 1  # micro-batches a step sums (its gradients and BatchNorm statistics)
    # ORT intra-op threads: one, as bench/personalise.py measures every tier (a microcontroller
    # has one core; MLAS keeps a working buffer per thread, so a second thread adds to the
    # peak: mcu-256kb's plan needs 183,296 bytes with one thread and 314,368 with two)
    threads: int = 1

    @property
    def label(self) -> str:
        w = f" width {self.width:g}" if self.width is not None else ""
        exact = ", exact BatchNorm statistics" if self.batchnorm_adapt == "exact" else ""
        k = f" x {self.accumulation}" if self.accumulation > 1 else ""
        return f"{self.model}{w}, update {self.update}, micro-batch {self.micro_batch}{k}{exact}"

    def export_args(self) -> list[str]:
        """`edgetrain export` options that build this tier's artifact."""
        width = ["--width", f"{self.width:g}"] if self.width is not None else []
        exact = (["--batchnorm-adapt", self.batchnorm_adapt]
                 if self.batchnorm_adapt != "batch" else [])
        k = ["--accumulate", str(self.accumulation)] if self.accumulation > 1 else []
        return ["--model", self.model, *width, "--update", self.update, "--micro-batch",
                str(self.micro_batch), *k, *exact, "--threads", str(self.threads)]


TIER_PLANS: dict[str, TierPlan] = {t.device: t for t in [
    TierPlan("watchos-extension"),
    # mcu-2mb's plan in micro-batches of 2: the same steps of 8, gradients and statistics alike
    TierPlan("mcu-1mb", update="head", micro_batch=2, accumulation=4),
    TierPlan("mcu-2mb", update="head"),
    TierPlan("mcu-256kb", width=0.25, update="head", micro_batch=2, batchnorm_adapt="exact"),
]}


def get_profile(name: str) -> DeviceProfile:
    if name not in PROFILES:
        raise ValueError(f"unknown device profile {name!r}; choose one of {sorted(PROFILES)} "
                         "(`edgetrain devices` lists them)")
    return PROFILES[name]
