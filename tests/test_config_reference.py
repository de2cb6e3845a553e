"""The settings table of docs/configuration.md is what the model renders."""

from __future__ import annotations

import pytest

from vllm_continuum.config import ContinuumConfig
from vllm_continuum.config_reference import BEGIN, END, main, render_table, splice


def test_committed_table_is_what_the_model_renders(capsys):
    assert main(["--check"]) == 0, capsys.readouterr().err


def test_every_setting_has_a_row_with_a_meaning():
    table = render_table()
    for name, field in ContinuumConfig.model_fields.items():
        assert field.description, f"{name} has no description: it would have no meaning in the table"
        assert f"| `{name}` |" in table


def test_check_fails_on_a_stale_table(tmp_path, capsys):
    stale = tmp_path / "configuration.md"
    stale.write_text(f"intro\n{BEGIN}\n| old |\n{END}\nrest\n")
    assert main(["--check", "--doc", str(stale)]) == 1
    assert main(["--doc", str(stale)]) == 0
    assert stale.read_text() == f"intro\n{BEGIN}\n{render_table()}{END}\nrest\n"
    assert main(["--check", "--doc", str(stale)]) == 0
    capsys.readouterr()


def test_splice_needs_both_markers():
    with pytest.raises(ValueError):
        splice(f"{BEGIN}\nno end", "| table |\n")
