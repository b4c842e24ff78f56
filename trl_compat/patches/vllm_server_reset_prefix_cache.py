"""vllm-server-reset-prefix-cache: TRL 1.11.0 - 1.14.0, server mode against a vLLM older than 0.26:
the first weight sync dies with ``requests.exceptions.JSONDecodeError: Expecting value: line 1
column 1 (char 0)``.

The bug: from TRL 1.11 the client talks to vLLM's own server (``vllm serve``; ``trl vllm-serve`` is
gone), and ``VLLMClient.reset_prefix_cache`` posts through ``self._post``, which returns
``response.json()``. vLLM's ``POST /reset_prefix_cache`` answered ``Response(status_code=200)``, an
empty body, up to vLLM 0.25.x (``vllm/entrypoints/serve/dev/cache/api_router.py``); vLLM 0.26.0
(vllm-project/vllm#46893) made it answer ``{"success": bool}``. So with a server on vLLM 0.19 - 0.25,
which TRL 1.11 - 1.14 declare (``vllm>=0.19.0`` / ``>=0.20.0``), the reset that ends every weight
sync (``VLLMGeneration.sync_weights``) raises on its empty answer, after the server did reset its
cache: the run dies at its first step. TRL 1.14.1 posts directly and checks only the status when the
client's own vLLM is older than 0.26 (``_HAS_RESET_PREFIX_CACHE_SUCCESS``). The trainer's machine may
not have the server's vLLM (or any vLLM): what counts is the server's answer.
Where it shows: TRL 1.11.0 - 1.14.0 (and main from the client's switch to vLLM's server), server mode.

Probe: ``VLLMClient.reset_prefix_cache`` (``trl/generation/vllm_client.py``) posts ``/reset_prefix_cache``
through ``self._post`` and ``_post`` returns ``response.json()``: "needed". A reset that posts on its
own (1.10's ``self.session.post``, also as 1.14.1's branch for vLLM < 0.26) or a ``_post`` that does
not parse: "not needed".
"Undecided" when a source cannot be read.

Fix: ``reset_prefix_cache`` posts with the client's session, raises TRL's own ``Request failed:
<status>, <text>`` on a status other than 200, and does not parse the body: an empty answer (vLLM
< 0.26) and ``{"success": ...}`` (vLLM >= 0.26) both end the call, as in 1.14.1, which ignores
``success`` too. A call with arguments (a signature this patch does not know) goes to TRL's
own method.

Run time: load-bearing: errors propagate (a failed reset is TRL's error, as unpatched).

Delete when: trl_compat no longer supports TRL 1.11.0 - 1.14.0 (the registry's ``remove_when``; a test
holds the two equal).
"""

from __future__ import annotations

import functools

from trl_compat._engine import needed, not_needed
from trl_compat._helpers.source import code

ENDPOINT = "/reset_prefix_cache"
POST_THROUGH_PARSER = 'self._post(f"{self.base_url}/reset_prefix_cache")'


def probe(module):
    client = module.VLLMClient
    reset = code(client.reset_prefix_cache)
    if POST_THROUGH_PARSER not in reset:
        return not_needed("VLLMClient.reset_prefix_cache posts /reset_prefix_cache itself")
    if "self.session.post(" in reset:
        return not_needed("VLLMClient.reset_prefix_cache posts itself where the server may answer without a body")
    post = getattr(client, "_post", None)
    if post is None or "return response.json()" not in code(post):
        return not_needed("VLLMClient._post does not parse the answer's body")
    return needed(
        "VLLMClient.reset_prefix_cache posts through _post, which parses the answer as JSON: vLLM < 0.26 answers "
        "/reset_prefix_cache with an empty body"
    )


def empty_answer_allowed(reset_prefix_cache):
    @functools.wraps(reset_prefix_cache)
    def wrapper(self, *args, **kwargs):
        if args or kwargs:
            return reset_prefix_cache(self, *args, **kwargs)
        response = self.session.post(f"{self.base_url}{ENDPOINT}")
        if response.status_code != 200:
            raise Exception(f"Request failed: {response.status_code}, {response.text}")
        return None

    return wrapper


def apply(module, patcher):
    patcher.wrap(module.VLLMClient, "reset_prefix_cache", empty_answer_allowed)
