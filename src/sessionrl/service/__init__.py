"""The HTTP service: `create_app(ServiceConfig(...))` gives a FastAPI app; `sessionrl serve` runs one."""

from sessionrl.service.app import create_app
from sessionrl.service.config import Scope, ServiceConfig, parse_tokens

__all__ = ["Scope", "ServiceConfig", "create_app", "parse_tokens"]
