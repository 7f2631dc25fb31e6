"""The OpenAI-compatible HTTP server (`speclm serve`): create_app(llm, ServerConfig)."""

from .app import ServerConfig, create_app

__all__ = ["ServerConfig", "create_app"]
