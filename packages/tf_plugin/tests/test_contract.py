"""The plugin provides the whole plugin contract (stepscope.capture.plugin) itself."""

from __future__ import annotations

from stepscope.capture.hook import HookBase
from stepscope.capture.plugin import FrameworkPlugin, missing_parts
from stepscope_tf import Hook


def test_the_hook_provides_every_part_of_the_plugin_contract(tmp_path):
    assert issubclass(Hook, HookBase)
    assert missing_parts(Hook) == []
    assert isinstance(Hook(str(tmp_path / "job"), validate_only=True), FrameworkPlugin)
