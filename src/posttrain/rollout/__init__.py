"""Turn prompts into scored trajectories: generate, step environments, repeat for multi-turn."""
