"""One router per resource: sessions, steps, feedback, skills, and operations (health, metrics)."""
