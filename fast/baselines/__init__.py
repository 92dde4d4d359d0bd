"""The unpinned baselines: the paths production takes by default (cuBLAS, ``torch.topk``, split-K,
per-M autotune, greedy packing, batch-wide split plans), one module per component under the
component's name (``fast/baselines/topk.py`` beside ``fast/topk.py``).

The harness runs them as negative controls: each must vary somewhere in the sweep, by giving
different bits (a crash is an error, never a detection).  A few are *config controls* (the
component's own kernel under another config, for ``config_equivalence``) or *pin candidates*.
"""
