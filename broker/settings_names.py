"""How a setting is named to the user: its environment variable and its flag.

``listener.port`` is ``KAFSCALE_LISTENER__PORT`` and ``--listener-port``. Apart from
``settings_cli`` (which builds the flags and the reference from the models) so that the checks
that name settings (``settings_combinations``) import no settings model: the Spark source runs
them in processes whose start-up time counts. Pure.
"""

from __future__ import annotations

from kafscale.broker.store_settings import ENV_PREFIX


def flag_name(path: tuple[str, ...]) -> str:
    return "--" + "-".join(part.replace("_", "-") for part in path)


def env_name(path: tuple[str, ...]) -> str:
    return ENV_PREFIX + "__".join(part.upper() for part in path)
