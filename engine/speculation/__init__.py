"""Speculative tool execution: the Spec Tool Selector predicts a sample's next call, the engine runs it in a
copy-on-write fork while the model reasons, and adopts or discards the branch when the real call arrives."""
