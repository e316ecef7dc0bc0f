"""ApiVersions: the exact APIs and version ranges this broker implements."""

from __future__ import annotations

from typing import Any

from kafscale.broker.api.dispatch import Body, RequestContext, api_versions_body


async def handle_api_versions(request: Any, ctx: RequestContext) -> Body:
    from kafscale.broker.api.table import API_TABLE  # the table imports this module

    version = ctx.broker.settings.transactions.protocol_version
    return api_versions_body(API_TABLE, transaction_version=version)
