"""An OpenAI-compatible endpoint over the rollout generator, for agent programs (docs/agents.md).

`app.AgentEndpoint` (sessions, chat completions, responses, rewards), `server.EndpointServer` (HTTP),
`recorder.EpisodeRecorder` (token in, token out), `batching.GenerationQueue` (requests batched into
the generator), `parsers` (tool-call parsers by template family). `posttrain.rollout.agent` runs
agents against it during a run.
"""
