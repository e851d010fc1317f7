"""The tree fork: a live clone of a whole frozen process tree (real applications: a browser, a display server, an
office suite) through the kernel module's graft (``kmod/``, ``docs/kmod.md``). ``reader.py`` reads the frozen tree
into a plan (``plan.py``), ``fork.py`` has the builder (``kmod/treefork/builder.c``) make the clone, ``oracle.py``
compares a clone with its source."""
