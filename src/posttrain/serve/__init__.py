"""Environments as services: `posttrain env serve NAME` serves a registered posttrain environment as an
OpenEnv server (`posttrain.serve.openenv_server`, needs the `serve` extra: `pip install
posttrain[serve]`). The client side, training on any OpenEnv server by URL, is the `openenv`
environment (`posttrain.environments.openenv_env`). See docs/serve.md.
"""
