"""One router per resource: sessions, steps, feedback, skills, and operations (health, metrics)."""

from fastapi import APIRouter

from sessionrl.service.routers import feedback, ops, sessions, skills, steps

ROUTERS: tuple[APIRouter, ...] = (sessions.router, steps.router, feedback.router, skills.router, ops.router)
"""Every router of the service, in the order the app includes them."""
