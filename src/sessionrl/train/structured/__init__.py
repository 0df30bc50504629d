"""Structured skill policies: Gymnasium rollouts, imitation, PPO and AAAC, and sessions through the orchestrator."""
