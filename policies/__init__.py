"""What decides the next tool call: scripted policies, replay, and model-server clients (later issues)."""
