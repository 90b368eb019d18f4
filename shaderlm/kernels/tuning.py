"""Where the tuned kernel shapes (the decode GEMVs', the prompt GEMM's tiles, decode batches' GEMM tiles)
are kept for an adapter: a JSON file per adapter and driver, opened when a model loads with tuning on.
Each shape is stamped with the sources of the kernel it tunes: editing that kernel (or what it includes)
drops its shapes alone, so only they are tuned again."""
from __future__ import annotations

import functools
import hashlib
import re
from pathlib import Path
from weakref import WeakKeyDictionary

from ..gpu.tuner import ShapeCache

VERSION = 10         # of the cache's meaning (what a shape's fields are and how they are timed)
# the kernel a tuning key's shape is for, by the key's first word
TUNED_KERNELS = {"gemv": "gemv", "gemv_pair": "gemv", "matmul_q8": "matmul_q8", "matmul_tc": "matmul_tc",
                 "matmul_few": "matmul_few"}

_caches: WeakKeyDictionary = WeakKeyDictionary()      # device -> ShapeCache


@functools.cache
def source_stamp(kernel: str) -> str:
    """A hash of every source file `kernel` may read (wgsl.sources)."""
    from . import KERNEL_DIR
    from .wgsl import sources
    h = hashlib.sha256()
    for name in sources(kernel):
        h.update(name.encode() + b"\0" + (KERNEL_DIR / f"{name}.wgsl").read_bytes())
    return h.hexdigest()[:16]


def key_stamp(key: str) -> str:
    """The source stamp a shape cached under `key` must carry to be used ("" for a key of no kernel
    known here, which nothing looks up)."""
    kernel = TUNED_KERNELS.get(key.split(" ", 1)[0])
    return source_stamp(kernel) if kernel else ""


def cache_path(dev, cache_dir: str | None = None) -> Path:
    h = hashlib.sha256()
    for part in dev.identity() + [str(VERSION)]:
        h.update(part.encode() + b"\0")
    slug = re.sub(r"[^A-Za-z0-9]+", "-", str(dev.adapter.info.get("device", "adapter"))).strip("-")[:48]
    root = Path(cache_dir) if cache_dir else Path.home() / ".cache" / "shaderlm"
    return root / f"tune-{slug}-{h.hexdigest()[:16]}.json"


def open_cache(dev, cache_dir: str | None = None, reload: bool = False) -> ShapeCache:
    """The adapter's shape cache in `cache_dir`, read from disk when first opened (or with `reload`):
    dispatches built from now on take its shapes."""
    from .gemm import few_shape_valid, tc_tile_valid, tile_valid
    from .gemv import GemvShape
    path = cache_path(dev, cache_dir)
    cache = _caches.get(dev)
    if cache is None or cache.path != path or reload:
        def valid(s) -> bool:
            return GemvShape.valid(s) or tile_valid(s) or tc_tile_valid(s) or few_shape_valid(s)
        cache = _caches[dev] = ShapeCache(path, valid, dev.name, key_stamp)
    return cache


def shape_label(shape) -> str:
    """A cached shape as `shaderlm tune` shows it: a decode GEMV's, a prompt GEMM's tile, a tensor-core
    tile (rows x tokens / threads) or matmul_few's shape."""
    from .gemm import few_shape_label, few_shape_valid, tc_tile_label, tc_tile_valid, tile_label, tile_valid
    from .gemv import GemvShape
    if tc_tile_valid(shape):
        return tc_tile_label(shape)
    if few_shape_valid(shape):
        return few_shape_label(shape)
    return tile_label(shape) if tile_valid(shape) else GemvShape.of(shape).label()


def close_cache(dev):
    """Build with the built-in shapes from now on (tuning off)."""
    _caches.pop(dev, None)


def tuned_shape(dev, key: str):
    """The cached shape of `key` on this adapter, or None (no cache open, or not tuned yet)."""
    cache = _caches.get(dev)
    return None if cache is None else cache.get(key)
