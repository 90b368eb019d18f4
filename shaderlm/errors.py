"""Errors a user can act on. Each message names the file, key, tensor or limit at fault."""


class ShaderLMError(Exception):
    """Base class: the CLI prints these as one line, without a traceback."""


class ModelFormatError(ShaderLMError):
    """A model file is truncated, malformed, or uses something we do not support."""


class UnsupportedError(ShaderLMError):
    """A valid model that uses an architecture, tensor type or feature shaderlm does not implement."""


class DeviceError(ShaderLMError):
    """No usable GPU adapter, or a missing feature/limit."""


class ContextFullError(ShaderLMError):
    """The prompt (plus requested tokens) does not fit the context window."""
