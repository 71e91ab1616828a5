"""The model's replica: ``LLMServer`` (``server.py``) and what it alone runs — the engine
chosen and loaded (``loading.py``), each reply's stream (``reply_stream.py``, ``choices.py``)
and structured output's grammars (``shaping.py``, ``structured.py``, ``grammar.py``).

The ingress (``llm/openai/``) never imports this package (it loads no model), and the
engines (``llm/engines/``) never import it either (tests/unit/test_layout.py).
"""
