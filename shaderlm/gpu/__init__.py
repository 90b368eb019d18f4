from .device import Device, get_device  # noqa: F401
from .plan import Dispatch, Plan  # noqa: F401
