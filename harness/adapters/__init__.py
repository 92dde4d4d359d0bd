"""Adapters: production libraries' kernels declared as subjects of the matching components.

Each adapter module imports its library lazily and only when it is installed; nothing under
``batchinv.harness`` imports these modules (``tests/integration/test_packaging.py`` checks)."""
