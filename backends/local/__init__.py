"""The local engine: a GGUF model through llama-cpp-python, in this process or a child of
its own, and what it measures of this machine (threads, flash attention, the GPU)."""
