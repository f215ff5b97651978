"""Weight transport ("refit") from the trained policy to generation engines (`refit`): packed buckets,
shared-memory flat weights and a collective group. It sits below both `posttrain.models` and
`posttrain.generation` and imports neither (docs/architecture.md)."""
