"""The sinks: where events are delivered over HTTP, and what each attempt came to.

Every attempt is one POST with a deadline for the whole exchange (``timeout_s``), redirects
refused (a 3xx is a failed attempt: a sink that moved must be reconfigured, not followed, so a
compromised endpoint cannot bounce signed events elsewhere), at most ``max_response_bytes`` of
the answer read, no cookies kept and no proxy taken from the environment. Success is a 2xx.
What an attempt reports never contains the URL (it may carry a credential) or the answer.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import aiohttp

from .. import __version__
from ..config import SinkConfig
from ..store.base import OutboxEvent
from .envelope import cloudevent, slack_message
from .signing import parse_secret, sign

__all__ = ["Attempt", "SlackSink", "WebhookSink", "make_sink"]

USER_AGENT = f"controlplane-notifications/{__version__}"


@dataclass(frozen=True, slots=True)
class Attempt:
    ok: bool
    status: int | None
    error: str | None


class _HttpSink:
    """A sink reached by one POST per event."""

    type = ""

    def __init__(self, config: SinkConfig) -> None:
        self.name = config.name
        self._config = config
        self._url = config.url.reveal()

    def wants(self, event: OutboxEvent) -> bool:
        """The sink's filters: event types and environments (empty: every one)."""
        config = self._config
        return ((not config.events or event.type in config.events)
                and (not config.envs or event.env in config.envs))

    def render(self, event: OutboxEvent, data: dict[str, Any], now: float
               ) -> tuple[bytes, dict[str, str]]:
        raise NotImplementedError

    async def send(self, session: aiohttp.ClientSession, event: OutboxEvent,
                   data: dict[str, Any], now: float) -> Attempt:
        body, headers = self.render(event, data, now)
        headers["User-Agent"] = USER_AGENT
        try:
            async with asyncio.timeout(self._config.timeout_s):
                async with session.post(self._url, data=body, headers=headers,
                                        allow_redirects=False) as response:
                    await _drain(response, self._config.max_response_bytes)
                    status = response.status
        except TimeoutError:
            return Attempt(False, None, f"no answer within {self._config.timeout_s:g} s")
        except aiohttp.ClientError as exc:
            return Attempt(False, None, f"connection failed ({type(exc).__name__})")
        if 200 <= status < 300:
            return Attempt(True, status, None)
        if 300 <= status < 400:
            return Attempt(False, status, f"HTTP {status}: redirect refused")
        return Attempt(False, status, f"HTTP {status}")


async def _drain(response: aiohttp.ClientResponse, limit: int) -> None:
    """Read at most ``limit`` bytes of the answer; a longer one is cut off with its connection."""
    seen = 0
    while seen <= limit:
        chunk = await response.content.readany()
        if not chunk:
            return
        seen += len(chunk)
    response.close()


class WebhookSink(_HttpSink):
    """CloudEvents 1.0 structured JSON, signed per Standard Webhooks (``signing``)."""

    type = "webhook"

    def __init__(self, config: SinkConfig, source: str) -> None:
        super().__init__(config)
        self._source = source
        self._keys = [parse_secret(s.reveal()) for s in config.secrets]

    def render(self, event: OutboxEvent, data: dict[str, Any], now: float
               ) -> tuple[bytes, dict[str, str]]:
        body = cloudevent(event, self._source, data)
        timestamp = int(now)
        return body, {
            "Content-Type": "application/cloudevents+json; charset=utf-8",
            "webhook-id": event.id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": sign(self._keys, event.id, timestamp, body),
        }


class SlackSink(_HttpSink):
    """A Slack-compatible incoming webhook (Block Kit message)."""

    type = "slack"

    def render(self, event: OutboxEvent, data: dict[str, Any], now: float
               ) -> tuple[bytes, dict[str, str]]:
        return slack_message(event, data), {"Content-Type": "application/json; charset=utf-8"}


def make_sink(config: SinkConfig, source: str) -> _HttpSink:
    if config.type == "webhook":
        return WebhookSink(config, source)
    return SlackSink(config)
