"""The RL runtime (`runtime.RLRuntime`) and the protocol its algorithms implement (`protocol.RLAlgorithm`)."""
