"""E-commerce fulfilment tickets: inventory, SMS, address changes, refunds, couriers, waybills and the ERP."""

from sessionrl.envs.orders.env import OrdersConfig, OrdersEnv, OrdersEpisode, build_contracts
from sessionrl.envs.orders.ticket import IssueType, OrderStatus, Ticket
from sessionrl.envs.orders.tools import RISK_FLAGS, World

__all__ = [
    "RISK_FLAGS",
    "IssueType",
    "OrderStatus",
    "OrdersConfig",
    "OrdersEnv",
    "OrdersEpisode",
    "Ticket",
    "World",
    "build_contracts",
]
