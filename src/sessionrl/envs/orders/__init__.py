"""E-commerce fulfilment tickets: inventory, SMS, address changes, refunds, couriers, waybills and the ERP."""

from sessionrl.envs.orders.env import OrdersEnv, OrdersEpisode
from sessionrl.envs.orders.simulated import DomainConfig
from sessionrl.envs.orders.ticket import IssueType, OrderStatus, Ticket
from sessionrl.envs.orders.tools import RISK_FLAGS, World

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
