"""OpenAI's endpoints over a model's replicas: request shapes in, OpenAI's objects and
chunk streams out (the ingress side of ``app_toolkit.llm``)."""
