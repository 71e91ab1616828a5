"""A streaming chat service: an OpenAI-compatible API, a WebSocket and a page, on app_toolkit."""
