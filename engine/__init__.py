"""The asyncio rollout engine and the ``bunshin`` command line."""
