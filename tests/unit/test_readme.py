"""The README's configuration reference is the one generated from the settings model."""

from __future__ import annotations

from pathlib import Path

import pytest

from kafscale.broker.settings_cli import full_reference_markdown

pytestmark = pytest.mark.unit

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_configuration_reference_is_current() -> None:
    text = README.read_text()
    start = text.index("<!-- config-reference:start -->") + len("<!-- config-reference:start -->")
    end = text.index("<!-- config-reference:end -->")
    assert text[start:end].strip() == full_reference_markdown().strip(), (
        "README is stale: run `kafscale config-reference --update README.md`"
    )


def test_kafscale_config_reference_prints_the_readmes_whole_reference(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The README says `kafscale config-reference` makes its table: the proxy's part included
    (it printed only the broker's)."""
    from kafscale.broker.cli import main

    assert main(["config-reference"]) == 0
    text = README.read_text()
    start = text.index("<!-- config-reference:start -->") + len("<!-- config-reference:start -->")
    end = text.index("<!-- config-reference:end -->")
    assert capsys.readouterr().out.strip() == text[start:end].strip()
