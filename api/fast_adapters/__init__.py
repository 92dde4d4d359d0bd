"""Aliases of the adapters' earlier import path, ``batchinv.fast.adapters.*``: the adapters are
:mod:`batchinv.harness.adapters` (they build on the harness's subject model).  This folder sits in
the top package's, above every floor, so ``fast/`` itself never imports the harness."""
