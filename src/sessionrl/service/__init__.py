"""The HTTP service: `create_app(ServiceConfig(...))` gives a FastAPI app; `sessionrl serve` runs one."""

from sessionrl.access import Scope
from sessionrl.service.app import create_app
from sessionrl.service.config import ServiceConfig, parse_tokens

__all__ = ["Scope", "ServiceConfig", "create_app", "parse_tokens"]
