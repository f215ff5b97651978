"""The sampling side: the HF sampler (`sampler`, `continuous`, `sampling`), the vLLM engine (`vllm_engine`,
`vllm_lora`; vLLM is imported only when an engine is built), offline generation for evaluation
(`text_generation`) and the generation-only worker (`worker`). Weights arrive through
`posttrain.weights.refit`; models are loaded with `posttrain.modeling`. This package never imports
`posttrain.models` (docs/architecture.md)."""
