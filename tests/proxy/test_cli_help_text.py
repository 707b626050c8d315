"""Every command's ``--help`` reads as plain text: no reST ``literal`` markup leaks into it."""
import pytest
from typer.testing import CliRunner

from prefixgate.proxy.cli import app

COMMANDS = ["serve", "engine", "report", "replay", "simulate", "rewrite", "grafana",
            "config check", "keys add"]


@pytest.mark.parametrize("command", COMMANDS)
def test_help_has_no_rest_markup(command: str) -> None:
    result = CliRunner().invoke(app, [*command.split(), "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "``" not in result.output, result.output
