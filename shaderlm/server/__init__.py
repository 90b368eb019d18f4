"""The HTTP layer: OpenAI's API and a chat page over the serving engine (`shaderlm serve`)."""
from .app import create_app, serve

__all__ = ["create_app", "serve"]
