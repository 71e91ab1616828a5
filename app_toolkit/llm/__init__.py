"""LLM serving: Ray Serve LLM's config and names, vLLM's OpenAI endpoints, engines on the
CPU (docs/llm.md). Install with ``pip install 'app_toolkit[llm]'``; importing this module
imports no model library (the engines do, in their replicas)."""
