"""ONNX Runtime's arena log -> the bytes a process's training working set took at its peak.

ORT's arena logs every time an arena grows ("Extending BFCArena ... rounded_bytes:R",
"Extended allocation by E bytes.", "Total allocated bytes: T") and every reservation
("Reserving memory in BFCArena ... size: S"). Phase marks (MARK + a name, written to the same
stream) say what the process was doing. Read by `edgetrain measure` (device_sim/measure.py,
which replays a cycle in a child) and by `personalise` itself (edgetrain/arenacapture.py):

  * env arena (capped; gradients, optimizer state, activations and temporaries): it grows by
    exactly what is requested (arena_extend_strategy 1) and never shrinks, so its final total is
    its high-water mark. Its growth is attributed to the phase in which it happened.
  * other arenas (checkpoint tensors, the API's scalars): one allocation each, counted at the
    chunk size requested (R). In a "reload" phase they replace the freed ones (not counted).
  * the training Module's graph constants: reserved in the env arena when it opens; "other".
"""
from __future__ import annotations

import re

MARK = "EDGETRAIN-PHASE "
# A phase whose arena lines are not the training working set: the runtime's NCHWc block probe
# (edgetrain/nchwcprobe.py), an inference session with its own arena, freed before the runtime
# installs its cap.
PROBE_PHASE = "probe"
CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "other")
_EXTENDING = re.compile(r"Extending BFCArena for \w+\. .*rounded_bytes:(\d+)")
_EXTENDED = re.compile(r"Extended allocation by (\d+) bytes\.")
_TOTAL = re.compile(r"Total allocated bytes: (\d+)")
_RESERVE = re.compile(r"Reserving memory in BFCArena for \w+ size: (\d+)")


class ArenaLogParser:
    """Reads an arena log a line at a time (a run's log grows with its mask updates: tens of MB
    kept as lines would sit outside the cap), keeping only the running totals."""

    def __init__(self):
        self.phase = "other"
        self.per = {c: 0 for c in CATEGORIES}
        self.env_total = self.pending_reserve = self.outside = 0
        self.rounded = self.extended = None
        self.lines = 0  # arena lines and marks read

    def feed(self, line: str) -> None:
        if line.startswith(MARK):
            self.phase, self.lines = line[len(MARK):].strip(), self.lines + 1
            return
        if self.phase == PROBE_PHASE:
            return
        phase, per = self.phase, self.per
        if m := _RESERVE.search(line):
            # Session initializers (constants of the graphs) reserved in the env arena. A
            # reload frees the old Module's reservation first (BFCArena::Free gives reserved
            # bytes back to the total), so its new one replaces it.
            self.lines += 1
            if phase != "reload":
                self.pending_reserve += int(m.group(1))
                per["other"] += int(m.group(1))
        elif m := _EXTENDING.search(line):
            self.rounded, self.lines = int(m.group(1)), self.lines + 1
        elif m := _EXTENDED.search(line):
            self.extended, self.lines = int(m.group(1)), self.lines + 1
        elif (m := _TOTAL.search(line)) and self.extended is not None:
            total, extended = int(m.group(1)), self.extended
            self.lines += 1
            # Checkpoint tensors load before any session exists, so nothing in that phase is
            # the env arena; later, only the env arena continues the env arena's total.
            continues = total - extended == self.env_total + self.pending_reserve
            if phase != "parameters" and continues:
                self.env_total, self.pending_reserve = total, 0
                per[_category(phase)] += extended
            elif phase != "reload":  # a private arena (a checkpoint tensor or an API
                assert self.rounded is not None, "arena log out of order"  # scalar): one chunk
                self.outside += self.rounded
                per["parameters" if phase == "parameters" else "other"] += self.rounded
            # (in a reload, the weights' arenas replace those of the weights freed before it)
            self.rounded = self.extended = None

    def result(self) -> tuple[int, int, dict]:
        """(env arena bytes, outside bytes, bytes per category)."""
        return self.env_total + self.pending_reserve, self.outside, dict(self.per)


def parse_arena_log(text: str) -> tuple[int, int, dict]:
    """Arena log with phase marks -> (env arena bytes, outside bytes, bytes per category)."""
    parser = ArenaLogParser()
    for line in text.splitlines():
        parser.feed(line)
    return parser.result()


def _category(phase: str) -> str:
    if phase in ("gradients", "optimizer_state"):
        return phase
    if phase in ("preflight", "eval", "train", "inference"):
        return "activations"
    return "other"
