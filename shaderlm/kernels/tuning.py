"""Where the tuned kernel shapes (the decode GEMVs', the prompt GEMM's tiles) are kept for an adapter: a
JSON file per adapter, driver and kernel source (editing a tuned kernel invalidates it), opened when a
model loads with tuning on."""
from __future__ import annotations

import hashlib
import re
from pathlib import Path
from weakref import WeakKeyDictionary

from ..gpu.tuner import ShapeCache

VERSION = 9          # of the cache's meaning (what a shape's fields are and how they are timed)
# kernels whose source decides the tuned shapes
TUNED_SOURCES = ("gemv", "gemv_rows", "quant_common", "reduce", "matmul_q8")

_caches: WeakKeyDictionary = WeakKeyDictionary()      # device -> ShapeCache


def cache_path(dev, cache_dir: str | None = None) -> Path:
    from . import KERNEL_DIR
    h = hashlib.sha256()
    for part in dev.identity() + [str(VERSION)]:
        h.update(part.encode() + b"\0")
    for k in TUNED_SOURCES:
        h.update((KERNEL_DIR / f"{k}.wgsl").read_bytes())
    for f in sorted((KERNEL_DIR / "quant").glob("*.wgsl")):
        h.update(f.read_bytes())
    slug = re.sub(r"[^A-Za-z0-9]+", "-", str(dev.adapter.info.get("device", "adapter"))).strip("-")[:48]
    root = Path(cache_dir) if cache_dir else Path.home() / ".cache" / "shaderlm"
    return root / f"tune-{slug}-{h.hexdigest()[:16]}.json"


def open_cache(dev, cache_dir: str | None = None, reload: bool = False) -> ShapeCache:
    """The adapter's shape cache in `cache_dir`, read from disk when first opened (or with `reload`):
    dispatches built from now on take its shapes."""
    from .gemm import tile_valid
    from .gemv import GemvShape
    path = cache_path(dev, cache_dir)
    cache = _caches.get(dev)
    if cache is None or cache.path != path or reload:
        cache = _caches[dev] = ShapeCache(path, lambda s: GemvShape.valid(s) or tile_valid(s), dev.name)
    return cache


def shape_label(shape) -> str:
    """A cached shape as `shaderlm tune` shows it: a decode GEMV's, or a prompt GEMM's tile."""
    from .gemm import tile_label, tile_valid
    from .gemv import GemvShape
    return tile_label(shape) if tile_valid(shape) else GemvShape.of(shape).label()


def close_cache(dev):
    """Build with the built-in shapes from now on (tuning off)."""
    _caches.pop(dev, None)


def tuned_shape(dev, key: str):
    """The cached shape of `key` on this adapter, or None (no cache open, or not tuned yet)."""
    cache = _caches.get(dev)
    return None if cache is None else cache.get(key)
