"""A model or dataset named by its Hugging Face Hub name on a machine that cannot reach the Hub (a cluster's
compute nodes).

huggingface_hub retries a request that fails on the network five times, with back-off, and transformers asks for
several files a model may lack (``added_tokens.json``, ``tokenizer.model``, the list of chat templates), so on a
machine without a network a model in the local cache took minutes to load (4 min 44 s for the tiny model under a
hub name, through some thirty warnings), and a model or dataset not in it about 25 s before its error.
:func:`check_hub_access` asks the Hub once first, with no retry and a short timeout: when it answers (whatever the
answer: a gated or missing repository is then reported by transformers or datasets as before), nothing changes;
when it does not, this process and the ones it starts go offline (as ``HF_HUB_OFFLINE=1`` does, with one warning),
so a model or dataset in the local cache loads from there at once, and a model that is not there is one error
naming the cache (datasets, which keeps a cache of its own, reports a dataset it lacks). With ``HF_HUB_OFFLINE``
set, the Hub is not asked.
"""

from __future__ import annotations

import functools
import logging
import os

from klear.errors import first_line

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 5.0
"""Seconds the one request to the Hub may take before the Hub counts as unreachable."""


class HubUnreachable(OSError):
    """A hub name not in the local cache, on a machine that cannot reach the Hub. An ``OSError``, as transformers'
    own errors for a model it cannot load are, so the commands report it where they report those."""


@functools.cache
def check_hub_access(name: str, kind: str = "model") -> None:
    """Make loading the hub ``kind`` (``model`` or ``dataset``) ``name`` take no network retries: see the module
    docstring.

    Raises:
        HubUnreachable: the Hub cannot be reached and the model ``name`` is not in the local cache.
    """
    from huggingface_hub import constants, try_to_load_from_cache

    if constants.is_offline_mode():
        return
    reason = unreachable(constants.ENDPOINT)
    if reason is None:
        return
    if kind == "model" and not isinstance(try_to_load_from_cache(name, "config.json"), str):
        raise HubUnreachable(
            f"{name} is not in this machine's Hugging Face cache ({constants.HF_HUB_CACHE}) and the Hub "
            f"({constants.ENDPOINT}) cannot be reached ({reason}); download it where there is a network "
            f"(hf download {name}) into this cache (HF_HOME), or give the model's folder"
        )
    os.environ["HF_HUB_OFFLINE"] = "1"  # for the processes this one starts (vLLM's, the rollout worker) and datasets
    constants.HF_HUB_OFFLINE = True  # read by huggingface_hub and transformers at each request
    log.warning(
        "the Hugging Face Hub (%s) cannot be reached (%s): the %s %s is loaded from the local cache; set "
        "HF_HUB_OFFLINE=1 to skip this check",
        constants.ENDPOINT,
        reason,
        kind,
        name,
    )


def unreachable(endpoint: str) -> str | None:
    """Why ``endpoint`` cannot be reached in one request of at most `PROBE_TIMEOUT_S` (through the proxies and
    certificates huggingface_hub uses), or None when it answers anything."""
    from huggingface_hub.utils import get_session

    try:
        get_session().head(endpoint, timeout=PROBE_TIMEOUT_S)
    except Exception as error:  # the HTTP library and its errors change across huggingface_hub versions
        return first_line(error) or type(error).__name__
    return None
