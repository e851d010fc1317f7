"""Adapters that put a suite task's episodes inside trainers' own environment and agent-loop APIs: a gymnasium
``Env`` (``gym.py``), a skyrl-gym environment (``skyrl.py``) and a verl agent loop (``verl.py``), over one
synchronous session (``session.py``). Each imports its framework lazily (the optional extra ``trainers``), so
bunshin works without them. See ``docs/trainers.md``.
"""
