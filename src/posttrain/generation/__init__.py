"""The sampling side: the HF sampler (`sampler`, `continuous`, `sampling`), the vLLM engine (`vllm_engine`,
`vllm_lora`; vLLM is imported only when an engine is built), offline generation for evaluation
(`text_generation`) and the refit transports that carry weights from training to generation (`refit`)."""
