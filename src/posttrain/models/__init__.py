"""The training side: the policy (`policy`, `actor`; FSDP2, LoRA), critic, reward model, distillation
teacher and student, log-probs, optimizers, and offline model aliases (`posttrain.models.hub`)."""
