"""A forward pass as data: a list of dispatches built once at load, recorded into one compute pass.

Bind groups and buffers never change after load; per-step values (position, token count) live in GPU
buffers that kernels read, so recording a step is only set_pipeline / set_bind_group / dispatch calls.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Union

from .backend import raw_compute_calls

Grid = Union[tuple, Callable[[int], tuple]]


@dataclass
class Dispatch:
    pipeline: object
    bind_group: object
    grid: Grid                 # workgroup counts, or a function of the token count n
    label: str = ""
    bytes: int = 0             # bytes of weights this dispatch must read (for bandwidth reports)
    tune: object = None        # a tuner.Tunable: this dispatch's shape can be tuned per adapter

    def workgroups(self, n: int) -> tuple:
        g = self.grid(n) if callable(self.grid) else self.grid
        return tuple(g) + (1,) * (3 - len(g))


class Plan:
    def __init__(self, device, dispatches=None, name: str = ""):
        self.device = device
        self.dispatches: list[Dispatch] = list(dispatches or [])
        self.name = name
        self._raw: dict = {}          # n -> [(pipeline, bind group, x, y, z)] as C handles

    def add(self, d: Dispatch):
        self.dispatches.append(d)
        return d

    def extend(self, ds):
        self.dispatches.extend(ds)

    def replace(self, dispatches):
        """Another list of dispatches (autotune's rebuilt shapes); drops the recorded handles."""
        self.dispatches, self._raw = list(dispatches), {}

    def __len__(self):
        return len(self.dispatches)

    def encode(self, cpass, n: int = 1):
        raw = raw_compute_calls()
        if raw is not None:
            return self._encode_raw(cpass, n, raw)
        for d in self.dispatches:
            x, y, z = d.workgroups(n)
            if x and y and z:
                cpass.set_pipeline(d.pipeline)
                cpass.set_bind_group(0, d.bind_group)
                cpass.dispatch_workgroups(x, y, z)

    def _encode_raw(self, cpass, n: int, raw):
        items = self._raw.get(n)
        if items is None:
            items = []
            for d in self.dispatches:
                x, y, z = d.workgroups(n)
                if x and y and z:
                    items.append((d.pipeline._internal, d.bind_group._internal, x, y, z))
            self._raw[n] = items
        set_pipeline, set_bind_group, dispatch, null = raw
        p = cpass._internal
        for pipe, bg, x, y, z in items:
            set_pipeline(p, pipe)
            set_bind_group(p, 0, bg, 0, null)
            dispatch(p, x, y, z)

    def record(self, n: int = 1, repeat: int = 1, then=None):
        """`repeat` copies of the plan in one command buffer (not submitted).

        `then(encoder)` may append copies (e.g. token ids to a readback buffer)."""
        enc = self.device.encoder()
        cpass = enc.begin_compute_pass()
        for _ in range(repeat):
            self.encode(cpass, n)
        cpass.end()
        if then is not None:
            then(enc)
        return enc.finish()

    def run(self, n: int = 1, repeat: int = 1, then=None):
        """record() and submit; the submission's index where the backend gives one (Device.read_after)."""
        return self.device.submit([self.record(n, repeat, then)])
