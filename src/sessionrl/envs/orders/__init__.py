"""E-commerce fulfilment tickets: inventory, SMS, address changes, refunds, couriers, waybills and the ERP."""

from sessionrl.envs.orders.env import OrdersEnv, OrdersEpisode
from sessionrl.envs.orders.ticket import IssueType, OrderStatus, Ticket
from sessionrl.envs.orders.tools import RISK_FLAGS, World
from sessionrl.envs.registry import config_factory, register
from sessionrl.envs.simulated import DomainConfig

register("orders", config_factory(OrdersEnv, DomainConfig))

__all__ = [
    "RISK_FLAGS",
    "DomainConfig",
    "IssueType",
    "OrderStatus",
    "OrdersEnv",
    "OrdersEpisode",
    "Ticket",
    "World",
]
