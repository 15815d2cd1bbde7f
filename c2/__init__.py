"""c2: continued pretraining and asynchronous RL of an agentic-coding MoE model, in JAX."""
