"""Structured skill policies: Gymnasium rollouts, imitation, PPO and AAAC, sessions through the orchestrator,
and a whole run from a `RunConfig` (`run`)."""
