"""The GPU runtime: adapter and device, buffers, pipelines from WGSL text, plans of dispatches, timing
and shape tuning. It knows no kernel, format or model."""
from .device import Device, get_device  # noqa: F401
from .plan import Dispatch, Plan  # noqa: F401
