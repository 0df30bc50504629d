"""Training: losses, data preparation and trainers for sessionrl policies."""
