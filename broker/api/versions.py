"""ApiVersions: the exact APIs and version ranges this broker implements (``api/served.py``)."""

from __future__ import annotations

from typing import Any

from kafscale.broker.api.dispatch import Body, RequestContext
from kafscale.broker.api.served import SERVED_APIS, api_versions_body


async def handle_api_versions(request: Any, ctx: RequestContext) -> Body:
    version = ctx.broker.settings.transactions.protocol_version
    return api_versions_body(SERVED_APIS, transaction_version=version)
