"""Capturing sessions that sessionrl did not run: traces imported from files (`importers`)."""
