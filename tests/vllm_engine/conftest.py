"""vLLM engines of one module must be gone before the next module starts its own: a collected engine
tears down vLLM's process-wide parallel groups, and if the garbage collector gets to it while the next
engine is being built, that engine loses its groups ("tensor model parallel group is not initialized")."""

import gc

import pytest


@pytest.fixture(scope="module", autouse=True)
def collect_engines_after_module():
    yield
    gc.collect()
