"""The `vllm_omni` generator: a vLLM-Omni `AsyncOmni` engine hosted in the model (`engine`), each session's chunks from it (`source`), and its output frames (`frames`)."""
