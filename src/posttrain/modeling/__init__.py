"""Loading and running a Hugging Face causal LM, shared by the training side (`posttrain.models`) and
the sampling side (`posttrain.generation`), which import this package and never each other:
`loading` (dtypes, device, `load_causal_lm`), `tokenizer` (tokenizers and chat templates), `attention`
and `packing` (posttrain's attention functions and unpadded forwards), `fsdp` (FSDP2 sharding and the
collectives of a sharded model), `peft` (the peft config of a `policy.lora` section), `cpu` (the
CPU's flags: whether bf16 matmuls are fast).
The floors are drawn in docs/architecture.md and enforced by the import-linter contracts in pyproject.toml."""
