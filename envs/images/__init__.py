"""Declared workspace images: root file systems built from a pinned package list, not the host's /usr.

``recipes.py`` says what each image holds (and gives it a digest); ``store.py`` builds an image from the Debian
archive, keeps it in a cache keyed by that digest, and says what a built image holds. The runtime places a built
image under each workspace (``envs/runtime/base_images.py``); see docs/images.md.
"""
