"""LoRA adapters of a model, read from a local folder and applied with peft.

The folder (``lora_config.dynamic_lora_loading_path``) holds one folder per adapter, named
by the adapter's id, each with peft's files (``adapter_config.json`` and the weights). An
adapter is read in two parts so that the replies decoding meanwhile are held up as little
as possible: its files in a worker thread, beside the forward passes (:func:`read`); then
its modules made and filled between two passes (:func:`attach`, run by the decoder).
peft is imported only when an adapter is first read.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import logging
import re
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..engine import EngineStopped

if TYPE_CHECKING:
    import torch
    from peft import LoraConfig

logger = logging.getLogger(__name__)

#: An adapter's id: a folder's name, never a path.
ADAPTER_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")
#: What peft's mixed-batch forward calls a row without an adapter.
BASE = "__base__"
#: The files an adapter's weights may be in (read locally: nothing is downloaded).
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
#: The warning peft's wrapping raises under transformers 5 (a deprecated property it reads).
GRADIENT_CHECKPOINTING = "`is_gradient_checkpointing` is deprecated"


class AdapterNotFound(LookupError):
    """The folder holds no adapter by that id."""


class AdapterRefused(ValueError):
    """The adapter exists but cannot be served (its rank, its kind)."""


@dataclass(frozen=True, slots=True)
class AdapterFiles:
    """An adapter read from its folder, not applied yet."""

    adapter_id: str
    config: LoraConfig
    weights: dict[str, torch.Tensor]  # parameter name -> tensor

    @property
    def rank(self) -> int:
        return int(self.config.r)


def peft_name(adapter_id: str) -> str:
    """The name peft knows an adapter by: module names hold no ".", and peft warns of a
    name inside its "lora_" prefix (a short id such as "a")."""
    return "adapter_" + hashlib.blake2b(adapter_id.encode(), digest_size=8).hexdigest()


def adapter_ids(folder: Path) -> list[str]:
    """The adapters ``folder`` holds (subfolders with an ``adapter_config.json``), sorted."""
    if not folder.is_dir():
        return []
    return sorted(
        entry.name
        for entry in folder.iterdir()
        if ADAPTER_ID.fullmatch(entry.name) and (entry / "adapter_config.json").is_file()
    )


def holds(folder: Path, adapter_id: str) -> bool:
    """Whether ``folder`` holds an adapter named ``adapter_id`` (a name, never a path)."""
    return bool(ADAPTER_ID.fullmatch(adapter_id)) and (folder / adapter_id / "adapter_config.json").is_file()


def read(folder: Path, adapter_id: str, max_rank: int) -> AdapterFiles:
    """Adapter ``adapter_id``'s config and weights from ``folder`` (blocking: call it in a
    worker thread). AdapterNotFound when there is none; AdapterRefused when it is not a
    LoRA adapter or its rank is above ``max_rank``."""
    from peft import LoraConfig
    from peft.utils import load_peft_weights

    if not holds(folder, adapter_id):
        raise AdapterNotFound(adapter_id)
    path = folder / adapter_id
    try:
        config = LoraConfig.from_pretrained(str(path))
    except (TypeError, ValueError, KeyError) as exc:
        raise AdapterRefused(f"adapter {adapter_id!r} is not a LoRA adapter peft can read: {exc}") from None
    if type(config) is not LoraConfig or getattr(config, "use_dora", False):
        kind = "a DoRA adapter" if getattr(config, "use_dora", False) else f"a {type(config).__name__}"
        raise AdapterRefused(
            f"adapter {adapter_id!r} is {kind}: only plain LoRA adapters are served (peft mixes only "
            "those in one batch)"
        )
    if int(config.r) > max_rank:
        raise AdapterRefused(
            f"adapter {adapter_id!r} has rank {config.r}, above max_lora_rank {max_rank}: raise "
            "engine_kwargs.max_lora_rank"
        )
    if not any((path / name).is_file() for name in WEIGHT_FILES):
        raise AdapterRefused(f"adapter {adapter_id!r} has no weights: its folder needs {WEIGHT_FILES[0]}")
    config.inference_mode = True
    return AdapterFiles(adapter_id, config, load_peft_weights(str(path), device="cpu"))


class _LoadResult(Protocol):
    """What ``set_peft_model_state_dict`` returns (peft annotates it ``namedtuple``)."""

    @property
    def unexpected_keys(self) -> list[str]: ...


def attach(model: torch.nn.Module, adapter: AdapterFiles) -> torch.nn.Module:
    """``model`` with ``adapter`` added (the first wraps the base model in peft's
    ``PeftModel``); call between forward passes. Returns the model to run from now on."""
    from peft import PeftModel, get_peft_model, set_peft_model_state_dict

    name = peft_name(adapter.adapter_id)
    try:
        with warnings.catch_warnings():
            # peft asks transformers for a property transformers 5 deprecated: not the user's to act on.
            warnings.filterwarnings("ignore", GRADIENT_CHECKPOINTING, FutureWarning)
            if isinstance(model, PeftModel):
                model.add_adapter(name, adapter.config)
            else:
                model = get_peft_model(model, adapter.config, adapter_name=name)
        loaded: _LoadResult = set_peft_model_state_dict(model, adapter.weights, adapter_name=name)
        if loaded.unexpected_keys:
            raise AdapterRefused(
                f"adapter {adapter.adapter_id!r} holds weights this model has no place for "
                f"({', '.join(sorted(loaded.unexpected_keys)[:3])}, ...): it was trained for another model"
            )
    except Exception as exc:  # whatever peft raised, the model is put back, then it is told
        if name in getattr(model, "peft_config", {}):
            detach(model, adapter.adapter_id)  # its modules go again (the base model is as it was)
        if isinstance(exc, AdapterRefused):
            raise
        raise AdapterRefused(f"adapter {adapter.adapter_id!r} does not fit this model: {exc}") from None
    model.eval()
    return model


def detach(model: Any, adapter_id: str) -> Any:
    """``model`` (peft's ``PeftModel``) without adapter ``adapter_id``'s modules (the last one
    gone: the base model unwrapped); call between forward passes. Returns the model to run
    from now on."""
    # Untyped: callers hold the model as a torch module (torch types its other attributes as
    # tensors or modules); here it is a PeftModel, whose unload() peft forwards untyped.
    name = peft_name(adapter_id)
    if list(model.peft_config) == [name]:
        return model.unload()
    model.delete_adapter(name)
    return model


class AttachedAdapters:
    """A decoder's adapters: those its model has, those to detach once no reply uses them,
    and the work on the model waiting for a pause between two forward passes (the decoder
    runs :meth:`work` there, in the passes' thread)."""

    def __init__(self) -> None:
        self.names: set[str] = set()  # attached
        self._detaching: set[str] = set()  # attached, to detach once no reply uses them
        self._detaching_now: str | None = None  # being detached (an attach then waits for it)
        self._jobs: list[tuple[Callable[[torch.nn.Module], torch.nn.Module], asyncio.Future[float]]] = []
        #: Requests holding an adapter from its load until their reply ends: never detached under them.
        self._held: collections.Counter[str] = collections.Counter()

    def hold(self, adapter_id: str) -> None:
        """A request will decode with ``adapter_id``: it stays attached until :meth:`release`."""
        self._held[adapter_id] += 1

    def release(self, adapter_id: str) -> None:
        self._held[adapter_id] -= 1
        if self._held[adapter_id] <= 0:
            del self._held[adapter_id]

    @property
    def detaching_now(self) -> str | None:
        """The adapter being detached at this moment (its name no longer serves)."""
        return self._detaching_now

    @property
    def pending(self) -> bool:
        """Work waits for the next pause between passes."""
        return bool(self._jobs or set(self._detaching).difference(self._held))

    def stopped(self) -> None:
        """The decoder stopped: every attach still waiting ends with EngineStopped."""
        jobs, self._jobs = self._jobs, []
        for _, done in jobs:
            if not done.done():
                done.set_exception(EngineStopped("The engine stopped before the adapter was attached"))

    def attach(self, adapter: AdapterFiles) -> asyncio.Future[float] | None:
        """Ask for ``adapter`` to be attached at the next pause: the future gets how long
        the passes waited for it (s). None: it is attached (and stays, if it was to go)."""
        name = adapter.adapter_id
        self._detaching.discard(name)
        if name in self.names and name != self._detaching_now:
            return None

        def attaching(model: torch.nn.Module) -> torch.nn.Module:
            if name in self.names:  # attached meanwhile by another caller
                return model
            model = attach(model, adapter)
            self.names.add(name)
            return model

        done: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._jobs.append((attaching, done))
        return done

    def detach(self, adapter_id: str) -> bool:
        """Ask for an attached adapter to go once no reply uses it; False: not attached."""
        if adapter_id not in self.names:
            return False
        self._detaching.add(adapter_id)
        return True

    async def work(
        self, model: torch.nn.Module, in_use: Callable[[], set[str]], forget: Callable[[str], None]
    ) -> torch.nn.Module:
        """Between two passes: detach what no reply uses or holds (``in_use()``, asked
        again before each: requests come meanwhile), ``forget`` each (its cache entries);
        then run the attach jobs. Returns the model to run from now on. A detach that
        fails is logged, and the adapter stays."""
        for name in list(self._detaching):
            if name not in self._detaching or name in self._held or name in in_use():
                continue
            self._detaching_now = name
            try:
                model = await asyncio.to_thread(detach, model, name)
            except Exception:  # a failing peft never stops decoding (STYLE 11)
                logger.exception("Detaching adapter %r failed; it stays attached", name)
                self._detaching.discard(name)
                continue
            finally:
                self._detaching_now = None
            forget(name)
            self._detaching.discard(name)
            self.names.discard(name)
        while self._jobs:  # each stays listed until done: a close meanwhile ends it (stopped())
            job, done = self._jobs[0]
            started = time.monotonic()
            try:
                model = await asyncio.to_thread(job, model)
            except Exception as exc:  # noqa: BLE001 - its caller gets it
                del self._jobs[0]
                if not done.done():
                    done.set_exception(exc)
            else:
                del self._jobs[0]
                if not done.done():
                    done.set_result(time.monotonic() - started)
        return model

    def names_for(self, adapters: Sequence[str]) -> dict[str, list[str]]:
        """The forward's ``adapter_names`` for rows of ``adapters`` ("": the base model),
        once the model has any adapter; else no argument."""
        if not self.names and not self._detaching:
            return {}
        return {"adapter_names": [peft_name(adapter) if adapter else BASE for adapter in adapters]}
