"""The seed deck's optimisation stack, C1 -> C6, measured end to end (issue 6).

    .venv/bin/python bench/stack.py                 # hours on 2 cores, most ResNet-50; resumable
    .venv/bin/python bench/stack.py --only pretrain  # just the population models
    .venv/bin/python bench/stack.py --network resnet50  # one network's stages only
    .venv/bin/python bench/stack.py --network imu_cnn   # C8 alone, about 3 minutes
    .venv/bin/python bench/stack.py --report         # tables and plot from saved results

C1 ResNet-50 -> C2 + dynamic sparse training -> C3 + gradient checkpointing -> C4 +
micro-batching -> C5 MobileNetV1 (keeping C2-C4) -> C6 MobileNet on 32x32 patches -> C7 + a
sparse update (C6 training its head only; its masks stay fixed). All three image networks are
the deck's tables at width 1.0, 7 classes. C8 is the raw-IMU 1-D CNN with the update plan
`export --update auto` chooses for mcu-2mb (docs/update-plans.md). Every configuration takes optimizer
steps of EFFECTIVE_BATCH windows: C1-C3 as one micro-batch, C4-C5 as EFFECTIVE_BATCH
micro-batches of one window, C6 as 49 x EFFECTIVE_BATCH micro-batches of one 32x32 patch
(the pixels of EFFECTIVE_BATCH windows). Memory and time are measured so; the accuracy runs
(sweep, personalise) merge micro-batches smaller than 8 windows into micro-batches of 8
windows, the same update with BatchNorm frozen (stack_config.merged_micro_batches).

Stages, each result saved under bench/results/stack/ as soon as it exists with the commit it
ran at, so an interrupted run resumes where it stopped, and a result saved on other code runs
again (common.code_commit) except the recipe: population models (while the cached file their
record hashed is there: a fresh clone pretrains again, or loads the file another bench trained
first, and records that pretraining) and, unless --sweep-again,
the learning-rate sweeps of the same population model (a sweep's result records the model's
cache key) are reused:
  pretrain     population models on subjects 1-7 (torch, host; cached in .cache/pretrain):
               dense for C1, dense then DST epochs (exporters/models/dst.py) for C2-C6
  export       one artifact per configuration (.cache/stack/<config>)
  lrsweep      each population model's personalisation learning rate: LR_CANDIDATES x each
               held-out user, trained on the first 75% of the user's personalisation-arm
               recordings and validated on the rest (never the test arm); the best mean wins
  personalise  `edgetrain personalise --json` on each held-out user (8, 9, 10): accuracy on
               the user's other-arm test windows, before and after, and which windows were
               right (bench/stack_accuracy.py: intervals over users and recordings). C8 also
               on HAPT's later session, every user by the model of the fold that left them
               out (CROSS_SESSION in bench/stack_config.py). Two runs at a time, one ORT
               thread each; `--resume`, so a run the bench was killed in continues
  measure      `edgetrain measure --json`: peak bytes and breakdown from ORT's allocator, and
               the step time, at the configuration's micro-batch x accumulation
  fit          `edgetrain fit --device watch-app-low --json`: largest micro-batch under 64 MiB
  peer         bench/torch_peer.py: the same network and step in plain PyTorch eager, in a
               fresh process: peak RSS and step time
Writes bench/results/stack.json, the tables in docs/results.md and docs/img/stack.png.
"""
from __future__ import annotations

import argparse
from concurrent.futures import ThreadPoolExecutor

from tqdm import tqdm

from stack_config import PARALLEL_RUNS, current, save
from stack_report import report
from stack_stages import NETWORK_ORDER, forget_stale_groups, tasks


def pending(only: str | None, network: str | None, sweep_again: bool = False
            ) -> list[tuple[str, object]]:
    return [(n, f) for n, f in tasks(only, network) if current(n, sweep_again) is None]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=["pretrain"], help="stop after this stage")
    ap.add_argument("--network", choices=NETWORK_ORDER, help="run only this network's stages")
    ap.add_argument("--report", action="store_true", help="only rebuild tables and plot")
    ap.add_argument("--sweep-again", action="store_true",
                    help="run the learning-rate sweeps again on this code (else reused)")
    args = ap.parse_args()
    if not args.report:
        forget_stale_groups(args.network)
        bar = tqdm(total=len(pending(args.only, args.network, args.sweep_again)), desc="stack",
                   unit="task")

        def run(name: str, fn) -> None:
            save(name, fn())
            bar.update(1)
            tqdm.write(f"done: {name}")

        # Re-list after every batch: personalisation names depend on the sweep's results.
        while todo := pending(args.only, args.network, args.sweep_again):
            stage = todo[0][0].split("-")[0]
            if stage in ("personalise", "lrsweep"):  # independent runs, one ORT thread each:
                batch = []  # two at a time use both cores better than one run on two
                for name, fn in todo:
                    if not name.startswith(stage + "-"):
                        break
                    batch.append((name, fn))
                with ThreadPoolExecutor(max_workers=PARALLEL_RUNS) as pool:
                    for f in [pool.submit(run, n, g) for n, g in batch]:
                        f.result()
                continue
            bar.set_postfix_str(todo[0][0])
            run(*todo[0])
        bar.close()
    if args.only is None:
        report()


if __name__ == "__main__":
    main()
