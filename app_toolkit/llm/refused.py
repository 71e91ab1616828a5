"""Ray Serve LLM's options and vLLM's engine arguments with no counterpart here.

The rule is Ray Serve's (``config/ray_serve_only.py``): a field is accepted only at the
value that means "not used", then dropped; any other value fails naming the field and
what to do instead. These are the tables it reads for ``app_toolkit.llm``'s schemas.
Where Ray takes any key (``experimental_configs``), a key in neither the table nor the
schema is refused by :func:`refuse_unknown`; ``engine_kwargs`` are vLLM's arguments,
checked by ``engine_options.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from app_toolkit.config.ray_serve_only import RayServeOnly, defaults, one_of
from app_toolkit.config.schema import field_errors

_CALLBACK_BASE = (
    "ray.llm._internal.common.callbacks.base.CallbackBase",
    "ray.llm._internal.common.callbacks.base:CallbackBase",
)
#: Per schema ("kind"), the Ray Serve LLM fields it accepts only at their neutral value.
RAY_SERVE_LLM_ONLY: dict[str, dict[str, RayServeOnly]] = {
    "llm_config": {
        "accelerator_config": RayServeOnly(
            defaults(kind=("cpu",)),
            "the engines run on the CPU; remove it (or set kind: cpu), and set accelerator_type "
            "to place the replica on nodes with that accelerator",
        ),
        "server_cls": RayServeOnly(
            one_of(None),
            "the server is app_toolkit.llm's own; remove it (to serve other routes, write a "
            "deployment of your own beside build_openai_app's: docs/llm.md)",
        ),
        "log_engine_metrics": RayServeOnly(
            one_of(True, None),
            "each model's engine series are always on /-/metrics (docs/llm.md); remove it",
        ),
        "callback_config": RayServeOnly(
            defaults(
                callback_class=_CALLBACK_BASE,
                callback_kwargs=({},),
                raise_error_on_callback=(True, False),
            ),
            "model loading callbacks are not implemented; remove it and prepare files before "
            "the deployment starts (model_source takes a local folder)",
        ),
    },
    "experimental_configs": {
        "num_ingress_replicas": RayServeOnly(
            one_of(None),
            "set the ingress's replicas in LLMServingArgs.ingress_deployment_config "
            "(num_replicas or autoscaling_config) instead",
        ),
    },
    # ingress_cls_config is taken: build_openai_app serves a subclass of its ingress.
    "llm_serving_args": {},
}


def refuse_unknown(title: str, data: object, known: Iterable[str], message: str) -> object:
    """``data``, or a ``ValidationError`` located at each of its keys not in ``known``,
    saying ``message`` (what the key is and what to do)."""
    if not isinstance(data, Mapping):
        return data
    names = set(known)
    unknown: dict[str | tuple[str, ...], tuple[object, str]] = {
        str(key): (value, message) for key, value in data.items() if key not in names
    }
    if unknown:
        raise field_errors(title, unknown)
    return data
