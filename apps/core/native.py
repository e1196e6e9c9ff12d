"""Load order of native libraries that cannot share a process in either order.

Loading torch *after* regopy's librego_shared.so aborts the process ("double free or corruption") on the first
model load; torch loaded first works. So whenever this process may embed with the local model, torch is imported
before regopy. Reproduce with: evaluate a policy, then `import torch` (see tests/memories/test_semantic_search.py's
real-model test, which runs after policy evaluation).
"""

from __future__ import annotations

import importlib.util
import logging

logger = logging.getLogger(__name__)


def preload_before_regopy() -> None:
    from django.conf import settings

    wants_local_model = getattr(settings, "EMBEDDING_PROVIDER", "local") == "local" or getattr(
        settings, "PRELOAD_TORCH", False
    )
    if wants_local_model and importlib.util.find_spec("torch") is not None:
        import torch  # noqa: F401
