"""Debian's Chromium inside a workspace: its DevTools pipe (``cdp``), the browser (``browser``), keys, WebArena's
accessibility tree (``axtree``) and observations and actions (``webarena``), and its state as data for the
``replay`` fork of a browser (``state``)."""
