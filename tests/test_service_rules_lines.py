"""The rules file's limits know their line however the TOML spells the ``limit`` array:
``[[limit]]`` tables or inline tables (``limit = [{...}, {...}]``); the line is what metrics
label a limit by and what ``ratelimit check`` reports, and two limits of one descriptor are
refused in either spelling."""

from __future__ import annotations

from pathlib import Path

import pytest

from ratelimit.cli.command import main as cli
from ratelimit.errors import ConfigurationError
from ratelimit.service import rules_file
from ratelimit.service.prometheus import limit_label

pytestmark = pytest.mark.timeout(30)
INLINE = """\
# inline tables (each on one line, as TOML has them)
limit = [
  { domain = "gw", descriptor = ["tenant"], rule = "3/h" },
  { domain = "gw", descriptor = ["plan=free", "tenant"], rule = "1/h", shadow = true },
  # a comment with { and [ in it
  { domain = "gw", descriptor = ["user"], rule = "5/m" },
]
"""


def test_inline_tables_have_their_lines_and_labels() -> None:
    loaded = rules_file.parse(INLINE.encode(), "inline.toml")
    assert [limit.line for limit in loaded.limits] == [3, 4, 6]
    labels = [limit_label(limit) for limit in loaded.limits]
    assert labels == ["[tenant] 3/h", "[plan=free, tenant] 1/h", "[user] 5/m"]


def test_an_inline_table_on_one_line_with_the_key() -> None:
    text = 'limit = [{ domain = "a", descriptor = ["k"], rule = "1/m" }, ' + (
        '{ domain = "a", descriptor = ["j"], rule = "2/m" }]\n'
    )
    loaded = rules_file.parse(text.encode(), "one-line.toml")
    assert [limit.line for limit in loaded.limits] == [1, 1]
    assert [limit_label(limit) for limit in loaded.limits] == ["[k] 1/m", "[j] 2/m"]


def test_a_string_holding_braces_is_no_table() -> None:
    text = """\
limit = [
  { domain = "a{", descriptor = ["k"], rule = '1/m' },
  { domain = "b", descriptor = ["{k}"], rule = \"\"\"2/m\"\"\" },
]
"""
    loaded = rules_file.parse(text.encode(), "strings.toml")
    assert [limit.line for limit in loaded.limits] == [2, 3]


DUPLICATE = """\
limit = [
  { domain = "gw", descriptor = ["tenant"], rule = "3/h" },
  { domain = "gw", descriptor = ["tenant"], rule = "30/h" },
]
"""


def test_two_inline_limits_of_one_descriptor_are_refused_naming_their_lines() -> None:
    with pytest.raises(ConfigurationError, match="line 3: .* already limited at line 2"):
        rules_file.parse(DUPLICATE.encode(), "dup.toml")


def test_check_refuses_two_inline_limits_of_one_descriptor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "dup.toml"
    path.write_text(DUPLICATE)
    assert cli(["check", str(path)]) == 1
    assert "already limited at line 2" in capsys.readouterr().err
    path.write_text(INLINE)
    assert cli(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "line 3: gw [tenant]: 3/h" in out
    assert "line 6: gw [user]: 5/m" in out


def test_a_bad_inline_table_names_its_line() -> None:
    text = 'limit = [\n  { domain = "gw", descriptor = ["k"], rule = "3/h" },\n'
    text += '  { domain = "gw", descriptor = [], rule = "3/h" },\n]\n'
    with pytest.raises(ConfigurationError, match=r"line 3 \(\[\[limit\]\] #2\)"):
        rules_file.parse(text.encode(), "bad.toml")
