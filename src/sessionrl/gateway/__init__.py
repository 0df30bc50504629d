"""An OpenAI-compatible gateway: an unchanged agent records its sessions by pointing its base URL here.

`chat` holds the OpenAI chat wire (requests, answers, stream chunks, errors), `backends` what answers a
request (the service's own policy, an upstream OpenAI-compatible server as `upstream` speaks to it, or a
script), and `capture` how each request becomes steps of a session. The routes are in
`sessionrl.service.routers.gateway`.
"""

from sessionrl.gateway.backends import (
    ChatBackend,
    ChatReply,
    PolicyChat,
    ScriptedChat,
    UpstreamError,
)
from sessionrl.gateway.chat import ChatMessage, ChatRequest
from sessionrl.gateway.upstream import UpstreamChat

__all__ = [
    "ChatBackend",
    "ChatMessage",
    "ChatReply",
    "ChatRequest",
    "PolicyChat",
    "ScriptedChat",
    "UpstreamChat",
    "UpstreamError",
]
