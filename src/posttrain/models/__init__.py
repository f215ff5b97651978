"""The training side: the policy (`policy`; FSDP2, LoRA), critic, reward model, distillation teacher,
log-probs, optimizers, and offline model aliases (`posttrain.models.hub`). Loading a model lives below it
in `posttrain.modeling`, weight transport in `posttrain.weights`; the roles that both train and sample
(`ActorPolicy`, `PPOActor`, `StudentActor`) live beside their worker groups in `posttrain.distributed`.
This package never imports `posttrain.generation` (docs/architecture.md)."""
